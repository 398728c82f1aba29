"""The chat page under load: Gradio's queue protocol spoken from asyncio, as the browser speaks it.

``ChatPageTarget`` is the benchmark's ``chat`` path. It reads the page's ``/config`` once per client
process to find the page-load event and the message box's submit event (their ``fn_index``,
trigger and inputs), then plays each simulated customer as a fresh browser session, exactly as
chromium does (watched with Playwright's ``page.on("request")``):

1. the page load's event with a new ``session_hash``: ``POST /gradio_api/run/predict`` (the chat's
   is outside the queue), or for a queued one ``POST /gradio_api/queue/join`` and the SSE
   ``GET /gradio_api/queue/data?session_hash=…`` until ``close_stream``; it gives the session key and
   fills the template picker (the send event refuses a template that is not among the picker's
   choices, so it cannot be skipped);
2. the same two requests for the submit event with (question, template, the session key; ``null``
   for the server-side states), reading ``process_generating`` diffs until ``process_completed``;
3. the events the page chains after it (``.then``: the sidebar's refresh), as the browser triggers
   them once the answer completed: queued ones as above, the others as ``POST /gradio_api/run/predict``.

Each customer is a browser of its own: the server's browser cookie (``pd_browser``, which it binds
the session hash to: app/web/sessions.py) is taken from the customer's first answer and sent with
every later request of that customer, and never shared with another (no cookie jar).

Times count from the customer's scheduled arrival (the page load included); the first content is
the first update in which the answer (the assistant text after the question, captions excluded)
is not empty, the end is ``process_completed``. The caption's stored stats (cached / prompt
tokens, the engine's first token) are read from the final value. The page never learns the
answer's token count, so a chat sample counts the updates it received instead.

``python -m bench.chatload --self-check`` measures this client against ``bench.chatstub``.
"""

from __future__ import annotations

import html
import json
import re
import time
import uuid
from dataclasses import dataclass

from bench.loadgen import Outcome, Timer
from bench.workload import BenchRequest

try:
    import orjson

    _loads = orjson.loads
except ImportError:  # the standard library parses the same JSON, a little slower
    _loads = json.loads

CONFIG_PATH = "config"
JOIN_PATH = "gradio_api/queue/join"
DATA_PATH = "gradio_api/queue/data"
PREDICT_PATH = "gradio_api/run/predict"  # events that skip the queue
BROWSER_COOKIE = "pd_browser"
SESSION_KEY = "sessionkey"  # the kind find_chat_page gives the BrowserState that holds the session key
SESSION_STORAGE_KEY = "prefixdesk-session"  # that BrowserState's storage key (app/chat/page.py)  # the cookie app/web/sessions.py binds a session hash to
MESSAGE_BOX = "message"  # elem_id of the chat's message box (app/chat/page.py)
END_MESSAGES = ("process_completed", "unexpected_error")
# The caption's details: "cached 1056 / 1065 prompt tokens · engine first token 13 ms" (zh: 缓存命中 … 引擎首 token).
CAPTION_TOKENS = re.compile(r"(\d+) ?/ ?(\d+)")  # the caption's details: what was read before, of the prompt
# The caption as customers read it now: the share of the template's shared prefix read before (the same in every
# arm of a split), counted here as cached tokens of a 100-token prompt: the hit column is that share.
CAPTION_REUSED = re.compile(r"(?:已读资料复用|reading reused) (\d+)%")
CAPTION_TTFT = re.compile(r"(?:server began replying|服务器开始回复|engine first token|引擎首 token) (\d+)")


class ChatPageError(RuntimeError):
    """The page does not look like the chat, or an answer failed; the message says which."""


@dataclass(frozen=True)
class PageEvent:
    """One event of the page as its config describes it."""

    fn_index: int
    trigger_id: int | None
    # component types, e.g. ("textbox", "dropdown", "state", "sessionkey", "state"); "sessionkey" is the
    # BrowserState holding the session key (the page may keep other values in the browser too)
    input_types: tuple[str, ...]
    output_types: tuple[str, ...]
    queued: bool = True  # False: the browser calls it with one POST, outside Gradio's queue


@dataclass(frozen=True)
class ChatPage:
    load: PageEvent  # the page load: sets the session key and the template picker's choices
    send: PageEvent  # the message box's submit
    after_send: tuple[PageEvent, ...] = ()  # chained after it (.then), in the page's order

    @property
    def chatbot_index(self) -> int:
        return self.send.output_types.index("chatbot")

    @property
    def session_index(self) -> int:
        return self.load.output_types.index(SESSION_KEY)


def find_chat_page(config: dict) -> ChatPage:
    """The load and send events of the chat page's ``/config``; raises ChatPageError when absent."""
    types = {c["id"]: c["type"] for c in config["components"]}
    kept = [c for c in config["components"] if c["type"] == "browserstate"]
    session = next((c for c in kept if (c.get("props") or {}).get("storage_key") == SESSION_STORAGE_KEY),
                   kept[0] if kept else None)
    if session is not None:
        types[session["id"]] = SESSION_KEY
    box = next((c["id"] for c in config["components"] if (c.get("props") or {}).get("elem_id") == MESSAGE_BOX), None)
    load = send = None
    events, follows = {}, {}
    for index, dep in enumerate(config["dependencies"]):
        targets = [tuple(t) for t in dep["targets"]]
        event = PageEvent(dep.get("id", index), targets[0][0] if targets else None,
                          tuple(types[i] for i in dep["inputs"]), tuple(types[i] for i in dep["outputs"]),
                          queued=dep.get("queue") is not False)
        events[event.fn_index] = event
        if dep.get("trigger_after") is not None and not dep.get("trigger_only_on_failure"):
            follows.setdefault(dep["trigger_after"], []).append(event.fn_index)
        if any(kind == "load" for _, kind in targets) and SESSION_KEY in event.output_types:
            load = event
        if box is not None and (box, "submit") in targets:
            send = event
    if load is None or send is None or "chatbot" not in send.output_types:
        raise ChatPageError("the page's config has no chat: no load event setting the session key, or no "
                            f"submit event of #{MESSAGE_BOX} with a chatbot output")
    return ChatPage(load, send, tuple(events[i] for i in follows.get(send.fn_index, ())))


def send_inputs(event: PageEvent, *, question: str, template: str, session_key: str) -> list:
    """The values a browser sends for ``event``'s inputs: server-side states, and a fresh browser's other stored
    values, go as null."""
    values = {"textbox": question, "dropdown": template, SESSION_KEY: session_key}
    return [values.get(kind) for kind in event.input_types]


def apply_diff(value, diff: list):
    """Gradio's streaming diff applied in place (as the browser does); returns the new value."""
    for action, path, new in diff:
        if not path:
            value = new if action == "replace" else value + new
            continue
        node = value
        for key in path[:-1]:
            node = node[key]
        key = path[-1]
        if action == "replace":
            node[key] = new
        elif action == "append":
            node[key] += new
        elif action == "add":
            if isinstance(node, list):
                node.insert(int(key), new)
            else:
                node[key] = new
        elif action == "delete":
            del node[int(key) if isinstance(node, list) else key]
        else:
            raise ChatPageError(f"unknown diff action {action!r}")
    return value


def answer_text(messages: list) -> str:
    """The answer in a chatbot value as the page shows it: the assistant text after the last question, captions
    excluded, its HTML entities read as the browser reads them (the chat sends every message escaped)."""
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    parts = []
    for m in messages[last_user + 1:]:
        if m.get("role") == "assistant" and not (m.get("metadata") or {}).get("title"):
            parts.append(_text(m.get("content")))
    return html.unescape("".join(parts))


def caption_stats(messages: list) -> tuple[int, int, int] | None:
    """(cached tokens, prompt tokens, engine TTFT ms) from the answer's caption (with its reused share: (percent,
    100, ms)), or None (no caption: a notice)."""
    for m in reversed(messages):
        if m.get("role") == "user":
            return None
        if (m.get("metadata") or {}).get("title"):
            text = _text(m.get("content"))
            tokens, ttft = CAPTION_TOKENS.search(text), CAPTION_TTFT.search(text)
            if tokens and ttft:
                return int(tokens.group(1)), int(tokens.group(2)), int(ttft.group(1))
            if ttft and (reused := CAPTION_REUSED.search(text)):
                return int(reused.group(1)), 100, int(ttft.group(1))
            return None
    return None


def notice_of(messages: list) -> str:
    """The text of the answer's notice (why it failed), or ""."""
    for m in reversed(messages):
        if m.get("role") == "user":
            break
        if (m.get("metadata") or {}).get("title"):
            return f"{m['metadata']['title']}: {_text(m.get('content'))}"
    return ""


def _text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # Gradio 6 sends a message's content as parts: [{"text": ..., "type": "text"}]
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


class Customer:
    """One simulated browser: its session hash and the cookies the server gave it (sent back from then on): the
    app's browser cookie, and the web tier's proxy cookie that keeps it with one web process."""

    def __init__(self, session_hash: str):
        self.session_hash = session_hash
        self.cookies: dict[str, str] = {}

    @property
    def cookie(self) -> str | None:
        return self.cookies.get(BROWSER_COOKIE)

    def headers(self) -> dict[str, str]:
        return {"Cookie": "; ".join(f"{k}={v}" for k, v in self.cookies.items())} if self.cookies else {}

    def keep_cookie(self, response) -> None:
        for name, given in response.cookies.items():
            if given.value:
                self.cookies[name] = given.value


class ChatPageTarget:
    """The chat page's send event, one fresh browser session per request (see the module docstring)."""

    def __init__(self, base_url: str, expect_text: str | None = None):
        self.base_url = base_url.rstrip("/") + "/"
        self.expect_text = expect_text  # the self-check's: every answer rebuilt from its diffs must be this
        self.session = None
        self.page: ChatPage | None = None

    async def open(self) -> None:
        import aiohttp

        # No connection cap: at saturation thousands of customers hold a stream each.
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None, keepalive_timeout=600)
        # No cookie jar: each customer keeps its own browser cookie (Customer), as separate browsers do.
        self.session = aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar(),
                                             timeout=aiohttp.ClientTimeout(total=None, sock_read=600))
        async with self.session.get(self.base_url + CONFIG_PATH) as r:
            if r.status != 200:
                raise ChatPageError(f"GET /config: HTTP {r.status}")
            self.page = find_chat_page(await r.json(loads=_loads))

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    async def send(self, req: BenchRequest, max_tokens: int, timer: Timer) -> Outcome:
        """One customer: the page load, then the question. ``max_tokens`` is the server's setting (the page
        sends none), and the output token count is unknown to the page: 0, with the updates counted."""
        page = self.page
        session_hash = uuid.uuid4().hex[:11]  # as the browser's: 11 characters
        customer = Customer(session_hash)
        timer.sent()
        # The page's config, as a browser fetches it: its answer hands the browser the cookie the server's session
        # claims need (and, behind the web tier, the proxy's cookie that keeps it with one process).
        async with self.session.get(self.base_url + CONFIG_PATH, headers=customer.headers()) as r:
            customer.keep_cookie(r)
            if r.status != 200:
                raise ChatPageError(f"GET /config: HTTP {r.status}")
            await r.read()
        load_inputs = send_inputs(page.load, question="", template="", session_key="")
        if page.load.queued:
            loaded, _ = await self._event(page.load, load_inputs, customer)
        else:
            loaded = await self._predict(page.load, load_inputs, customer)
        outcome = Outcome(0, load_ms=(time.perf_counter() - timer.scheduled) * 1000)
        session_key = loaded[page.session_index]
        data = send_inputs(page.send, question=req.question, template=req.template, session_key=session_key)
        final, streamed = await self._event(page.send, data, customer, timer=timer, outcome=outcome)
        messages = final[page.chatbot_index] or []
        stats = caption_stats(messages)
        if stats is None:
            raise ChatPageError(f"no stats in the answer: {notice_of(messages)[:200] or 'no caption'}")
        outcome.cached_tokens, outcome.prompt_tokens, outcome.engine_ttft_ms = stats
        text = answer_text(messages)
        if answer_text(streamed or []) != text:  # what the updates built is what the page ends with
            raise ChatPageError(f"the streamed updates add up to {answer_text(streamed or [])[:60]!r}, "
                                f"the final answer is {text[:60]!r}")
        if self.expect_text is not None and text != self.expect_text:
            raise ChatPageError(f"the answer is {text[:80]!r}, not {self.expect_text[:80]!r}")
        outcome.text = text
        for event in page.after_send:  # after the answer's end: load on the server, not part of its timing
            data = send_inputs(event, question=req.question, template=req.template, session_key=session_key)
            if event.queued:
                await self._event(event, data, customer)
            else:
                await self._predict(event, data, customer)
        return outcome

    async def _predict(self, event: PageEvent, data: list, customer: Customer) -> list:
        """A non-queued event, as the browser calls it: one POST, its outputs in the answer."""
        body = {"data": data, "event_data": None, "fn_index": event.fn_index, "trigger_id": event.trigger_id,
                "session_hash": customer.session_hash}
        async with self.session.post(self.base_url + PREDICT_PATH, json=body, headers=customer.headers()) as r:
            customer.keep_cookie(r)
            if r.status != 200:
                raise ChatPageError(f"run/predict: HTTP {r.status}: {(await r.text())[:200]}")
            return (await r.json(loads=_loads))["data"]

    async def _event(self, event: PageEvent, data: list, customer: Customer, *, timer: Timer | None = None,
                     outcome: Outcome | None = None) -> tuple[list, list | None]:
        """Join ``event`` and read its stream to the end; returns its final output values and the chatbot value
        its updates built. With ``timer``, marks the first answer text and every update that adds to it."""
        body = {"data": data, "event_data": None, "fn_index": event.fn_index, "trigger_id": event.trigger_id,
                "session_hash": customer.session_hash}
        async with self.session.post(self.base_url + JOIN_PATH, json=body, headers=customer.headers()) as r:
            customer.keep_cookie(r)
            if r.status != 200:
                raise ChatPageError(f"queue/join: HTTP {r.status}: {(await r.text())[:200]}")
        chatbot = self.page.chatbot_index if timer is not None else None
        value, shown, final = None, 0, None
        async with self.session.get(self.base_url + DATA_PATH, params={"session_hash": customer.session_hash},
                                    headers=customer.headers()) as r:
            customer.keep_cookie(r)
            if r.status != 200:
                raise ChatPageError(f"queue/data: HTTP {r.status}")
            async for line in r.content:
                if not line.startswith(b"data:"):
                    continue
                if outcome is not None:
                    outcome.stream_bytes += len(line)
                message = _loads(line[5:])
                kind = message.get("msg")
                if kind == "process_generating" and chatbot is not None:
                    update = message["output"]["data"][chatbot]
                    value = update if value is None else apply_diff(value, update)
                    outcome.updates += 1
                    size = len(answer_text(value))
                    if size > shown:
                        shown = size
                        timer.token()
                elif kind in END_MESSAGES:
                    if kind == "unexpected_error" or not message.get("success", False):
                        output = message.get("output") or {}
                        raise ChatPageError(f"{kind}: {output.get('error') or message.get('message')}"[:300])
                    final = message["output"]["data"]
                elif kind == "close_stream":
                    break
        if final is None:
            raise ChatPageError("the stream closed before the event completed")
        if timer is not None:
            timer.last = time.perf_counter()  # the end is the completed message, as the page sees it
        return final, value
