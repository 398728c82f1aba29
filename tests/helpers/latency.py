"""Whether a server stays responsive during an attack, judged against itself a moment before (a control
window of the same run), never against a fixed number of milliseconds: this machine stalls for seconds at
times, and then everything is slow, the server and the test alike. And, for work that must not run on the
server's event loop, which thread that loop is: a test asks where the work ran, which no load changes."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from dataclasses import dataclass

import httpx

PROBE_INTERVAL_S = 0.05
WARM_UP_S = 0.3
# /healthz in an attack's window may take this many times its control p90, plus STALL_MARGIN_MS. An event loop
# blocked by the work an attack asks for (the faults these tests guard against) made it 0.85-48 s.
STALL_FACTOR = 3
STALL_MARGIN_MS = 100


def p90(values: list[float]) -> float:
    """The nearest-rank 90th percentile."""
    ordered = sorted(values)
    return ordered[math.ceil(0.9 * len(ordered)) - 1]


def loop_thread(loop: asyncio.AbstractEventLoop) -> int:
    """The ident of the thread that runs ``loop`` (the test servers' event loop): work seen running on it
    blocks every request of the server, however idle the machine."""
    return asyncio.run_coroutine_threadsafe(_thread_ident(), loop).result(30)


async def _thread_ident() -> int:
    return threading.get_ident()


@dataclass(frozen=True)
class Probe:
    sent_at: float  # time.monotonic()
    ms: float


class HealthProbe:
    """Asks ``url`` + /healthz every PROBE_INTERVAL_S from a thread of its own, keeping when each probe was sent
    and how long it took. Probes go out on their schedule, not after the one before has come back: a server
    whose event loop is blocked makes every probe sent meanwhile slow, while a stall of the whole machine
    holds the prober too and slows only the few probes in flight, which the 90th percentile passes over.

    Use as ``with HealthProbe(url) as probe:``, ``probe.control()`` to measure the server before the attack,
    ``probe.mark()`` around it, and ``probe.assert_responsive(start, end)`` after the block.
    """

    def __init__(self, url: str):
        self.url = url + "healthz"
        self.sent: list[float] = []  # when each probe left, answered or not yet
        self.probes: list[Probe] = []  # the answered ones
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), name="health-probe")

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @staticmethod
    def mark() -> float:
        return time.monotonic()

    def control(self, duration_s: float = 1.0) -> tuple[float, float]:
        """Wait ``duration_s`` while the probes measure the server at rest; returns the window. It starts once
        the first probes have opened their connections."""
        time.sleep(WARM_UP_S)
        start = self.mark()
        time.sleep(duration_s)
        return start, self.mark()

    def ms_sent_between(self, start: float, end: float) -> list[float]:
        """How long each probe sent in [start, end] took, less the machine's own stall while it was out."""
        return [p.ms - 1000 * self.stalled_s(p.sent_at, p.sent_at + p.ms / 1000) for p in self.probes
                if start <= p.sent_at <= end]

    def assert_responsive(self, control: tuple[float, float], start: float, end: float) -> tuple[float, float]:
        """/healthz's p90 over the probes sent in [start, end] is within STALL_FACTOR x its p90 in ``control``
        + STALL_MARGIN_MS, and every probe answered 200; returns (control p90, attack p90) in ms."""
        assert not self.failures, f"/healthz failed: {self.failures[:3]}"
        before, during = self.ms_sent_between(*control), self.ms_sent_between(start, end)
        assert before and during, (len(before), len(during))
        limit_ms = STALL_FACTOR * p90(before) + STALL_MARGIN_MS
        assert p90(during) <= limit_ms, (f"/healthz p90 {p90(during):.0f} ms during the attack, over {limit_ms:.0f} ms "
                                         f"({STALL_FACTOR} x {p90(before):.0f} ms before it + {STALL_MARGIN_MS}): "
                                         f"{[round(ms) for ms in sorted(during)]}")
        return p90(before), p90(during)

    def stalled_s(self, start: float, end: float) -> float:
        """How long the machine itself stood still within [start, end], as the prober's own schedule saw it: a
        probe sent more than an interval late was held up by the whole machine, not by the server it asks
        (a busy server delays the prober's thread by a few milliseconds at most: Python hands it the GIL
        every 5 ms)."""
        sent = list(self.sent)
        stalled = 0.0
        for a, b in zip(sent, sent[1:]):
            within = min(b, end) - max(a, start)
            late = b - a - PROBE_INTERVAL_S
            if within > 0 and late > PROBE_INTERVAL_S:
                stalled += min(within, late)
        return stalled

    def gaps_ms(self, times: list[float], start: float, end: float) -> list[float]:
        """The gaps between consecutive ``times`` (a stream's chunks arriving, sorted) that overlap [start, end],
        each less the machine's own stall within it: a stream silent all along is one gap from before ``start``
        to after ``end``."""
        first = max([i for i, t in enumerate(times) if t < start], default=0)
        last = min([i for i, t in enumerate(times) if t > end], default=len(times) - 1)
        around = times[first:last + 1]
        return [(b - a - self.stalled_s(a, b)) * 1000 for a, b in zip(around, around[1:])]

    async def _run(self) -> None:
        pending: set[asyncio.Task] = set()
        async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=None)) as client:
            while not self._stop.is_set():
                task = asyncio.create_task(self._one(client))
                pending.add(task)
                task.add_done_callback(pending.discard)
                await asyncio.sleep(PROBE_INTERVAL_S)
            await asyncio.gather(*pending)

    async def _one(self, client: httpx.AsyncClient) -> None:
        sent_at = time.monotonic()
        self.sent.append(sent_at)
        try:
            r = await client.get(self.url)
        except httpx.HTTPError as exc:
            self.failures.append(f"{type(exc).__name__}: {exc}")
            return
        if r.status_code != 200:
            self.failures.append(f"HTTP {r.status_code}")
        self.probes.append(Probe(sent_at, (time.monotonic() - sent_at) * 1000))
