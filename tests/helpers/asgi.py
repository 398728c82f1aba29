"""Coroutines and ASGI apps run from a test's own thread, off any event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor


def run_apart(coro: Coroutine):
    """``coro``'s result, run on a loop of its own in a thread of its own: once a browser test has run, Playwright
    keeps an event loop running in the main thread, where ``asyncio.run`` refuses."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def get(app, path: str, *, method: str = "GET", query: bytes = b"", host: bytes = b"a") -> tuple[int, bytes]:
    """The status and whole body ``app`` answers a request for ``path`` with (no request body)."""
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "query_string": query, "scheme": "http",
             "server": ("127.0.0.1", 80), "headers": [(b"host", host)]}
    run_apart(app(scope, receive, send))
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])
