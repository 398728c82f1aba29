"""The chat page and its config, built once and handed to every browser that loads the page.

Gradio builds both afresh for each load: a deep copy of the whole page's config (every component and
event), a walk over it that writes the page's address into each file URL, then the JSON (and, for the
page itself, the HTML around it). On the H200 that was 12% of a web process's CPU at 70 customers a
second, each of whom loads the page once. Neither changes while the server runs, so the answer to a
plain ``GET`` of either is kept, one copy per set of the request's headers that Gradio reads to build
it (the address the browser used, the proxy's forwarded host and scheme, the encodings it accepts),
and sent again as it was. A request with a query string (a theme, a deep link) is Gradio's to answer.

It sits inside the session guard, so each answer still gets its own cookies and security headers
from the layers around it. The kept answers are few and bounded (``KEPT``, oldest dropped first): a
client that varies its Host header costs itself Gradio's work, as before, and no one memory.
"""

from __future__ import annotations

from collections import OrderedDict

KEPT = 16  # sets of headers (in practice one or two: the address the proxy or the browser uses)
# The request headers Gradio reads to build the page's config (its root URL) and to compress the answer.
KEY_HEADERS = (b"host", b"x-forwarded-host", b"x-forwarded-proto", b"accept-encoding")
MAX_KEPT_BYTES = 4 << 20  # a page larger than this is never kept (the chat's is ~100 KiB)


class PageCache:
    """ASGI: a ``GET`` of one of ``paths`` without a query string, answered from the copy kept of Gradio's first
    200 for the same key headers."""

    def __init__(self, app, *, paths: frozenset[str]):
        self.app, self.paths = app, paths
        self.kept: OrderedDict[tuple, tuple[int, list, bytes]] = OrderedDict()

    async def __call__(self, scope, receive, send):
        if (scope["type"] != "http" or scope.get("method") != "GET" or scope.get("path") not in self.paths
                or scope.get("query_string")):
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or ())
        key = (scope["path"], scope.get("scheme"), scope.get("root_path", ""), tuple(scope.get("server") or ()),
               *(headers.get(name) for name in KEY_HEADERS))
        kept = self.kept.get(key)
        if kept is not None:
            self.kept.move_to_end(key)
            status, response_headers, body = kept
            await send({"type": "http.response.start", "status": status, "headers": response_headers})
            await send({"type": "http.response.body", "body": body})
            return
        start: dict = {}
        chunks: list[bytes] = []
        size = 0

        async def keep(message):
            nonlocal size
            if message["type"] == "http.response.start":
                start.update(message)
            elif message["type"] == "http.response.body" and size <= MAX_KEPT_BYTES:  # past it: nothing kept
                chunks.append(message.get("body", b""))
                size += len(chunks[-1])
                if not message.get("more_body", False) and start.get("status") == 200 and size <= MAX_KEPT_BYTES:
                    self._keep(key, start, b"".join(chunks))
            await send(message)

        await self.app(scope, receive, keep)

    def _keep(self, key: tuple, start: dict, body: bytes) -> None:
        headers = list(start.get("headers", ()))
        if any(name.lower() == b"set-cookie" for name, _ in headers):  # an answer for one browser only
            return
        self.kept[key] = (200, headers, body)
        self.kept.move_to_end(key)
        while len(self.kept) > KEPT:
            self.kept.popitem(last=False)
