"""ASGI guards in front of everything the server exposes: body sizes, no uploads to the chat, no deep links.

Sizes are checked before any work: a declared ``Content-Length`` over the limit is answered 413 at
once, and a body that grows past it while streaming in is cut off. The chat takes no files, so its
upload route answers 403 whatever is sent; the console's takes template files up to its own limit.
"""

from __future__ import annotations

import json
from urllib.parse import parse_qsl, urlencode

CHAT_UPLOAD = "/gradio_api/upload"
CONSOLE_UPLOAD = "/admin/gradio_api/upload"
MULTIPART_OVERHEAD = 64 << 10
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
            return await _reject(send, 404, "Not found.")
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
    body = json.dumps({"detail": message}, ensure_ascii=False).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
