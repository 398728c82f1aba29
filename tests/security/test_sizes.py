"""Attack: inputs long or deep enough to stall the server for everyone.

Before: fitting a long history into the context re-rendered the whole conversation once per dropped
turn, on the event loop: 1,001 messages took 3.8 s, 3,001 took 48 s, 10,001 froze the server for
about ten minutes; a 1 MB /v1 message was refused only after blocking /healthz for 0.85 s.
After: sizes are bounded before any work (200 history messages, 200,000 history characters, 20,000
per message, 1,024 KiB per request body), prompts are fitted in one pass, and long prompts are
tokenized on a thread — /healthz answers as quickly as it did just before each attack.
Before: /v1 checked the 20,000 characters per content part, so 64 parts of 15,000 (960,000
characters) made one message. After: a message's characters are counted over all its parts.
"""

import time

import httpx
import pytest
from gradio_client import Client

from app.core.prompts import Turn, system_text
from tests.helpers.latency import STALL_FACTOR, STALL_MARGIN_MS, HealthProbe


def history(n: int, chars: int = 20) -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": "历" * chars} for i in range(n)]


@pytest.mark.parametrize("n", [1_001, 10_001])
def test_a_history_of_thousands_of_messages_is_refused_at_once(server_url, n):
    client = Client(server_url, verbose=False)
    with HealthProbe(server_url) as probe:
        # The control: the same upload, refused before its history is read (only a proxy may name a tenant).
        control_s, control = timed(probe, lambda: client.predict("现在呢？", history(n), "电商客服", None, "x",
                                                                 api_name="/chat"))
        elapsed_s, out = timed(probe, lambda: client.predict("现在呢？", history(n), "电商客服", None, None,
                                                             api_name="/chat"))
    assert control["error"] == "租户只能由反向代理通过 PREFIXDESK_TENANT_HEADER 指定；请去掉 tenant 参数。"
    assert out["error"] == (f"The history has {n:,} messages; the limit is 200. Send only the recent ones, or start "
                            "a new conversation.")
    r = httpx.post(server_url + "v1/chat/completions", json={"model": "电商客服", "messages": history(n) + [
        {"role": "user", "content": "现在呢？"}]}, timeout=30)
    assert (r.status_code, r.json()["error"]["message"]) == (
        400, f"'messages': must have at most 201 items, not {n + 1}.")
    # Refused at once: no longer than the upload alone (fitting 1,001 messages took 3.8 s, 10,001 ten minutes).
    limit_s = STALL_FACTOR * control_s + STALL_MARGIN_MS / 1000
    assert elapsed_s <= limit_s, f"refused after {elapsed_s:.2f} s; the upload alone took {control_s:.2f} s"


def timed(probe: HealthProbe, call) -> tuple[float, object]:
    """Seconds ``call()`` took, less any stall of the whole machine meanwhile, and what it returned."""
    started = probe.mark()
    result = call()
    ended = probe.mark()
    return ended - started - probe.stalled_s(started, ended), result


def test_the_largest_history_allowed_is_fitted_quickly_and_off_the_event_loop(server_url, services):
    turns = history(200, chars=999)  # 199,800 characters: just inside both limits
    with HealthProbe(server_url) as probe:
        control = probe.control()
        started = probe.mark()
        r = httpx.post(server_url + "v1/chat/completions", json={
            "model": "电商客服", "messages": turns + [{"role": "user", "content": "现在呢？"}], "max_tokens": 2},
            timeout=60)
        elapsed_s = probe.mark() - started
        time.sleep(0.3)
        ended = probe.mark()
    assert r.status_code == 200
    system = system_text(services.catalog.get("电商客服").chain)
    built = services.prompts.build(system, [Turn(m["role"], m["content"]) for m in turns], "现在呢？")
    assert r.json()["usage"]["prompt_tokens"] == len(built.token_ids)
    assert built.dropped_turns == 100  # every exchange: one is 2,000 tokens, more than the context leaves
    before_ms, during_ms = probe.assert_responsive(control, started, ended)
    print(f"\n200 messages of 999 characters: answered in {elapsed_s * 1000:.0f} ms; /healthz p90 {during_ms:.0f} ms "
          f"({before_ms:.0f} ms before)")


def test_a_history_over_the_character_limit_is_refused(server_url):
    turns = history(100, chars=2_001)
    r = httpx.post(server_url + "v1/chat/completions", json={
        "model": "电商客服", "messages": turns + [{"role": "user", "content": "现在呢？"}]}, timeout=30)
    assert (r.status_code, r.json()["error"]["message"]) == (
        400, "The history has 200,100 characters; the limit is 200,000. Send only the recent messages, or start a new "
             "conversation.")


def test_a_one_megabyte_body_is_refused_before_it_is_read(server_url):
    body = b'{"model": "x", "messages": [{"role": "user", "content": "' + b"a" * (1 << 20) + b'"}]}'
    with HealthProbe(server_url) as probe:
        control = probe.control()
        started = probe.mark()
        r = httpx.post(server_url + "v1/chat/completions", content=body, headers={"content-type": "application/json"})
        time.sleep(0.3)
        ended = probe.mark()
    assert (r.status_code, r.json()) == (413, {"detail": "The request body is larger than 1,024 KiB; send less "
                                                         "(the limit is PREFIXDESK_MAX_REQUEST_KIB)."})
    probe.assert_responsive(control, started, ended)


def test_a_body_without_a_length_that_grows_past_the_limit_is_cut_off(server_url):
    def chunks():
        yield b'{"model": "x", "messages": [{"role": "user", "content": "'
        for _ in range(40):
            yield b"a" * 65536
        yield b'"}]}'

    r = httpx.post(server_url + "v1/chat/completions", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert r.json()["detail"].startswith("The request body is larger than 1,024 KiB")


def test_a_message_over_the_limit_is_refused_and_not_stored(server_url, db):
    before = db["messages"].count
    out = Client(server_url, verbose=False).predict("退" * 20_001, None, "电商客服", None, None, api_name="/chat")
    assert out["error"] == ("This message has 20,001 characters; the limit is 20,000. Please shorten it or split it "
                            "into several messages.")
    assert db["messages"].count == before


def test_v1_counts_a_messages_characters_over_all_its_content_parts(server_url):
    parts = [{"type": "text", "text": "a" * 15_000} for _ in range(64)]  # 960 KB: under the body limit
    r = httpx.post(server_url + "v1/chat/completions", timeout=30, json={
        "model": "电商客服", "messages": [{"role": "user", "content": parts}]})
    assert (r.status_code, r.json()["error"]) == (400, {
        "message": "messages[0].content has 960,000 characters; the limit is 20,000 per message, over all its parts. "
                   "Please shorten it or split it into several messages.",
        "type": "invalid_request_error", "param": "messages[0].content", "code": "message_too_long"})
    # Parts within the limit of each message, but a conversation over the history limit: the same 400 as strings.
    history = [{"role": "user" if i % 2 == 0 else "assistant", "content": [{"type": "text", "text": "a" * 5_001}] * 2}
               for i in range(20)]
    r = httpx.post(server_url + "v1/chat/completions", timeout=30, json={
        "model": "电商客服", "messages": history + [{"role": "user", "content": [{"type": "text", "text": "现在呢？"}]}]})
    assert (r.status_code, r.json()["error"]["message"]) == (
        400, "The history has 200,040 characters; the limit is 200,000. Send only the recent messages, or start a new "
             "conversation.")
