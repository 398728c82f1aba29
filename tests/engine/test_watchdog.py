"""The engine's watchdog watches the engine, not the readers: answers whose readers stop taking them for twice
the stall timeout, while the engine keeps computing them, restart nothing. (A core that stops computing is still
reported down and restarted: tests/web/test_faults.py.)"""

import contextlib
import json
import time
import urllib.request

from app.core.prompts import system_text
from app.engine import Delta, RequestStats
from tests.helpers.servers import SecondServer

STALL_TIMEOUT_S = 2.0
READERS = 3
MAX_TOKENS = 900  # the template's 1,042 tokens + a question + 900 fit the tests' 2,048; seconds of work here


def health(url: str) -> dict:
    try:
        with urllib.request.urlopen(url + "healthz", timeout=5) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return json.loads(exc.read())


@contextlib.contextmanager
def stall_timeout(engine, seconds: float):
    """The session engine with a short stall timeout for the block (it is the engine's, not a server's)."""
    before, engine.stall_timeout_s = engine.stall_timeout_s, seconds
    try:
        yield
    finally:
        engine.stall_timeout_s = before


def test_answers_nobody_reads_for_twice_the_stall_timeout_restart_nothing(services, engine, engine_loop, aio,
                                                                           tmp_path):
    system = system_text(services.catalog.get("电商客服").chain)
    prompts = [services.prompts.build(system, [], f"请详细介绍退货流程，第 {i} 次").token_ids for i in range(READERS)]
    with SecondServer(services, engine_loop, tmp_path) as url, stall_timeout(engine, STALL_TIMEOUT_S):
        restarts, tokens_before = engine.restarts, engine.snapshot().num_engine_tokens
        streams = [engine.stream(p, max_tokens=MAX_TOKENS, ignore_eos=True) for p in prompts]
        firsts = [aio(anext(s)) for s in streams]  # each reader takes the first words, then takes nothing
        assert all(isinstance(e, Delta) for e in firsts)
        seen, computed = set(), []
        paused_until = time.monotonic() + 2 * STALL_TIMEOUT_S
        while time.monotonic() < paused_until:
            h = health(url)
            seen.add((h["ok"], h["restarts"], h["reason"]))
            computed.append(engine.snapshot().num_engine_tokens)
            time.sleep(0.2)
        assert seen == {(True, restarts, "")}
        assert computed[-1] > computed[0]  # the engine went on computing the answers nobody read

        async def rest(stream) -> RequestStats:
            return [e async for e in stream][-1]

        stats = [aio(rest(s)) for s in streams]
        assert [s.output_tokens for s in stats] == [MAX_TOKENS] * READERS  # each answer ran to its end
        assert (engine.restarts, aio(engine.health()).ok) == (restarts, True)
        # What the watchdog counted: every prompt token once and every output token, of exactly these answers.
        assert engine.snapshot().num_engine_tokens - tokens_before == sum(map(len, prompts)) + READERS * MAX_TOKENS
