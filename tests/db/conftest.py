"""The database tests' one fixture: a fresh migrated, seeded database for each test, on SQLite and on
PostgreSQL when PREFIXDESK_TEST_POSTGRES_URL names a server where the user may create databases (.ci/run
starts Debian's PostgreSQL and sets it)."""

import os
import time
import uuid

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.engine import make_url

from app import template_files
from app.db import open_database
from app.db import templates as db_templates
from tests.helpers.servers import ROOT

POSTGRES = os.environ.get("PREFIXDESK_TEST_POSTGRES_URL", "")
BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.skipif(
    not POSTGRES, reason="set PREFIXDESK_TEST_POSTGRES_URL (as .ci/run does) to run on PostgreSQL"))]


@pytest.fixture(params=BACKENDS)
def fresh_db(request, tmp_path):
    """A migrated database of this test's own on the parametrized backend, seeded with templates/."""
    drop = None
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'fresh.db'}"
    else:
        name = f"pd_{uuid.uuid4().hex[:12]}"
        server = create_engine(POSTGRES, isolation_level="AUTOCOMMIT")
        with server.connect() as c:
            c.execute(text(f'CREATE DATABASE "{name}"'))
        url = make_url(POSTGRES).set(database=name).render_as_string(hide_password=False)

        def drop():
            # This test's connections are closed; a server process of another role (autovacuum) may still be in
            # the database for a moment, and FORCE may not end it: the drop is tried again until it is gone.
            for attempt in range(60):
                try:
                    with server.connect() as c:
                        c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
                    break
                except DBAPIError:
                    if attempt == 59:
                        raise
                    time.sleep(0.5)
            server.dispose()
    db = open_database(url)
    db.run(db_templates.seed, template_files.read_folder(ROOT / "templates"))
    yield db
    db.close()
    if drop:
        drop()
