"""The load generator: sends a workload to a target on a schedule and records what each request saw.

Two schedules: ``arrivals`` (open loop: each request has a scheduled arrival time, Poisson in the
CLI) and ``concurrency`` (closed loop: N users, each sending its next question when its answer ends).

Times are taken from each request's *scheduled* arrival, not from when the client got round to
sending it: a client that falls behind makes TTFT worse, never better, and its lag (send time minus
scheduled time) is recorded per request, next to how late the client's event loop ran. Open-loop
runs have a warm-up: requests scheduled before ``warmup_s`` are sent but not counted; the run ends
when the last counted request finishes, or at the drain deadline, when the counted requests still
running are cut off and recorded as unfinished.

``bench.clients`` runs it in client processes of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.workload import BenchRequest

@dataclass(frozen=True)
class Sample:
    """One request as the client saw it. Times in ms from its scheduled arrival; ``scheduled_s`` is
    that arrival in seconds from the run's start."""

    index: int
    template: str
    scheduled_s: float
    counted: bool  # arrived after the warm-up
    lag_ms: float  # sent this late after its scheduled arrival
    ttft_ms: float | None  # scheduled arrival → first token
    e2e_ms: float | None  # scheduled arrival → last token (None: cut off before its end)
    output_tokens: int
    itl_ms: float | None  # mean gap between tokens after the first
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    replica: str = ""
    error: str | None = None
    finished: bool = True  # False: still running at the drain deadline
    updates: int = 0  # the chat page's streamed updates (it never learns the token count)
    stream_bytes: int = 0
    load_ms: float | None = None  # the chat page's load event, arrival → its end
    engine_ttft_ms: float | None = None  # the engine's own first token, as the answer's caption says

    @property
    def ok(self) -> bool:
        return self.error is None and self.finished

    @property
    def end_s(self) -> float | None:
        return None if self.e2e_ms is None else self.scheduled_s + self.e2e_ms / 1000


@dataclass
class Outcome:
    """What a target learned about an answer besides its timing."""

    output_tokens: int
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    replica: str = ""
    updates: int = 0
    stream_bytes: int = 0
    load_ms: float | None = None
    engine_ttft_ms: float | None = None
    text: str = ""  # the answer as the chat page showed it (kept by no Sample)


@dataclass
class Timer:
    """A request's clock: scheduled arrival, actual send, first and last token (perf_counter seconds)."""

    scheduled: float
    sent_at: float | None = None
    first: float | None = None
    last: float | None = None

    def sent(self) -> None:
        if self.sent_at is None:
            self.sent_at = time.perf_counter()

    def token(self) -> None:
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        self.last = now


@dataclass
class ClientResult:
    """One client process's (or the in-process generator's) samples and its event-loop lag."""

    samples: list[Sample]
    loop_lag_ms: list[float] = field(default_factory=list)


def sample_of(req: BenchRequest, timer: Timer, scheduled_s: float, counted: bool, outcome: Outcome | None, *,
              error: str | None = None, finished: bool = True) -> Sample:
    sent = timer.sent_at if timer.sent_at is not None else time.perf_counter()
    end = timer.last if finished and timer.last is not None else (time.perf_counter() if finished else None)
    tokens = outcome.output_tokens if outcome else 0
    itl = ((timer.last - timer.first) * 1000 / (tokens - 1)
           if timer.first is not None and timer.last is not None and tokens > 1 else None)
    return Sample(
        req.index, req.template, scheduled_s, counted, max(0.0, (sent - timer.scheduled) * 1000),
        (timer.first - timer.scheduled) * 1000 if timer.first is not None else None,
        (end - timer.scheduled) * 1000 if end is not None else None,
        tokens, itl, outcome.prompt_tokens if outcome else None, outcome.cached_tokens if outcome else None,
        outcome.replica if outcome else "", error, finished, outcome.updates if outcome else 0,
        outcome.stream_bytes if outcome else 0, outcome.load_ms if outcome else None,
        outcome.engine_ttft_ms if outcome else None)


async def run_schedule(target, requests: Sequence[BenchRequest], *, max_tokens: int, t0_wall: float,
                       arrivals_s: Sequence[float] | None = None, concurrency: int | None = None,
                       warmup_s: float = 0.0, drain_deadline_s: float | None = None) -> ClientResult:
    """Send ``requests`` to ``target`` open-loop at ``arrivals_s`` or closed-loop with ``concurrency`` users.

    The run starts at wall time ``t0_wall``. Open loop: a request scheduled before ``warmup_s`` is not
    counted; once every counted request has finished, or at ``drain_deadline_s`` (seconds after the
    start), whatever still runs is cancelled: counted ones become unfinished samples, warm-up ones are
    dropped. Every counted request yields one Sample (a failed one carries its error); warm-up requests
    that finished yield one with ``counted`` False, used only to count the answers completed inside
    the window (the achieved throughput), never in a latency statistic.
    """
    lag = LoopLag()
    await asyncio.sleep(max(0.0, t0_wall - time.time()))
    t0 = time.perf_counter() - (time.time() - t0_wall)
    lag.start()
    samples: list[Sample] = []

    async def one(req: BenchRequest, scheduled_s: float, counted: bool) -> None:
        timer = Timer(t0 + scheduled_s)
        outcome: Outcome | None = None
        try:
            outcome = await target.send(req, max_tokens, timer)
        except asyncio.CancelledError:
            if counted:  # a warm-up request still running at the end is simply dropped
                samples.append(sample_of(req, timer, scheduled_s, counted, outcome, finished=False,
                                         error="cut off at the drain deadline"))
            return
        except Exception as exc:  # a failed request is a data point, not the end of the run
            samples.append(sample_of(req, timer, scheduled_s, counted, outcome,
                                     error=f"{type(exc).__name__}: {exc}"[:300]))
            return
        samples.append(sample_of(req, timer, scheduled_s, counted, outcome))

    try:
        if arrivals_s is not None:
            counted_tasks, other_tasks = [], []
            for req, at in zip(requests, arrivals_s):
                delay = t0 + at - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                counted = at >= warmup_s
                task = asyncio.create_task(one(req, at, counted))
                (counted_tasks if counted else other_tasks).append(task)
            if counted_tasks:
                timeout = None if drain_deadline_s is None else max(0.0, t0 + drain_deadline_s - time.perf_counter())
                await asyncio.wait(counted_tasks, timeout=timeout)
            for task in counted_tasks + other_tasks:
                task.cancel()
            await asyncio.gather(*counted_tasks, *other_tasks, return_exceptions=True)
        else:
            pending = list(reversed(requests))

            async def user() -> None:
                while pending:
                    req = pending.pop()
                    await one(req, time.perf_counter() - t0, True)

            users = [asyncio.create_task(user()) for _ in range(max(1, concurrency or 1))]
            timeout = None if drain_deadline_s is None else max(0.0, t0 + drain_deadline_s - time.perf_counter())
            await asyncio.wait(users, timeout=timeout)
            pending.clear()
            for task in users:
                task.cancel()
            await asyncio.gather(*users, return_exceptions=True)
    finally:
        lags = await lag.stop()
    samples.sort(key=lambda s: s.index)
    return ClientResult(samples, lags)


class LoopLag:
    """Measures how late this event loop wakes a 10 ms sleeper while a run is in flight."""

    PERIOD_S = 0.01

    def __init__(self) -> None:
        self.lags_ms: list[float] = []
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._probe())

    async def stop(self) -> list[float]:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        return self.lags_ms

    async def _probe(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(self.PERIOD_S)
            self.lags_ms.append(max(0.0, (time.perf_counter() - before - self.PERIOD_S) * 1000))
