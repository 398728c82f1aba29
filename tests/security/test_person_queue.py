"""Attack: fill the operators' person queue from one address (issue 28, item 2).

Before: a fresh session key costs nothing, so one address put 35 conversations in the person queue in 65 s and five
more put in 121; a real customer sat at #157 of 157, page 8 of the console's list. After: a cap on conversations
waiting per client address (an IPv6 /64 counts as one), per browser and in all; a refused customer is told in plain
words, the refusal is counted by the hour, and the console shows the queue's count, says when it is full and how
many requests each cap refused. The caps here are scaled down: 2 per address, 1 per browser, 6 (4 on the
server) in all.
"""

from __future__ import annotations

import uuid
from datetime import datetime

import httpx
import pytest
import sqlite_utils
from gradio_client import Client
from sqlalchemy import select

from app import template_files
from admin.conversations_ui import queue_line
from admin.i18n import TEXT as CONSOLE_TEXT
from app.db import conversations as db_conversations
from app.db import open_database
from app.db import person_queue
from app.db import templates as db_templates
from app.db.models import Conversation, Template, TemplateVersion
from app.db.person_queue import Cap, PersonCaps, QueueFull
from tests.helpers.attack import config, dependency, output, run
from tests.helpers.servers import ROOT, SecondServer, operator

CAPS = PersonCaps(per_client=2, per_session=1, total=6)
ACCOUNT = ("op-person-queue", "person queue watch 28")
WAITING = "提示：已为您转接人工客服，请稍候，回复会显示在这里。"
OWN = "提示：您已有对话在等待人工客服，客服会先回复那些对话，请稍候。"
FULL = "提示：人工客服现在都在忙，暂时无法转接。请过几分钟再点“转人工”，也可以继续在这里提问。"


@pytest.fixture()
def store(tmp_path):
    """A migrated, seeded SQLite database of the test's own (no engine: these are the store's rules)."""
    db = open_database(f"sqlite:///{tmp_path / 'queue.db'}")
    db.run(db_templates.seed, template_files.read_folder(ROOT / "templates"))
    yield db
    db.close()


def conversation(db, session_key: str) -> int:
    return db.run(_begin, session_key=session_key).conversation_id


def _begin(s, *, session_key: str):
    t = s.scalars(select(Template).order_by(Template.id).limit(1)).one()
    version = s.scalars(select(TemplateVersion).where(TemplateVersion.template_id == t.id)
                        .order_by(TemplateVersion.id).limit(1)).one()
    return db_conversations.begin_turn(s, session_key=session_key, conversation_id=None, template_id=t.id,
                                       template_version_id=version.id, text="I need a person")


def ask(db, session_key: str, client: str, conversation_id: int | None = None) -> str:
    """"asked", "already" or the cap that refused (its refusal counted, as the desk counts it)."""
    cid = conversation_id or conversation(db, session_key)
    try:
        asked = db.run(db_conversations.request_person, session_key=session_key, conversation_id=cid, client=client,
                       caps=CAPS)
    except QueueFull as full:
        db.run(person_queue.record_refusal, cap=full.cap, now=datetime(2026, 12, 2, 7, 5))
        return str(full.cap)
    return "asked" if asked else "already"


def test_one_address_fills_only_its_share_and_the_total_cap_holds_the_rest(store):
    # One address, a fresh session key for every request: two wait, the rest are refused by the address's cap.
    assert [ask(store, uuid.uuid4().hex, "192.0.2.7") for _ in range(5)] == ["asked", "asked"] + ["client"] * 3
    # IPv6: one subscriber's /64 is one client, however many of its addresses it uses.
    assert [ask(store, uuid.uuid4().hex, a) for a in ("2001:db8:1:2::1", "2001:db8:1:2::ffff",
                                                      "2001:db8:1:2:aaaa::5")] == ["asked", "asked", "client"]
    # One browser from two addresses: one conversation waits, its second is refused by the browser's cap.
    assert [ask(store, "browser-b", a) for a in ("198.51.100.1", "198.51.100.2")] == ["asked", "session"]
    # A sixth customer fills the queue; the seventh is refused by the total cap, whatever its own share.
    assert [ask(store, uuid.uuid4().hex, a) for a in ("203.0.113.9", "203.0.113.10")] == ["asked", "total"]

    waiting = store.run(lambda s: sorted((c.handoff_client, c.session_key == "browser-b") for c in
                                         s.query(Conversation).filter(Conversation.handoff == "waiting")))
    assert waiting == [("192.0.2.7", False), ("192.0.2.7", False), ("198.51.100.1", True),
                       ("2001:db8:1:2::/64", False), ("2001:db8:1:2::/64", False), ("203.0.113.9", False)]
    state = store.run(person_queue.queue_state, total_cap=CAPS.total, now=datetime(2026, 12, 2, 7, 30))
    assert (state.waiting, state.full, state.since) == (6, True, datetime(2026, 12, 2, 6, 0))
    assert state.refused == {Cap.CLIENT: 4, Cap.SESSION: 1, Cap.TOTAL: 1}
    assert queue_line(state, CONSOLE_TEXT["en"]) == (
        "Waiting for a person: 6 (at most 6)  \n**The person queue is full**: every new request for a person is "
        "refused until one of the 6 waiting is taken.  \n**Refused since 06:00 UTC: 6** — 4 over one address's cap, "
        "1 over one browser's, 1 with the queue full.")

    # An operator takes one: it no longer waits, so the next customer gets the place, and the one after does not.
    waiting_id = store.run(lambda s: s.query(Conversation.id).filter(Conversation.handoff == "waiting").first()[0])
    store.run(db_conversations.take, conversation_id=waiting_id, operator="op")
    assert [ask(store, uuid.uuid4().hex, a) for a in ("203.0.113.11", "203.0.113.12")] == ["asked", "total"]
    # A conversation already waiting is not asked again (and not refused): no double count.
    assert ask(store, "browser-b", "198.51.100.1", store.run(
        lambda s: s.query(Conversation.id).filter(Conversation.session_key == "browser-b").first()[0])) == "already"
    # Refusals are counted by the hour: two hours on, the last hour holds none of them.
    later = store.run(person_queue.queue_state, total_cap=CAPS.total, now=datetime(2026, 12, 2, 9, 0))
    assert (later.waiting, later.refused) == (6, {Cap.CLIENT: 0, Cap.SESSION: 0, Cap.TOTAL: 0})
    assert queue_line(later, CONSOLE_TEXT["zh"]) == "等待人工：6（上限 6）  \n**人工队列已满**：在 6 段等待中的对话有人接待之前，新的转人工请求都会被拒绝。"


def test_a_client_is_its_address_an_ipv6_clients_its_64_and_a_key_is_bounded():
    assert person_queue.client_key("192.0.2.7") == "192.0.2.7"
    assert person_queue.client_key("2001:db8:1:2:3:4:5:6") == "2001:db8:1:2::/64"
    assert person_queue.client_key("::ffff:192.0.2.7") == "192.0.2.7"
    assert person_queue.client_key("x" * 100) == "x" * 64


def predict(client: httpx.Client, url: str, dep: dict, data: list, session: str) -> httpx.Response:
    """An event outside the queue (run/predict), as the page sends it."""
    return client.post(url + "gradio_api/run/predict", json={
        "data": data, "fn_index": dep["id"], "trigger_id": dep["targets"][0][0], "session_hash": session,
        "event_data": None})


def last_text(chat: list[dict]) -> str:
    content = chat[-1]["content"]
    return content[0]["text"] if isinstance(content, list) else content


@pytest.fixture(scope="module")
def queue_server(services, engine_loop, tmp_path_factory):
    """A server behind a trusted proxy on 127.0.0.1 (so X-Forwarded-For names each customer), with small caps."""
    server = SecondServer(services, engine_loop, tmp_path_factory.mktemp("person-queue"), trusted_proxies="127.0.0.1",
                          person_waiting_per_client=2, person_waiting_per_session=1, person_waiting_max=4,
                          max_tokens=4)
    with server as url:
        yield server, url


def test_a_flood_through_the_chat_is_refused_in_plain_words_and_the_console_sees_it(queue_server):
    server, url = queue_server
    cfg = config(url)
    load, send, ask_person = (dependency(cfg, name) for name in ("on_load", "send", "ask_person"))

    class Browser:
        def __init__(self, address: str):
            self.http = httpx.Client(timeout=120, headers={"X-Forwarded-For": address})
            assert self.http.get(url).status_code == 200
            self.session = uuid.uuid4().hex
            self.key = output(run(self.http, url, load, ["", None], self.session))[0]

        def ask_for_person(self) -> str:
            answered = output(run(self.http, url, send, ["我要找人工", "电商客服", None, self.key, None], self.session))
            r = predict(self.http, url, ask_person, [answered[2], self.key, answered[1]], self.session)
            assert r.status_code == 200
            return last_text(r.json()["data"][0])

    flood = [Browser("192.0.2.7").ask_for_person() for _ in range(3)]  # a fresh browser each time
    assert flood == [WAITING, WAITING, OWN]
    one_browser = Browser("198.51.100.1")
    assert [one_browser.ask_for_person(), one_browser.ask_for_person()] == [WAITING, OWN]
    assert [Browser(a).ask_for_person() for a in ("203.0.113.9", "203.0.113.10")] == [WAITING, FULL]

    db = sqlite_utils.Database(server.settings.database_url.removeprefix("sqlite:///"))
    waiting = [r["handoff_client"] for r in db.query(
        "select handoff_client from conversations where handoff = 'waiting' order by id")]
    assert waiting == ["192.0.2.7", "192.0.2.7", "198.51.100.1", "203.0.113.9"]
    assert {r["cap"]: r["n"] for r in db.query("select cap, sum(count) as n from person_refusals group by cap")} == {
        "client": 1, "session": 1, "total": 1}

    operator(server.services, *ACCOUNT)
    admin = Client(url + "admin/", auth=ACCOUNT, verbose=False)
    before = _since()
    *_, queue = admin.predict("", "", "", "", "", "*", 1, api_name="/conversations")
    expected = ("等待人工：4（上限 4）  \n**人工队列已满**：在 4 段等待中的对话有人接待之前，新的转人工请求都会被拒绝。  \n"
                "**自 {since} UTC 起拒绝 3 次** —— 超出单个地址上限 1 次，超出单个浏览器上限 1 次，队列已满 1 次。")
    assert queue in {expected.format(since=before), expected.format(since=_since())}  # (an hour may turn meanwhile)


def _since() -> str:
    from datetime import timedelta

    from app.db.models import utcnow

    return f"{utcnow().replace(minute=0, second=0, microsecond=0) - timedelta(hours=1):%H:%M}"
