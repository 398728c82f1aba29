"""An ASGI middleware for ``vllm serve --middleware``: every response names the replica that sent it.

vllm-router forwards a worker's response headers, but none of them says which worker answered.
The launcher starts each replica with ``--middleware app.cluster.replica_header.ReplicaHeader``,
which adds ``x-prefixdesk-replica: HOST:PORT`` (the address the request reached); the remote
engine turns that into the replica's URL for ``RequestStats.replica``. It imports nothing of vLLM.
"""

from __future__ import annotations

HEADER = b"x-prefixdesk-replica"


class ReplicaHeader:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope.get("server"):
            return await self.app(scope, receive, send)
        host, port = scope["server"][:2]
        value = f"{host}:{port}".encode()

        async def send_with_header(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (HEADER, value)]}
            await send(message)

        return await self.app(scope, receive, send_with_header)
