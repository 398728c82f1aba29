"""Alembic environment: runs the migrations against the URL the app (or alembic.ini) gives."""

from alembic import context
from sqlalchemy import create_engine

from app.db.models import Base

config = context.config
url = config.get_main_option("sqlalchemy.url")
connectable = config.attributes.get("connection")


def run(connection) -> None:
    context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


if connectable is not None:
    run(connectable)
else:
    with create_engine(url).connect() as connection:
        run(connection)
