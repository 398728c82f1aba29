"""ASGI guards in front of everything the server exposes: body sizes, no uploads to the chat, no deep links,
and only the Gradio routes the pages use, with events whose every field is what Gradio expects.

A refused request is answered with a short JSON body and writes one log line, never a traceback: every
shape Gradio would fail on after it started answering (an fn_index given as "0" or 0.0, event data of
the wrong shape, a stream of a session that never joined an event) is refused here, before it reads it.
The security headers (SECURITY_HEADERS) are written by the server itself on every response
(app/server.py, uvicorn_config): the app's, and those uvicorn writes on its own (a 400 for a
malformed request, a 500, the arrival timeout's 408).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qs, parse_qsl, urlencode

from starlette.requests import ClientDisconnect

from app.log_text import RateLimitedLog, printable
from app.web.bodies import replay, send_whole, whole_body

log = logging.getLogger(__name__)

CHAT_UPLOAD = "/gradio_api/upload"
CONSOLE_UPLOAD = "/admin/gradio_api/upload"
MULTIPART_OVERHEAD = 64 << 10
CONSOLE = "/admin"
GRADIO_API = "/gradio_api/"
CHAT_JOIN = "/gradio_api/queue/join"
CHAT_PREDICT = "/gradio_api/run/predict"
# What the pages request (watched in chromium) and what gradio_client calls (gradio_client/utils.py):
# an event is queued (join), streamed back (data), kept alive (heartbeat), stopped (cancel, reset);
# the client reads the API's description (info); an event the app runs outside the queue (the chat's page load,
# the sidebar after an answer) is one request (run/predict), for those events' fn_index alone: every other event
# runs in the queue, which admits it. The console also uploads and downloads template files.
# app_id: after a lost connection Gradio's page asks it every 2 s and reloads itself once the server answers;
# refused, a page open across a server restart never recovered (its events failed until a manual reload).
PREDICT = "run/predict"
CHAT_ROUTES = frozenset({"queue/join", "queue/data", "cancel", "reset", "info", PREDICT, "app_id"})
CHAT_ROUTE_PREFIXES = ("heartbeat/",)  # heartbeat/<session>
CONSOLE_ROUTES = CHAT_ROUTES | {"upload", "upload_progress"}
CONSOLE_ROUTE_PREFIXES = CHAT_ROUTE_PREFIXES + ("file=",)  # file=<path>
# The file routes outside /gradio_api/ that older Gradio versions served: the chat serves no files.
CHAT_FILE_ROUTES = ("/file=", "/file/")
NOT_FOUND = b'{"detail":"Not Found"}'
NO_FILES = "This chat accepts no files: send your question as text."
PARSE_ON_THREAD_BYTES = 64 << 10  # larger event bodies are parsed off the event loop
QUEUE_DATA = "/gradio_api/queue/data"
# The event data of each trigger whose handler reads it, as gradio/events.py builds its EventData from the JSON
# object the page sends: (keys it must have, keys it may have). Gradio reads the first ones with data[...], so an
# object without one, or no object at all, failed the event with a traceback (and run/predict with a 500).
EVENT_DATA_KEYS = {
    "select": (frozenset({"index", "value"}), frozenset({"row_value", "col_value", "selected"})),  # SelectData
    "example_select": (frozenset({"index", "value"}), frozenset({"row_value", "col_value", "selected"})),
    "like": (frozenset({"index", "value"}), frozenset({"liked"})),  # LikeData
    # EditData; the chatbot's page also sends the edited message as it will show it (_dispatch_value).
    "edit": (frozenset({"index", "value", "previous_value"}), frozenset({"_dispatch_value"})),
}
# Triggers whose page sends no event data (Gradio's components dispatch them without any; a chained event's is
# null): an event of only these takes null. Other triggers (a tab's select, a change) send data of their own
# (objects, values), which a handler that does not read it never sees: Gradio does not read it either.
NO_DATA_TRIGGERS = frozenset({"click", "submit", "input", "focus", "blur", "clear", "load", "tick", "then",
                              "success", "unload"})


@dataclass(frozen=True)
class EventTriggers:
    """What an event's data may be: its triggers' names, and whether its handler reads the event's data."""

    names: frozenset[str]
    reads_data: bool

# Gradio's page runs inline scripts (its config, the `js=` of the chat and of events, which it evaluates
# with `new Function`), and its components set inline styles: script-src and style-src need
# 'unsafe-inline', script-src 'unsafe-eval'. Everything else is this server only: no image, font,
# connection or frame from elsewhere, so markup that slips into a page cannot call out (a remote <img> is a
# beacon); data:/blob: images are Gradio's own (icons, previews). No site may frame a page
# (frame-ancestors, and X-Frame-Options for older browsers): no clickjacking of the console.
CONTENT_SECURITY_POLICY = "; ".join([
    "default-src 'self'", "script-src 'self' 'unsafe-inline' 'unsafe-eval'", "style-src 'self' 'unsafe-inline'",
    "img-src 'self' data: blob:", "font-src 'self' data:", "connect-src 'self'", "media-src 'self' data: blob:",
    "worker-src 'self' blob:", "object-src 'none'", "base-uri 'self'", "form-action 'self'",
    "frame-ancestors 'none'",
])
SECURITY_HEADERS = ((b"x-frame-options", b"DENY"), (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
                    (b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"same-origin"))
DEEP_LINK_ROUTES = ("/gradio_api/deep_link", "/admin/gradio_api/deep_link")


class RequestGuard:
    def __init__(self, app, *, max_request_bytes: int, max_upload_bytes: int):
        self.app = app
        self.max_request_bytes = max_request_bytes
        self.max_upload_bytes = max_upload_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        scope = without_deep_links(scope)
        if scope is None:
            return await _reject(send, 404, "Not Found")  # as GradioRoutes answers every route it does not serve
        path = scope.get("path", "")
        if path.startswith(CHAT_UPLOAD):
            return await _reject(send, 403, "This chat accepts no uploads: send your question as text.")
        upload = path.startswith(CONSOLE_UPLOAD)
        limit = self.max_upload_bytes + MULTIPART_OVERHEAD if upload else self.max_request_bytes
        message = _too_large(limit, "PREFIXDESK_MAX_UPLOAD_MIB" if upload else "PREFIXDESK_MAX_REQUEST_KIB")
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            return await _reject(send, 413, message)
        received, cut, started = 0, False, False

        async def limited_receive():
            nonlocal received, cut
            event = await receive()
            if event["type"] == "http.request" and not cut:
                received += len(event.get("body", b""))
                if received > limit:
                    cut = True
                    if not started:
                        await _reject(send, 413, message)
                    return {"type": "http.disconnect"}
            return event

        async def guarded_send(event):
            nonlocal started
            if cut:
                return  # the 413 is already sent; the app's answer to a cut body is dropped
            if event["type"] == "http.response.start":
                started = True
            await send(event)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except ClientDisconnect:  # the body stopped coming (the client left, the 413 above, the arrival timeout's
            return  # 408): nobody is there to answer, and the route that read it has nothing to log


class GradioRoutes:
    """Only the Gradio routes the chat and the console use; 404 for the rest (see the module docstring).
    ``unqueued``: per mount ("" the chat, "/admin" the console), the fn_index of each event that runs
    outside the queue, the only ones run/predict may name."""

    def __init__(self, app, *, unqueued: dict[str, frozenset[int]] | None = None,
                 inputs: dict[str, dict[int, int]] | None = None,
                 triggers: dict[str, dict[int, EventTriggers]] | None = None,
                 streams: dict[str, Callable[[str], bool]] | None = None):
        """Per mount: ``inputs``, each event's number of inputs (a body with fewer is refused here; an fn_index
        not among them too); ``triggers``, each event's triggers (what its event data may be); ``streams``,
        whether a session hash has joined an event (its queue stream exists)."""
        self.app = app
        self.unqueued = unqueued or {}
        self.inputs = inputs or {}
        self.triggers = triggers or {}
        self.streams = streams or {}
        self._refused = RateLimitedLog(log)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        console = path.startswith(CONSOLE + "/")
        local = path.removeprefix(CONSOLE) if console else path
        if local.startswith(GRADIO_API):
            route = local.removeprefix(GRADIO_API)
            routes, prefixes = (CONSOLE_ROUTES, CONSOLE_ROUTE_PREFIXES) if console else (CHAT_ROUTES,
                                                                                         CHAT_ROUTE_PREFIXES)
            if route not in routes and not route.startswith(prefixes):
                return await self._not_found(scope, send)
        elif not console and local.startswith(CHAT_FILE_ROUTES):
            return await self._not_found(scope, send)
        predict = local == CHAT_PREDICT
        mount = CONSOLE if console else ""
        if local == QUEUE_DATA and scope.get("method") == "GET" and mount in self.streams:
            session_hash = _one_query_value(scope, "session_hash")
            # Gradio answers a session that never joined an event with a 200, then fails its stream (two
            # tracebacks). A hash that is not one (none, two, bad characters) is the session guard's to refuse.
            if session_hash is not None and _plain_hash(session_hash) and not self.streams[mount](session_hash):
                return await self._refuse(scope, send, 404, NO_STREAM, "no event joined in that session")
        if local in (CHAT_JOIN, CHAT_PREDICT) and scope.get("method") == "POST":
            body = await whole_body(receive)
            if body is None:
                return
            value = await _parsed(body)
            if not isinstance(value, dict):
                return await self._refuse(scope, send, 400, NOT_AN_OBJECT, "the body is not a JSON object")
            fn_index = value.get("fn_index")
            events = self.inputs.get(mount, {})
            if type(fn_index) is not int or fn_index not in events:  # "0", 0.0, true: Gradio took them for 0
                if predict:
                    return await self._not_found(scope, send)
                return await self._refuse(scope, send, 400, NO_SUCH_EVENT, f"fn_index {printable(fn_index, 40)}")
            if predict and fn_index not in self.unqueued.get(mount, ()):
                return await self._not_found(scope, send)
            # Gradio fails an event sent fewer values than it has inputs with a 500 and a traceback in the log.
            wanted = events[fn_index]
            data = value.get("data")
            if not (isinstance(data, list) and len(data) >= wanted):
                return await self._refuse(scope, send, 400, too_few_values(wanted),
                                          f"event {fn_index}: too few values")
            triggers = self.triggers.get(mount, {}).get(fn_index, EventTriggers(frozenset(), False))
            if not event_data_fits(value.get("event_data"), triggers):
                return await self._refuse(scope, send, 400, event_data_text(triggers),
                                          f"event {fn_index}: event data of another shape")
            if not console and _names_a_file(body, value):
                return await self._refuse(scope, send, 400, NO_FILES, f"event {fn_index}: a file")
            receive = replay(body, receive)
        await self.app(scope, receive, send)

    async def _refuse(self, scope, send, status: int, message: str, why: str) -> None:
        """Answer ``status`` with ``message``, and one log line (no traceback) saying whom and ``why``."""
        client = (scope.get("client") or ("?",))[0]
        log.warning("refused %s %s from %s with %d: %s", scope.get("method", "?"), printable(scope.get("path", "")),
                    client, status, why)
        await _reject(send, status, message)

    async def _not_found(self, scope, send) -> None:
        client = (scope.get("client") or ("?",))[0]
        self._refused("refused %s %s from %s: not a route this server serves", scope.get("method", "?"),
                      printable(scope.get("path", "")), client)
        await send_whole(send, 404, NOT_FOUND, b"application/json")


NO_STREAM = "This session has no event waiting: join one (queue/join) before reading its stream."
NOT_AN_OBJECT = "The body must be a JSON object with data, fn_index and session_hash."
NO_SUCH_EVENT = "fn_index must be the number (an integer) of one of this page's events, as its config lists them."


def too_few_values(wanted: int) -> str:
    return f"This event takes {wanted} values in its data list; send every one of them."


def event_data_text(triggers: EventTriggers) -> str:
    """What the event data of an event with ``triggers`` must be."""
    if not triggers.reads_data:
        if triggers.names <= NO_DATA_TRIGGERS:
            return "This event takes no event_data: send null."
        return "This event's event_data is not read."  # never refused: any is accepted
    shapes = sorted({" and ".join(sorted(EVENT_DATA_KEYS[t][0])) for t in triggers.names if t in EVENT_DATA_KEYS})
    if not shapes:
        return "This event's event_data must be a JSON object."
    return (f"This event's event_data must be a JSON object with {' or '.join(shapes)} "
            "(and no other keys than Gradio's).")


def event_data_fits(event_data, triggers: EventTriggers) -> bool:
    """Whether ``event_data`` is what an event with ``triggers`` takes: for a handler that reads it, an object of
    the shape one of its triggers' data has in Gradio; for an event whose triggers send none, null; else
    anything (a trigger's data of its own, which neither the handler nor Gradio reads)."""
    if not triggers.reads_data:
        return event_data is None or not triggers.names <= NO_DATA_TRIGGERS
    if not isinstance(event_data, dict):
        return False
    keys = event_data.keys()
    for trigger in triggers.names:
        if trigger not in EVENT_DATA_KEYS:
            return True  # a trigger of a shape this guard does not know: Gradio's to read (an object at least)
        required, optional = EVENT_DATA_KEYS[trigger]
        if required <= keys <= required | optional:  # the values' types are the handler's to check
            return True
    return False


def _one_query_value(scope, name: str) -> str | None:
    values = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True).get(name)
    return values[0] if values and len(values) == 1 else None


def _plain_hash(session_hash: str) -> bool:
    return 0 < len(session_hash) <= 64 and all(c.isascii() and (c.isalnum() or c in "-_") for c in session_hash)


async def _parsed(body: bytes):
    """An event body as JSON (None if it is not): parsed on the loop when small, as the page's are (RequestGuard
    bounds every body), else on a thread."""
    try:
        return json.loads(body) if len(body) < PARSE_ON_THREAD_BYTES else await asyncio.to_thread(json.loads, body)
    except (ValueError, RecursionError):
        return None


def _names_a_file(body: bytes, value) -> bool:
    """Whether an event body (``value``, parsed) holds a file-shaped value (Gradio's FileData: a "path" and
    meta._type "gradio.FileData"), anywhere in it. A body that is not JSON is left to Gradio to refuse."""
    if b"FileData" not in body and b"\\u" not in body:  # the type's name, or JSON escapes that could hide it
        return False
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            meta = item.get("meta")
            if "path" in item and isinstance(meta, dict) and meta.get("_type") == "gradio.FileData":
                return True
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return False


def without_deep_links(scope) -> dict | None:
    """``scope`` without Gradio's deep links, or None for the route that makes one (answer 404).

    A deep link is a snapshot of one session's page that anyone can open as their own: it handed a
    stranger the session key in a BrowserState, and planted one customer's markup in another's page.
    The app uses none: the route is gone, and a page asked for one (``?deep_link=``) is the plain page.
    """
    if scope.get("path", "").rstrip("/") in DEEP_LINK_ROUTES:
        return None
    query = scope.get("query_string", b"")
    if b"deep_link" not in query:
        return scope
    kept = [(k, v) for k, v in parse_qsl(query.decode("latin-1"), keep_blank_values=True) if k != "deep_link"]
    return {**scope, "query_string": urlencode(kept).encode("latin-1")}


def _content_length(scope) -> int | None:
    for key, value in scope.get("headers") or []:
        if key == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _too_large(limit: int, setting: str) -> str:
    return f"The request body is larger than {limit // 1024:,} KiB; send less (the limit is {setting})."


async def _reject(send, status: int, message: str) -> None:
    body = json.dumps({"detail": message}, ensure_ascii=False, separators=(",", ":")).encode()
    await send_whole(send, status, body, b"application/json", (b"connection", b"close"))
