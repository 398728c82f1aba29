"""/healthz says "ready" only once the start-up warm-up has succeeded: a server whose warm-up failed (here the
engine it shares was busy with another server's answer) reports why, never ready, and tries again until one
succeeds."""

import json
import os
import urllib.request

from app.engine import Delta
from app.server import WARMUP_RETRY_S
from tests.helpers.servers import SecondServer
from tests.helpers.waiting import wait_until


def healthz(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url + "healthz", timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_failed_start_up_warm_up_is_never_reported_ready_and_is_tried_again(services, engine, engine_loop, aio,
                                                                             tmp_path):
    info = engine.info
    expected = {"model": info.model, "demo_model": info.is_demo_model, "backend": info.backend,
                "block_size": info.block_size, "num_blocks": info.num_blocks, "precision": info.precision,
                "restarts": engine.restarts, "restarting": False, "process": os.getpid()}  # the server runs in here
    # One answer in flight on an engine that takes one at a time: each warm-up request is told the desk is busy.
    busy = engine.stream(list(range(100, 140)), max_tokens=1500, ignore_eos=True, step_delay_ms=200)
    cap, engine.max_concurrent_requests = engine.max_concurrent_requests, 1
    try:
        assert isinstance(aio(anext(busy)), Delta)
        with SecondServer(services, engine_loop, tmp_path, wait_ready=False) as url:
            seen = {}

            def failed() -> bool:
                seen.update(healthz(url)[1])
                return seen["reason"] != "warming the templates"

            wait_until(failed, 60, lambda: f"the warm-up to fail (last /healthz: {seen})")
            assert healthz(url) == (503, {"ok": False, "ready": False, "reason": (
                f"the start-up warm-up failed (EngineBusy); trying again every {WARMUP_RETRY_S:.0f} s"), **expected})

            engine.max_concurrent_requests = cap
            aio(busy.aclose())  # the engine is free again: the next attempt warms every template
            wait_until(lambda: healthz(url)[0] == 200, 6 * WARMUP_RETRY_S, "the warm-up tried again to succeed")
            assert healthz(url) == (200, {"ok": True, "ready": True, "reason": "", **expected})
    finally:
        engine.max_concurrent_requests = cap
        aio(busy.aclose())
