"""An ASGI middleware for ``vllm serve --middleware``: the replica's API key on every route but /health.

vLLM's ``--api-key`` (or ``VLLM_API_KEY``) guards only paths under /v1, /v2, /inference and /cohere
(``GUARDED_PREFIX``, vllm/entrypoints/serve/middleware/authenticate.py). /metrics, /tokenize,
/invocations (which generates as /v1 does) and, with VLLM_SERVER_DEV_MODE, the dev endpoints —
/reset_prefix_cache, /sleep, /collective_rpc (a call into the workers) — answer anyone who reaches the
port. The launcher adds this middleware to every replica: with ``VLLM_API_KEY`` set, each of those
asks for the same Bearer token; /health stays open, since vllm-router checks it without one. Without
a key it changes nothing. It imports nothing of vLLM.
"""

from __future__ import annotations

import hashlib
import hmac
import os

OPEN_PATHS = frozenset({"/health"})
UNAUTHORIZED = b'{"error": "Unauthorized"}'


class ReplicaAuth:
    def __init__(self, app):
        self.app = app
        # Read where vLLM reads it: the middleware runs inside `vllm serve`, started with VLLM_API_KEY.
        key = os.environ.get("VLLM_API_KEY", "")
        self._key_hash = hashlib.sha256(key.encode()).digest() if key else None

    async def __call__(self, scope, receive, send):
        if (self._key_hash is None or scope["type"] not in ("http", "websocket") or scope.get("method") == "OPTIONS"
                or scope.get("path") in OPEN_PATHS or self._authorized(scope)):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(UNAUTHORIZED)).encode())]})
        await send({"type": "http.response.body", "body": UNAUTHORIZED})

    def _authorized(self, scope) -> bool:
        for name, value in scope.get("headers") or []:
            if name == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                return scheme.lower() == "bearer" and hmac.compare_digest(
                    hashlib.sha256(token.encode()).digest(), self._key_hash)
        return False
