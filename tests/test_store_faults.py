"""A database that refuses writes: a clear message, no crash, no half-written conversation."""

import sqlite3

import pytest

from app.desk import Desk, DeskInputError
from app.store import Store


def answer(aio, desk, message="我要退货"):
    async def run():
        return [e async for e in desk.answer(session_key="s", template_name="support-en", history=[],
                                             message=message, max_tokens=2)]
    return aio(run())


def test_a_read_only_database_refuses_the_message_with_a_clear_error(services, aio, settings):
    path = settings.database_url.removeprefix("sqlite:///")
    read_only = Store(f"sqlite:///file:{path}?mode=ro&uri=true")
    desk = Desk(store=read_only, engine=services.engine, prompts=services.prompts)
    before = services.store.engine.connect().exec_driver_sql("select count(*) from messages").scalar()
    with pytest.raises(DeskInputError) as exc:
        answer(aio, desk)
    assert str(exc.value).startswith("Your message could not be saved, so it was not sent: the database could "
                                     "not be written (attempt to write a readonly database)")
    after = services.store.engine.connect().exec_driver_sql("select count(*) from messages").scalar()
    assert after == before
    read_only.close()


def test_a_locked_database_refuses_the_message_and_the_app_keeps_working(services, aio, settings):
    path = settings.database_url.removeprefix("sqlite:///")
    locker = sqlite3.connect(path, timeout=1)
    locker.execute("BEGIN EXCLUSIVE")
    try:
        conversations = sqlite3.connect(path).execute("select count(*) from conversations").fetchone()[0]
        with pytest.raises(DeskInputError) as exc:
            answer(aio, services.desk)
        assert "database is locked" in str(exc.value)
    finally:
        locker.rollback()
        locker.close()
    assert sqlite3.connect(path).execute("select count(*) from conversations").fetchone()[0] == conversations
    events = answer(aio, services.desk)  # the lock is gone: the desk works again
    assert events[-1].message.status == "ok"
