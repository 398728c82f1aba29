"""ASGI guards in front of everything the server exposes: body sizes, security headers, no uploads to the
chat, no deep links, and only the Gradio routes the pages use.
"""

from __future__ import annotations

import asyncio
import json
import logging
from urllib.parse import parse_qsl, urlencode

from app.log_text import RateLimitedLog, printable

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
        send = _with_security_headers(send)
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

        await self.app(scope, limited_receive, guarded_send)


class GradioRoutes:
    """Only the Gradio routes the chat and the console use; 404 for the rest (see the module docstring).
    ``unqueued``: per mount ("" the chat, "/admin" the console), the fn_index of each event that runs
    outside the queue, the only ones run/predict may name."""

    def __init__(self, app, *, unqueued: dict[str, frozenset[int]] | None = None,
                 inputs: dict[str, dict[int, int]] | None = None):
        self.app = app
        self.unqueued = unqueued or {}
        self.inputs = inputs or {}  # per mount, each event's number of inputs: a body with fewer is refused here
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
        if local in (CHAT_JOIN, CHAT_PREDICT) and scope.get("method") == "POST":
            body = await _whole_body(receive)
            if body is None:
                return
            mount = CONSOLE if console else ""
            value = await _parsed(body)
            fn_index = _fn_index(value)
            if predict and fn_index not in self.unqueued.get(mount, ()):
                return await self._not_found(scope, send)
            # Gradio fails an event sent fewer values than it has inputs with a 500 and a traceback in the log.
            wanted = self.inputs.get(mount, {}).get(fn_index)
            data = value.get("data") if isinstance(value, dict) else None
            if wanted is not None and not (isinstance(data, list) and len(data) >= wanted):
                return await _reject(send, 400, too_few_values(wanted))
            if not console and _names_a_file(body, value):
                return await _reject(send, 400, NO_FILES)
            receive = _replay(body, receive)
        await self.app(scope, receive, send)

    async def _not_found(self, scope, send) -> None:
        client = (scope.get("client") or ("?",))[0]
        self._refused("refused %s %s from %s: not a route this server serves", scope.get("method", "?"),
                      printable(scope.get("path", "")), client)
        await send({"type": "http.response.start", "status": 404,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(NOT_FOUND)).encode())]})
        await send({"type": "http.response.body", "body": NOT_FOUND})


def too_few_values(wanted: int) -> str:
    return f"This event takes {wanted} values in its data list; send every one of them."


async def _parsed(body: bytes):
    """An event body as JSON (None if it is not): parsed on the loop when small, as the page's are (RequestGuard
    bounds every body), else on a thread."""
    try:
        return json.loads(body) if len(body) < PARSE_ON_THREAD_BYTES else await asyncio.to_thread(json.loads, body)
    except (ValueError, RecursionError):
        return None


def _fn_index(value) -> int | None:
    """The event a body names (its fn_index, an int), or None."""
    index = value.get("fn_index") if isinstance(value, dict) else None
    return index if type(index) is int else None


async def _whole_body(receive) -> bytes | None:
    """The request's body (already bounded by RequestGuard); None when the client went away."""
    chunks = []
    while True:
        event = await receive()
        if event["type"] == "http.disconnect":
            return None
        chunks.append(event.get("body", b""))
        if not event.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive):
    """A ``receive`` that hands the app ``body`` once, then waits on the client as the original does."""
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


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


def _with_security_headers(send):
    async def send_with_headers(event):
        if event["type"] == "http.response.start":
            present = {name.lower() for name, _ in event.get("headers") or []}
            extra = [(name, value) for name, value in SECURITY_HEADERS if name not in present]
            event = {**event, "headers": [*event.get("headers", []), *extra]}
        await send(event)

    return send_with_headers


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
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
