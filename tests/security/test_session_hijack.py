"""Attack: take over another customer's session with what travels in URLs and logs, or forge a session key.

Before: a Gradio session hash (sent in ``queue/data?session_hash=`` and ``heartbeat/<hash>``, so in
every proxy's access log) was all a stranger needed: ``/gradio_api/deep_link?session_hash=`` returned
the victim's session key, with which the page's events listed and opened every stored conversation;
a second listener on the hash took the victim's live answer; any string was accepted as a session key
(``api-<hash>`` opened the conversations of a /chat client), and a 900,000-character one was written
with each conversation (+10.4 MB for 5 messages).
After: session keys are issued by the server (a random id and its HMAC; /chat's of a kind of their
own) and checked before any read or write; a session hash belongs to the cookie that first named it
(403 for anyone else); deep links answer 404.
"""

import uuid

import httpx
import pytest
import sqlite_utils
from gradio_client import Client

from tests.helpers.attack import config, dependency, join, output, run, stream
from tests.helpers.servers import SecondServer

NOT_YOURS = {"detail": "这个会话属于另一个浏览器窗口：请刷新页面。"}
EXPIRED = "页面已过期，这条消息没有发送。再发送一次即可开始新的对话。"


@pytest.fixture(scope="module")
def events(server_url) -> dict:
    cfg = config(server_url)
    return {name: dependency(cfg, name) for name in ("on_load", "send", "open_conversation")}


def browser(url: str) -> httpx.Client:
    """A browser: its cookie jar keeps what the page load sets, as a real one does."""
    client = httpx.Client(timeout=120)
    assert client.get(url).status_code == 200
    return client


def server_keys(data_dir):
    from app.core.session_keys import SessionKeys  # here: the attacks below run against code without it too

    return SessionKeys((data_dir / "session-key.key").read_text().strip())


def answer(client: httpx.Client, method: str, url: str, **kwargs) -> tuple[int, object]:
    """The status and JSON body of a refusal; of a stream (a stranger let in), the status and its first line."""
    with client.stream(method, url, **kwargs) as r:
        if r.headers.get("content-type", "").startswith("text/event-stream"):
            return r.status_code, next(r.iter_lines(), "")
        r.read()
        return r.status_code, r.json()


def conversations(load_output: list) -> list:
    return load_output[2]["choices"]


def test_a_stranger_with_the_victims_session_hash_gets_nothing_of_it(server_url, events):
    victim, stranger, anonymous = browser(server_url), browser(server_url), httpx.Client(timeout=30)
    session = uuid.uuid4().hex
    key = output(run(victim, server_url, events["on_load"], ["", None], session))[0]
    # The victim asks; while the answer is on its way, the stranger tries every route that names the hash.
    joined = join(victim, server_url, events["send"], [f"我的订单 {session[:6]} 还没发货", "电商客服", None, key, None],
                  session)
    assert joined.status_code == 200
    for client in (stranger, anonymous):
        tried = [
            answer(client, "GET", server_url + "gradio_api/queue/data", params={"session_hash": session}),
            answer(client, "GET", server_url + f"gradio_api/heartbeat/{session}"),
            answer(client, "POST", server_url + "gradio_api/cancel", json={
                "session_hash": session, "fn_index": events["send"]["id"], "event_id": joined.json()["event_id"]}),
            # an event run inside the victim's session, with its state
            answer(client, "POST", server_url + "gradio_api/queue/join", json={
                "data": [key, None], "fn_index": events["on_load"]["id"], "session_hash": session, "event_data": None,
                "trigger_id": events["on_load"]["targets"][0][0]}),
        ]
        assert tried == [(403, NOT_YOURS)] * 4
        deep_link = answer(client, "GET", server_url + "gradio_api/deep_link", params={"session_hash": session})
        assert deep_link == (404, {"detail": "Not Found"})
    # ... and the victim's answer reaches the victim whole.
    final = output(stream(victim, server_url, session))
    assert final[0][-1]["metadata"]["title"].startswith("已回复") and final[3] == key  # (no first text reported)
    assert len(conversations(output(run(victim, server_url, events["on_load"], [key, None], session)))) == 1


def test_a_page_asked_for_a_deep_link_is_the_plain_page(server_url):
    assert httpx.get(server_url, params={"deep_link": "abc123"}).status_code == 200
    assert "deep_link_state" not in httpx.get(server_url + "config", params={"deep_link": "abc123"}).json()


def test_keys_the_server_did_not_issue_open_nothing(server_url, events, db, settings):
    api = Client(server_url, verbose=False)
    mine = api.predict("发票抬头可以改吗？", None, "电商客服", None, None, api_name="/chat")
    stored_key = db["conversations"].get(mine["conversation_id"])["session_key"]
    client = browser(server_url)
    forged = [stored_key, f"api-{api.session_hash}", uuid.uuid4().hex, "", "b." + "A" * 22 + "." + "A" * 22,
              "k" * 900_000, 12345]
    for value in forged:  # /chat's own key, its old form, a key of the old form, a key of no one, giant, a number
        key, _, listed, *_ = output(run(client, server_url, events["on_load"], [value, None], uuid.uuid4().hex))
        assert (listed["choices"], key != value) == ([], True), value  # a fresh key, with no conversation
    keys = server_keys(settings.data_dir)
    assert stored_key == keys.api(api.session_hash) and stored_key.startswith("a.")
    issued = keys.mint_browser()
    tampered = issued[:-1] + ("B" if issued[-1] != "B" else "C")
    key, _, listed, *_ = output(run(client, server_url, events["on_load"], [tampered, None], uuid.uuid4().hex))
    assert keys.browser(key) == key != tampered and listed["choices"] == []
    key, _, listed, *_ = output(run(client, server_url, events["on_load"], [issued, None], uuid.uuid4().hex))
    assert (key, listed["choices"]) == (issued, [])  # an issued key is kept


def test_a_giant_or_forged_session_key_writes_nothing(services, engine_loop, tmp_path):
    # No cache samples meanwhile: nothing else writes to this server's database during the test.
    with SecondServer(services, engine_loop, tmp_path, sample_interval_s=3600) as url:
        path = tmp_path / "prefixdesk.db"
        db = sqlite_utils.Database(path)
        cfg = config(url)
        load, send = dependency(cfg, "on_load"), dependency(cfg, "send")
        client = browser(url)
        before = (db["conversations"].count, db["messages"].count)
        sizes = (path.stat().st_size, path.with_name("prefixdesk.db-wal").stat().st_size)
        for value in ("k" * 900_000, f"api-{uuid.uuid4().hex}", "b.forged.key"):
            for _ in range(5):  # the page loads (the template picker fills), then its message comes with ``value``
                session = uuid.uuid4().hex
                run(client, url, load, [value, None], session)
                out = output(run(client, url, send, ["你好", "电商客服", None, value, None], session))
                assert [m["content"][0]["text"] for m in out[0]] == ["提示：" + EXPIRED]
                assert server_keys(tmp_path).browser(out[3]) == out[3]  # the page gets a key of the server's
        assert (db["conversations"].count, db["messages"].count) == before
        assert (path.stat().st_size, path.with_name("prefixdesk.db-wal").stat().st_size) == sizes


def test_a_session_hash_is_bounded_and_gradio_client_needs_nothing_more(server_url):
    client = browser(server_url)
    for bad in ("x" * 65, "a/b", "é"):
        r = client.get(server_url + "gradio_api/queue/data", params={"session_hash": bad})
        assert (r.status_code, r.json()) == (400, {"detail": "session_hash 必须是 1 到 64 个字母、数字、“-”或“_”。"})
    r = client.get(server_url + "gradio_api/queue/data", params=[("session_hash", "a1"), ("session_hash", "a2")])
    assert r.status_code == 400
    assert "pd_browser" in client.cookies  # the page load gave it
    # gradio_client keeps the cookie of the config it fetches first: a script needs nothing else.
    api = Client(server_url, verbose=False)
    assert "pd_browser" in api.cookies
    assert api.predict("退货要多久？", None, "电商客服", None, None, api_name="/chat")["status"] == "ok"
