"""An answer runs to its end whoever reads it (app/core/answering.py): a page that stops reading leaves it to be
written and stored whole; a Stop ends it, stored as stopped; a reader is told of a refusal; the desk forgets each
answer once it has ended."""

import asyncio
import uuid

import pytest

from app.core.desk import STOPPED, DeskInputError, Finished, Progress
from tests.helpers.desks import desk_for

CLIENT = "192.0.2.44"
TOKENS = 60  # at most: the session's settings may give answers less


@pytest.fixture
def desk(services):
    desk = desk_for(services)
    desk.step_delay_ms = 20  # still streaming when the page goes away
    return desk


def ask(desk, services, session_key: str, conversation_id=None):
    template = services.catalog.customer_facing()[0].name
    events = desk.answer(session_key=session_key, client=CLIENT, template_name=template,
                         message=f"Where is my parcel? {uuid.uuid4().hex[:8]}", conversation_id=conversation_id,
                         max_tokens=TOKENS, ignore_eos=True)
    return desk.keep_answering(events, session_key=session_key, conversation_id=conversation_id)


def test_an_answer_whose_page_went_away_is_written_to_its_end_and_followed_meanwhile(desk, services, aio):
    session_key = f"gone-{uuid.uuid4().hex}"

    async def leave():
        answering = ask(desk, services, session_key)
        first = await anext(answering)
        assert isinstance(first, Progress) and first.text
        answering.detach()  # the page was reloaded
        following = desk.answering(session_key=session_key, conversation_id=first.conversation_id)
        assert following is answering and not answering.done
        seen = {following.text}
        while not following.done:
            await asyncio.sleep(0.01)
            seen.add(following.text)
        return first.conversation_id, seen

    conversation_id, seen = aio(leave())
    rows = aio(desk.conversation(session_key=session_key, conversation_id=conversation_id))
    assert [(m.role, m.status) for m in rows] == [("user", "ok"), ("assistant", "ok")]
    assert rows[1].finish_reason == "length" and rows[1].output_tokens > 0  # written whole, to its budget
    assert len(seen) > 2 and rows[1].text.startswith(max(seen - {rows[1].text}, key=len))  # followed as it grew
    assert desk.answering(session_key=session_key, conversation_id=conversation_id) is None
    assert desk._answering == {}


def test_a_stop_ends_an_answer_nobody_reads_and_it_is_stored_as_stopped(desk, services, aio):
    session_key = f"stop-{uuid.uuid4().hex}"

    async def stop():
        answering = ask(desk, services, session_key)
        first = await anext(answering)
        answering.detach()
        await desk.stop_answers(session_key=session_key, conversation_id=first.conversation_id)
        assert answering.done
        return first.conversation_id

    conversation_id = aio(stop())
    rows = aio(desk.settled_conversation(session_key=session_key, conversation_id=conversation_id))
    assert [(m.role, m.status, m.error) for m in rows] == [("user", "ok", None), ("assistant", "stopped", STOPPED)]
    assert rows[1].text and rows[1].output_tokens is None
    assert desk._answering == {}


def test_a_reader_reads_every_event_to_the_stored_answer_and_is_told_a_refusal(desk, services, aio):
    session_key = f"read-{uuid.uuid4().hex}"

    async def read(conversation_id=None):
        return [event async for event in ask(desk, services, session_key, conversation_id)]

    events = aio(read())
    assert all(isinstance(e, Progress) for e in events[:-1]) and isinstance(events[-1], Finished)
    assert events[-1].message.finish_reason == "length"
    with pytest.raises(DeskInputError) as refused:  # a conversation of no one's
        aio(read(conversation_id=2**62))
    assert refused.value.code == "no_conversation"
    assert desk._answering == {}
