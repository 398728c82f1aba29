"""Attack: get around the per-client limits, or take the whole engine for one client.

Before: the chat's rate limit was per Gradio session, so a fresh session hash reset it; /v1 had no
limit at all, and one client holding 128 streams made everyone else get 429.
After: limits key on the client's address (the peer, or what a trusted proxy forwards), on every
public entry point; an X-Forwarded-For from anyone but the proxy changes nothing.
"""

import re
import threading

import httpx
from gradio_client import Client

from tests.helpers.waiting import wait_until

BODY = {"model": "support-en", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2}
LONG = {**BODY, "max_tokens": 500, "ignore_eos": True, "stream": True}
RATE = re.compile(r"You are sending messages faster than 3 a minute; please wait (\d+) s and send again\.")


def waits_s(message: str) -> int:
    """The wait a rate-limit message names: at most the minute, less the time the test has taken."""
    match = RATE.fullmatch(message)
    assert match, message
    return int(match.group(1))


def test_fresh_sessions_and_a_forged_forwarded_for_do_not_reset_the_rate_limit(limited):
    answers = [Client(limited, verbose=False).predict(f"question {i}", None, "support-en", None, None,
                                                      api_name="/chat") for i in range(3)]
    assert [a["status"] for a in answers] == ["ok", "ok", "ok"]
    fourth = Client(limited, verbose=False).predict("question 4", None, "support-en", None, None, api_name="/chat")
    assert fourth["status"] == "rejected"
    assert 0 < waits_s(fourth["error"]) <= 61
    r = httpx.post(limited + "v1/chat/completions", json=BODY, headers={"X-Forwarded-For": "198.51.100.99"})
    assert r.status_code == 429 and 0 < waits_s(r.json()["error"]["message"]) <= 61
    assert r.json()["error"]["code"] == "rate_limited"
    assert int(r.headers["retry-after"]) == waits_s(r.json()["error"]["message"])


def test_one_client_cannot_hold_more_streams_than_its_share(limited, services, engine_loop, tmp_path):
    from tests.helpers.servers import SecondServer

    # A server of its own: the rate limit of the test above has used this address's minute.
    server = SecondServer(services, engine_loop, tmp_path, rate_limit_per_minute=0, max_streams_per_client=2,
                          max_tokens=600)
    with server as url:
        opened = threading.Barrier(3)
        results: list[int] = []

        def hold():
            with httpx.stream("POST", url + "v1/chat/completions", json=LONG, timeout=120) as r:
                results.append(r.status_code)
                opened.wait(60)
                for _ in r.iter_lines():
                    pass

        holders = [threading.Thread(target=hold) for _ in range(2)]
        for h in holders:
            h.start()
        opened.wait(60)  # both streams are open
        third = httpx.post(url + "v1/chat/completions", json=BODY, timeout=30)
        for h in holders:
            h.join(120)
        assert results == [200, 200]
        assert (third.status_code, third.json()["error"]["message"]) == (
            429, "You already have 2 answers in progress; the limit is 2. Wait for one to finish, then send again.")
        # Each slot is given back as its stream closes, a moment after its last line.
        wait_until(lambda: server.services.desk.limiter.num_keys() == 0, 10, "both streams' slots to come back")
        assert httpx.post(url + "v1/chat/completions", json=BODY, timeout=60).status_code == 200  # slots came back
