"""The database behind one door: a ``Database`` whose calls run off the event loop.

Every query lives in a module of this package as a plain function of a SQLAlchemy ``Session``
(``begin_turn(s, *, session_key=..., ...)``). Callers never open sessions: async code awaits
``db.read(fn, ...)`` or ``db.write(fn, ...)``, which run ``fn`` in one transaction on a thread, and
start-up code or the command line calls ``db.run(fn, ...)`` in its own thread.

Why threads and not SQLAlchemy's asyncio extension: SQLite has no async driver of its own (aiosqlite
is a thread per connection anyway), the same sync functions serve the CLI, start-up and tests, and
a thread pool gives what datasette found best for SQLite: one writer thread, so writers never fight
over the file lock, and several readers, which WAL lets run beside it. A locked database then
blocks that one thread for its busy timeout, never the loop that streams every user's tokens.
PostgreSQL gets several writer threads, since it locks rows, not the file.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine as SqlEngine
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
SQLITE_BUSY_TIMEOUT_S = 10
READ_THREADS = 4
POSTGRES_WRITE_THREADS = 4

T = TypeVar("T")


class StoreError(RuntimeError):
    """The database refused a read or write; the message says what to check."""


class Database:
    """One SQLAlchemy engine and the threads its queries run on."""

    def __init__(self, url: str):
        self.url = url
        self.is_sqlite = url.startswith("sqlite")
        self.engine = _create_engine(url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        writers = 1 if self.is_sqlite else POSTGRES_WRITE_THREADS
        self._writer = ThreadPoolExecutor(writers, thread_name_prefix="db-write")
        self._readers = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="db-read")

    @contextmanager
    def session(self) -> Iterator[Session]:
        """One transaction: committed on success, rolled back on any error."""
        session = self._sessions()
        try:
            yield session
            session.commit()
        except OperationalError as exc:
            session.rollback()
            raise StoreError(
                f"the database could not be written ({exc.orig}); check that {_safe_url(self.url)} is "
                "reachable, writable and not locked by another program"
            ) from exc
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    def run(self, fn: Callable[..., T], /, *args, **kwargs) -> T:
        """``fn(session, *args, **kwargs)`` in one transaction, in the calling thread."""
        with self.session() as s:
            return fn(s, *args, **kwargs)

    async def read(self, fn: Callable[..., T], /, *args, **kwargs) -> T:
        """``run`` on a reader thread, awaited without blocking the event loop."""
        return await asyncio.get_running_loop().run_in_executor(
            self._readers, functools.partial(self.run, fn, *args, **kwargs))

    async def write(self, fn: Callable[..., T], /, *args, **kwargs) -> T:
        """``run`` on the writer thread (the only one for SQLite), awaited without blocking the loop."""
        return await asyncio.get_running_loop().run_in_executor(
            self._writer, functools.partial(self.run, fn, *args, **kwargs))

    def close(self) -> None:
        self._writer.shutdown(wait=True, cancel_futures=False)
        self._readers.shutdown(wait=True, cancel_futures=False)
        self.engine.dispose()


def open_database(url: str) -> Database:
    """Open (creating if needed) the database at ``url`` and migrate it to the newest schema."""
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    db = Database(url)
    migrate(db.engine)
    return db


def migrate(engine: SqlEngine) -> None:
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "head")


def _create_engine(url: str) -> SqlEngine:
    if not url.startswith("sqlite"):
        return create_engine(url, pool_pre_ping=True, pool_size=READ_THREADS + POSTGRES_WRITE_THREADS)
    engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S, "check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _sqlite_pragmas(dbapi_connection, _record):
        cursor = dbapi_connection.cursor()
        # WAL lets readers run beside the writer; foreign keys are off in SQLite unless asked for.
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    return engine


def _safe_url(url: str) -> str:
    """``url`` without its password, for messages."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # a URL SQLAlchemy cannot parse has no password to hide we could find
        return url.split("@")[-1]
