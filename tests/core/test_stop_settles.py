"""What a Stop shows waits for the stopped answer's own end, not for a deadline.

Before: the page's Stop read the conversation every 0.1 s for up to 10 s, and on a busy machine, where storing
the stopped answer took longer, it drew the answer still "generating", without its "Stopped" mark, and never
again. After: the desk knows which answers it is writing, and ``settled_conversation`` returns once the stopped
answer's row is finished, however long that takes; an answer it is not writing comes back as stored at once.
"""

import asyncio
import threading
import uuid

import pytest

from app.core.desk import STOPPED, Progress
from app.db import conversations as db_conversations
from tests.helpers.desks import HOLD_S, HeldFinish, desk_for
from tests.helpers.waiting import wait_until

CLIENT = "192.0.2.43"


@pytest.fixture
def desk(services):
    desk = desk_for(services)
    desk.step_delay_ms = 20  # an answer that is still streaming when it is stopped
    return desk


def stopped_with_its_store_held(desk, services, engine_loop, monkeypatch) -> tuple[str, asyncio.Task, int, HeldFinish]:
    """An answer stopped past its first text, as Gradio cancels the page's answer on Stop, whose store of it as
    stopped is held until the test releases it: (its session key, its page's task, its conversation's id, the hold)."""
    template = services.catalog.customer_facing()[0].name
    session_key = f"stop-{uuid.uuid4().hex}"
    stopped, conversation_id = asyncio.run_coroutine_threadsafe(_first_text(desk, session_key, template),
                                                                engine_loop).result(120)
    held = HeldFinish(monkeypatch)
    engine_loop.call_soon_threadsafe(stopped.cancel)
    if not held.entered.wait(HOLD_S):
        held.release()
        raise AssertionError("the stopped answer was never stored")
    return session_key, stopped, conversation_id, held


def test_a_stop_shows_the_answer_once_it_is_stored_as_stopped_however_long_that_takes(desk, services, engine_loop,
                                                                                        aio, monkeypatch):
    session_key, stopped, conversation_id, held = stopped_with_its_store_held(desk, services, engine_loop, monkeypatch)
    try:
        settled = asyncio.run_coroutine_threadsafe(
            desk.settled_conversation(session_key=session_key, conversation_id=conversation_id), engine_loop)
        # The store has not finished: the row still reads "generating", and what the Stop would show waits for it.
        rows = aio(desk.conversation(session_key=session_key, conversation_id=conversation_id))
        assert [m.status for m in rows] == ["ok", "generating"]
        assert not settled.done()
        # Another desk (another process, or this one after a restart) is not writing it: it gets the row as stored.
        other = aio(desk_for(services).settled_conversation(session_key=session_key, conversation_id=conversation_id))
        assert [m.status for m in other] == ["ok", "generating"]
    finally:
        held.release()
    rows = settled.result(120)
    assert [(m.role, m.status, m.error) for m in rows] == [("user", "ok", None), ("assistant", "stopped", STOPPED)]
    assert rows[1].text  # the text it had when it was stopped
    aio(asyncio.wait({stopped}))
    assert desk._writing == {} and desk._turn_writes == {}  # nothing left waiting


def test_a_stopped_answer_stored_while_the_stop_reads_the_conversation_is_read_again(desk, services, engine_loop,
                                                                                        aio, monkeypatch):
    # The Stop's read began before the stopped answer was stored and came back after it: the row it read said
    # "generating" while the desk no longer listed the answer as being written. Before: the Stop drew that row (a
    # full run here met it); after: the answers being written are taken as the read begins, and it reads again.
    session_key, stopped, conversation_id, held = stopped_with_its_store_held(desk, services, engine_loop, monkeypatch)
    read, returned = threading.Event(), threading.Event()
    messages = db_conversations.messages

    def late(s, **kwargs):  # the first read: its rows as they were, handed back once the store has ended
        rows = messages(s, **kwargs)
        if not read.is_set():
            read.set()
            returned.wait(HOLD_S)
        return rows

    try:
        monkeypatch.setattr(db_conversations, "messages", late)
        settled = asyncio.run_coroutine_threadsafe(
            desk.settled_conversation(session_key=session_key, conversation_id=conversation_id), engine_loop)
        assert read.wait(HOLD_S), "the Stop never read the conversation"
        held.release()
        wait_until(lambda: not desk._writing, 60, "the stopped answer to be stored")
    finally:
        held.release()
        returned.set()
    rows = settled.result(120)
    assert [(m.role, m.status, m.error) for m in rows] == [("user", "ok", None), ("assistant", "stopped", STOPPED)]
    aio(asyncio.wait({stopped}))
    assert desk._writing == {} and desk._turn_writes == {}


def test_a_stop_that_lands_while_the_question_is_being_stored_waits_for_it(desk, services, engine_loop, aio,
                                                                            monkeypatch):
    template = services.catalog.customer_facing()[0].name
    session_key = f"stop-{uuid.uuid4().hex}"
    entered, released = threading.Event(), threading.Event()
    begin = db_conversations.begin_turn

    def held_begin(s, **kwargs):
        entered.set()
        released.wait(HOLD_S)
        return begin(s, **kwargs)

    monkeypatch.setattr(db_conversations, "begin_turn", held_begin)

    async def ask():
        async for _ in desk.answer(session_key=session_key, client=CLIENT, template_name=template,
                                   message="Stopped on its way?", max_tokens=50, ignore_eos=True):
            pass

    asking = asyncio.run_coroutine_threadsafe(ask(), engine_loop)
    try:
        assert entered.wait(HOLD_S)
        asking.cancel()  # the Stop, before the page knows the conversation's id
        written = asyncio.run_coroutine_threadsafe(desk.turns_written(session_key=session_key), engine_loop)
        assert aio(desk.list_conversations(session_key=session_key)) == []  # not stored yet
        assert not written.done()
    finally:
        released.set()
    written.result(120)
    [listed] = aio(desk.list_conversations(session_key=session_key))  # now listed: the Stop finds it
    rows = aio(desk.settled_conversation(session_key=session_key, conversation_id=listed.id))
    assert [(m.role, m.status, m.text) for m in rows] == [("user", "ok", "Stopped on its way?"),
                                                         ("assistant", "stopped", "")]
    assert desk._writing == {} and desk._turn_writes == {}


async def _first_text(desk, session_key: str, template: str) -> tuple[asyncio.Task, int]:
    """An answer consumed as the page does, on a task of its own, once its first text is out: (the task, its
    conversation's id)."""
    first: asyncio.Future = asyncio.get_running_loop().create_future()

    async def page():
        async for event in desk.answer(session_key=session_key, client=CLIENT, template_name=template,
                                       message="Tell me everything about returns.", max_tokens=400, ignore_eos=True):
            if isinstance(event, Progress) and not first.done():
                first.set_result(event.conversation_id)

    task = asyncio.ensure_future(page())
    conversation_id = await first
    return task, conversation_id
