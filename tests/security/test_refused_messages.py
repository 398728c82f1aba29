"""Attack: make the server keep messages it refuses, one fresh session after another.

Before: the chat put a question into the conversation state before the desk refused it, and Gradio
kept the last value of every input of every session for its deep links (up to 10,000 sessions), so
100 refused messages of 900 KB from fresh sessions kept +107 MiB of server memory, with /healthz at
a p50 of 49 ms against 3 ms before the flood; the size check came before the rate check, so refused
messages were never counted against the sender's rate.
After: the chat takes a message in (type, rate, then size: Desk.admit) before it keeps anything, a
refusal leaves the conversation state as it was, and Gradio's sessions keep no deep-link snapshot
(app/web/gradio_state.py): a few MiB for the same flood (the allocator's, not the messages').
"""

import re
import time
import uuid

import httpx
from gradio_client import Client

from tests.helpers.attack import config, dependency, output, run
from tests.helpers.health import HealthWindows, rss_mib
from tests.helpers.servers import SecondServer

NUM_MESSAGES = 100
MESSAGE = "a" * 900_000  # under the 1 MiB request limit, 45 times the message limit
TOO_LONG = "这条消息太长了（900000 字，最多 20000 字），请缩短或分成几条发送。"  # the chat's words, in zh
GROWTH_LIMIT_MIB = 25  # before the fix the same flood kept 107 MiB
RATE = re.compile(r"您发送得有点快，请等 (\d+) 秒后再发送。")
ADDRESS_RATE = re.compile(r"您所在的网络此刻发来的消息较多，请等 (\d+) 秒后再发送。")
API_RATE = re.compile(r"Your network's address is sending messages faster than 5 a minute, all its browsers together; "
                      r"please wait (\d+) s and send again\.")


def notices(chatbot: list) -> list[str]:
    """The chat's notices, shown as they are (never folded under a title), each after its "提示：" mark."""
    texts = [m["content"][0]["text"] for m in chatbot if m["role"] == "assistant" and not m.get("metadata")]
    return [text.removeprefix("提示：") for text in texts if text.startswith("提示：")]


def refuse_from_fresh_sessions(url: str, n: int, message: str = MESSAGE, *, sends: int = 1) -> list[list[str]]:
    """``n`` sessions of their own (a cookie jar and a browser key each), each loading the page and sending
    ``message`` ``sends`` times; what each send showed."""
    cfg = config(url)
    load, send = dependency(cfg, "on_load"), dependency(cfg, "send")
    shown = []
    for _ in range(n):
        with httpx.Client(timeout=60) as client:
            session = uuid.uuid4().hex
            key = output(run(client, url, load, ["", None], session))[0]
            for _ in range(sends):
                shown.append(notices(output(run(client, url, send, [message, "电商客服", None, key, None],
                                                session))[0]))
    return shown


def test_refused_messages_from_fresh_sessions_keep_no_memory_and_stall_no_one(edge):
    # The edge server: a process of its own (its memory can be read), whose rates let every message of the flood
    # reach the size check (each fresh session sends once; the address's 300 a minute are more than the 110 sent).
    refuse_from_fresh_sessions(edge.url, 10)  # the first events import and cache what all later ones use
    with HealthWindows(edge.url) as health:
        time.sleep(5)  # the control window
        before = rss_mib(edge.proc.pid)
        health.window("flood")
        shown = refuse_from_fresh_sessions(edge.url, NUM_MESSAGES)
        grown = rss_mib(edge.proc.pid) - before
    print(f"\n{NUM_MESSAGES} refused 900 KB messages: RSS +{grown:.1f} MiB; /healthz {health.summary('before')}; "
          f"{health.summary('flood')}")
    assert shown == [[TOO_LONG]] * NUM_MESSAGES
    assert grown < GROWTH_LIMIT_MIB
    # Before the fix: p90 154 ms against 6 ms in the control window.
    assert health.quantile("flood", 0.9) <= 4 * health.quantile("before", 0.9) + 40


def test_a_refused_message_leaves_the_conversation_as_it_was(server_url):
    cfg = config(server_url)
    load, send = dependency(cfg, "on_load"), dependency(cfg, "send")
    tag = uuid.uuid4().hex[:8]
    with httpx.Client(timeout=120) as client:
        session = uuid.uuid4().hex
        key = output(run(client, server_url, load, ["", None], session))[0]
        refused = output(run(client, server_url, send, ["退" * 20_001, "电商客服", None, key, None], session))
        assert notices(refused[0]) == ["这条消息太长了（20001 字，最多 20000 字），请缩短或分成几条发送。"]
        # The shown state and the open conversation as they were (none), the page's key, nothing for the box.
        assert refused[1:] == [None, None, key, None]
        # The next question starts from the conversation as it was: empty, not the refused text.
        messages = run(client, server_url, send, [f"发票 {tag}", "电商客服", None, key, None], session)
        first = next(m for m in messages if m["msg"] == "process_generating")["output"]["data"][0]
        assert [(m["role"], m["content"][0]["text"]) for m in first] == [("user", f"发票 {tag}")]


def test_refused_messages_count_against_the_senders_rate(services, engine_loop, tmp_path):
    # A browser's own rate is 2 a minute; its address's, all browsers together, 5.
    with SecondServer(services, engine_loop, tmp_path, rate_limit_per_minute=2,
                      rate_limit_per_address_per_minute=5) as url:
        # The third message of one browser in the minute is refused for its rate, before its size is read.
        first, second, third = refuse_from_fresh_sessions(url, 1, sends=3)
        assert [first, second] == [[TOO_LONG]] * 2
        assert len(third) == 1 and RATE.fullmatch(third[0]), third
        # Other browsers of the address have rates of their own, up to the address's bound.
        assert refuse_from_fresh_sessions(url, 3) == [[TOO_LONG]] * 3
        [fresh] = refuse_from_fresh_sessions(url, 1)
        assert len(fresh) == 1 and ADDRESS_RATE.fullmatch(fresh[0]), fresh
        out = Client(url, verbose=False).predict("退货", None, "电商客服", None, None, api_name="/chat")
        assert out["status"] == "rejected" and API_RATE.fullmatch(out["error"]), out  # /chat: the precise English
