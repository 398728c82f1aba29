"""Attack: read a closed tab's conversation with its session hash (from a proxy's log).

Before: while the page was open a stranger naming its hash got 403; once it closed, one address made up
~104,000 session claims in ~31 min (``queue/join`` with a non-integer fn_index, answered 422: nothing
limited claims), the server forgot the oldest idle owners past 100,000, and the stranger claimed the
victim's hash and sent Retry with an empty session key: 200, with the victim's conversation in the reply,
32 min after the tab closed. Gradio kept the closed session's state for an hour, and a handler called
without a key returned the server-side conversation shown.
After: a handler called without a key this server issued returns nothing of the session's state; the
state dies with its page (when the page says it closed, or is not heard of for PREFIXDESK_PAGE_GONE_S); a claim needs a cookie a page load handed out (an
HMAC under the server's key), and new claims are limited per cookie and per address
(PREFIXDESK_SESSION_CLAIMS_PER_MINUTE, here 5 for a flood scaled down).
"""

from __future__ import annotations

import secrets
import uuid

import httpx
import pytest
from starlette.routing import Mount

from tests.helpers.attack import config, dependency, output, run
from tests.helpers.servers import SecondServer
from tests.helpers.waiting import wait_until

CLAIMS_PER_MINUTE = 5
NOT_YOURS = {"detail": "这个会话属于另一个浏览器窗口：请刷新页面。"}
TOO_MANY = {"detail": "这个浏览器一分钟内打开的页面太多了：请等一分钟再刷新页面。"}
NOTHING_TO_RETRY = "提示：还没有可以重试的回答。"
SECRET = "我的订单 A7731 地址是幸福路 8 号"


class _Sessions:
    """Gradio's per-session state of the chat, as the server holds it."""

    def __init__(self, server: SecondServer):
        chat = next(r.app for r in server.app.routes if isinstance(r, Mount) and r.path == "").blocks
        self.holder = chat.state_holder

    def gone(self, session_hash: str) -> bool:
        return session_hash not in self.holder.session_data

    def state(self, session_hash: str) -> dict:
        return dict(self.holder.session_data[session_hash].state_data)


@pytest.fixture(scope="module")
def server(services, engine_loop, tmp_path_factory):
    """A server behind a trusted proxy on 127.0.0.1 (each test is a client address of its own, in X-Forwarded-For)
    that lets a cookie, and an address, claim CLAIMS_PER_MINUTE new sessions a minute."""
    server = SecondServer(services, engine_loop, tmp_path_factory.mktemp("claims"), trusted_proxies="127.0.0.1",
                          session_claims_per_minute=CLAIMS_PER_MINUTE)
    with server as url:
        server.url = url
        yield server


def page(url: str, address: str) -> httpx.Client:
    """A browser at ``address`` (as the trusted proxy forwards it) that has loaded the page: it holds its cookie."""
    client = httpx.Client(timeout=120, headers={"X-Forwarded-For": address})
    assert client.get(url).status_code == 200 and "pd_browser" in client.cookies
    return client


def texts(chatbot: list) -> list[str]:
    return [m["content"][0]["text"] for m in chatbot]


def test_a_session_run_without_its_key_gets_nothing_of_its_state_and_the_state_dies_with_its_page(server):
    url, sessions = server.url, _Sessions(server)
    cfg = config(url)
    assert cfg["connect_heartbeat"] is False  # the page holds no stream to say it is open (app/web/sessions.py)
    load, send, retry = (dependency(cfg, name) for name in ("on_load", "send", "retry"))
    victim, session = page(url, "10.1.0.1"), uuid.uuid4().hex
    key = output(run(victim, url, load, ["", None], session))[0]
    alive = victim.get(url + f"gradio_api/heartbeat/{session}")  # the page is open: said in a short request
    assert (alive.status_code, alive.text, alive.headers["content-type"]) == (200, "data: ALIVE\n\n",
                                                                               "text/event-stream")
    asked = output(run(victim, url, send, [SECRET, "电商客服", None, key, None], session))
    assert texts(asked[0])[0] == SECRET
    assert SECRET in str(sessions.state(session))  # the conversation shown is kept on the server while it is open
    # Whoever runs an event in this session (its hash taken over) sends Retry with an empty key: the notice alone.
    for forged_key in ("", "b.forged.key"):
        again = output(run(victim, url, retry, [None, forged_key, None], session))
        assert texts(again[0]) == [NOTHING_TO_RETRY]
    # Only its own browser may say the page closed.
    stranger = page(url, "10.1.0.2")
    assert stranger.post(url + f"gradio_api/heartbeat/{session}").status_code == 403
    assert SECRET in str(sessions.state(session))
    closed = victim.post(url + f"gradio_api/heartbeat/{session}")  # the page closed (its beacon)
    assert (closed.status_code, closed.content) == (204, b"")
    assert sessions.gone(session)  # its state is gone at once, not an hour later
    again = output(run(victim, url, retry, [None, "", None], session))
    assert texts(again[0]) == [NOTHING_TO_RETRY]
    assert SECRET not in str(sessions.state(session))  # a page that comes back under the hash starts afresh


def test_a_page_not_heard_of_for_page_gone_s_is_taken_as_closed(services, engine_loop, tmp_path):
    """A page that closed without a word (a crash, a lost network) says nothing more: PREFIXDESK_PAGE_GONE_S
    after its last sign of life its state is dropped, at the next request naming any session."""
    second = SecondServer(services, engine_loop, tmp_path, trusted_proxies="127.0.0.1", page_gone_s=1)
    with second as url:
        sessions = _Sessions(second)
        cfg = config(url)
        load, send = dependency(cfg, "on_load"), dependency(cfg, "send")
        victim, session = page(url, "10.5.0.1"), uuid.uuid4().hex
        key = output(run(victim, url, load, ["", None], session))[0]
        assert victim.get(url + f"gradio_api/heartbeat/{session}").status_code == 200
        output(run(victim, url, send, [SECRET, "电商客服", None, key, None], session))
        assert SECRET in str(sessions.state(session))
        other, mine = page(url, "10.5.0.2"), uuid.uuid4().hex

        def dropped() -> bool:  # another page's sign of life, a request naming a session, ends the silent one
            assert other.get(url + f"gradio_api/heartbeat/{mine}").status_code == 200
            return sessions.gone(session)

        wait_until(dropped, 60, "the silent page's session to end", poll_s=0.5)


def test_a_claim_needs_a_cookie_a_page_load_handed_out(server):
    url = server.url
    session = uuid.uuid4().hex
    body = {"session_hash": session, "fn_index": 0, "event_id": "x"}
    forged = (None, secrets.token_urlsafe(32),  # none; the old form (any 43 characters)
              f"{secrets.token_urlsafe(16)}.{secrets.token_urlsafe(16)}")  # the form, with an HMAC of no key
    for cookie in forged:
        with httpx.Client(timeout=30, headers={"X-Forwarded-For": "10.2.0.1"},
                          cookies={"pd_browser": cookie} if cookie else None) as client:
            r = client.post(url + "gradio_api/cancel", json=body)
            assert (r.status_code, r.json()) == (403, NOT_YOURS)
    owner = page(url, "10.2.0.1")
    assert owner.post(url + "gradio_api/cancel", json=body).status_code == 200  # now it is the owner's
    for cookie in forged[1:]:  # and still no one else's
        with httpx.Client(timeout=30, cookies={"pd_browser": cookie}) as client:
            assert client.post(url + "gradio_api/cancel", json=body).status_code == 403


def test_new_claims_are_limited_per_cookie_and_per_address(server):
    url = server.url
    claimant = page(url, "10.3.0.1")

    def claim(client: httpx.Client, session: str) -> tuple[int, dict]:
        r = client.post(url + "gradio_api/cancel", json={"session_hash": session, "fn_index": 0, "event_id": "x"})
        return r.status_code, r.json()

    made_up = [f"flood{i:04d}" for i in range(CLAIMS_PER_MINUTE + 3)]
    answers = [claim(claimant, session) for session in made_up]
    assert [status for status, _ in answers] == [200] * CLAIMS_PER_MINUTE + [429] * 3
    assert answers[-1][1] == TOO_MANY
    assert claim(claimant, made_up[0]) == (200, {"success": True})  # a session it owns is no new claim
    # A fresh cookie from the same address: the address's claims are spent too.
    assert claim(page(url, "10.3.0.1"), "flood-new-cookie") == (429, TOO_MANY)
    # Another address, another cookie: its own claims.
    assert claim(page(url, "10.3.0.2"), "flood-other")[0] == 200
    # The hashes refused were never bound: their owner is still whoever claims them first.
    assert claim(page(url, "10.3.0.3"), made_up[-1])[0] == 200


def test_the_floods_refused_requests_claim_nothing(server):
    url = server.url
    flooder = page(url, "10.4.0.1")
    made_up = [f"junk{i:04d}" for i in range(CLAIMS_PER_MINUTE * 2)]
    for session in made_up:  # the flood: joins with an fn_index that is no event's (422 from Gradio, before)
        r = flooder.post(url + "gradio_api/queue/join", json={"data": [], "fn_index": "x", "session_hash": session})
        assert r.status_code == 400
    # None of them was a claim: the flooder's claims are all left, and each of those hashes is still no one's.
    claims = [flooder.post(url + "gradio_api/cancel", json={"session_hash": s, "fn_index": 0, "event_id": "x"})
              for s in made_up[:CLAIMS_PER_MINUTE + 1]]
    assert [r.status_code for r in claims] == [200] * CLAIMS_PER_MINUTE + [429]
