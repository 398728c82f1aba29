"""``GET /metrics``: the app's own figures in Prometheus' text format, for a scraper that sends
PREFIXDESK_METRICS_TOKEN as a bearer token; not served at all while that setting is empty.

The check comes first and costs no I/O: a missing or wrong token is answered 401 before the database is
read. The figures are then read from the database and formatted on threads, off the event loop that
streams every customer's answer (app/core/metrics.py). With the local engine the reply also carries vLLM's
own ``vllm:`` families from the engine in this process; with the remote engine, scrape each replica.
"""

from __future__ import annotations

import asyncio
import hmac

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from app.core.desk import Desk
from app.db import metrics as db_metrics
from app.db.models import utcnow
from app.engine.vllm_metrics import vllm_exposition
from app.settings import Settings

MAX_AUTHORIZATION_CHARS = 512  # a bearer token of the setting's form is far shorter


def build_metrics_router(settings: Settings, desk: Desk) -> APIRouter:
    """The ``/metrics`` route over ``desk``'s counts and database."""
    router = APIRouter()
    expected = settings.metrics_token.encode()
    with_vllm = settings.engine == "local"

    @router.get("/metrics")
    async def metrics(request: Request) -> Response:
        if not settings.metrics_token:
            return PlainTextResponse("Not Found", status_code=404)
        if not _authorized(request.headers.get("authorization", ""), expected):
            return PlainTextResponse("Unauthorized", status_code=401, headers={"WWW-Authenticate": "Bearer"})
        stored = await desk.db.read(db_metrics.scrape_figures, now=utcnow())
        body = await asyncio.to_thread(desk.metrics.exposition, stored)
        if with_vllm:
            body += await asyncio.to_thread(vllm_exposition)
        return Response(body, media_type=CONTENT_TYPE_LATEST, headers={"Cache-Control": "no-store"})

    return router


def _authorized(header: str, expected: bytes) -> bool:
    """Whether ``header`` is ``Bearer <expected>`` (the scheme in any case), the token compared in constant
    time: an attacker learns nothing from how long a wrong guess takes."""
    if len(header) > MAX_AUTHORIZATION_CHARS or not header.isascii():
        return False
    scheme, _, token = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.encode(), expected)
