"""The load generator: sends a workload to a target on a schedule and records what each request saw.

Two schedules: ``arrivals`` (open loop: each request has a scheduled arrival time, Poisson in the
CLI) and ``concurrency`` (closed loop: N users, each sending its next question when its answer ends).

Times are taken from each request's *scheduled* arrival, not from when the client got round to
sending it: a client that falls behind makes TTFT worse, never better, and its lag (send time minus
scheduled time) is recorded per request, next to how late the client's event loop ran. Open-loop
runs have a warm-up: requests scheduled before ``warmup_s`` are sent but not counted; the run ends
when the last counted request finishes, or at the drain deadline, when the counted requests still
running are cut off and recorded as unfinished.

``run_in_client_processes`` runs the generator in spawned processes (they share nothing with the
server's event loop), each with a slice of the requests; all start at one wall-clock time, set once
every process has imported its code and built its client.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import queue
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field

from app.bench.workload import BenchRequest

START_LEAD_S = 1.0  # between "every client process is ready" and the shared start
CLIENT_READY_TIMEOUT_S = 120.0


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
        outcome.replica if outcome else "", error, finished)


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


@dataclass(frozen=True)
class ClientJob:
    """What one client process runs: a target description, its requests and the shared schedule."""

    target: dict  # keyword arguments of app.bench.paths.make_client_target
    requests: tuple[BenchRequest, ...]
    max_tokens: int
    arrivals_s: tuple[float, ...] | None
    concurrency: int | None
    warmup_s: float
    drain_deadline_s: float | None
    suffix_ids: dict[int, list[int]] | None = None  # per request, for targets sending token ids


def client_main(job: ClientJob, inbox, outbox) -> None:
    """Entry point of a client process: build the client, say ready, wait for the start, run, report."""
    try:
        from app.bench.paths import make_client_target

        async def main() -> ClientResult:
            target = make_client_target(**job.target, suffix_ids=job.suffix_ids)
            try:
                await target.open()
                outbox.put(("ready", None))
                t0_wall = await asyncio.get_running_loop().run_in_executor(None, inbox.get)
                return await run_schedule(target, job.requests, max_tokens=job.max_tokens, t0_wall=t0_wall,
                                          arrivals_s=job.arrivals_s, concurrency=job.concurrency,
                                          warmup_s=job.warmup_s, drain_deadline_s=job.drain_deadline_s)
            finally:
                await target.close()

        outbox.put(("done", run_loop(main())))
    except BaseException:
        outbox.put(("failed", traceback.format_exc()[-3000:]))


def run_loop(coro):
    """Run ``coro`` on uvloop when it is installed, as uvicorn serves the app, else on asyncio's loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


class ClientProcessError(RuntimeError):
    """A client process failed or died; the message holds its traceback or exit code."""


async def run_in_client_processes(target: dict, requests: Sequence[BenchRequest], *, max_tokens: int, procs: int,
                                  arrivals_s: Sequence[float] | None = None, concurrency: int | None = None,
                                  warmup_s: float = 0.0, drain_timeout_s: float | None = None,
                                  suffix_ids: dict[int, list[int]] | None = None) -> tuple[float, list[ClientResult]]:
    """Run the schedule in ``procs`` spawned processes; returns the shared start (wall clock) and each
    process's result.

    Requests are dealt round-robin, keeping their arrival times, so the merged traffic is the
    schedule. The shared start is set once every process is ready; this event loop keeps running
    meanwhile (the in-process HTTP server lives on it). Raises ClientProcessError when one fails.
    """
    procs = max(1, min(procs, len(requests)))
    horizon = (max(arrivals_s) if arrivals_s else 0.0)
    deadline = None if drain_timeout_s is None else horizon + drain_timeout_s
    ctx = multiprocessing.get_context("spawn")
    outbox = ctx.Queue()
    workers = []
    for k in range(procs):
        reqs = tuple(requests[k::procs])
        arr = tuple(arrivals_s[k::procs]) if arrivals_s is not None else None
        conc = None if concurrency is None else max(1, concurrency // procs + (k < concurrency % procs))
        ids = {r.index: suffix_ids[r.index] for r in reqs} if suffix_ids is not None else None
        inbox = ctx.Queue()
        job = ClientJob(target, reqs, max_tokens, arr, conc, warmup_s, deadline, ids)
        p = ctx.Process(target=client_main, args=(job, inbox, outbox), daemon=True, name=f"bench-client-{k}")
        p.start()
        workers.append((p, inbox))
    try:
        ready, results = 0, []
        loop = asyncio.get_running_loop()
        wait_until = time.monotonic() + CLIENT_READY_TIMEOUT_S
        while ready < procs:
            kind, body = await _next(loop, outbox, workers, wait_until, "to start")
            if kind != "ready":
                raise ClientProcessError(f"a client process failed while starting:\n{body}")
            ready += 1
        t0_wall = time.time() + START_LEAD_S
        for _, inbox in workers:
            inbox.put(t0_wall)
        run_limit = horizon + (drain_timeout_s if drain_timeout_s is not None else 3600) + 120
        wait_until = time.monotonic() + START_LEAD_S + run_limit
        while len(results) < procs:
            kind, body = await _next(loop, outbox, workers, wait_until, "to finish")
            if kind != "done":
                raise ClientProcessError(f"a client process failed:\n{body}")
            results.append(body)
        return t0_wall, results
    finally:
        for p, inbox in workers:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
            inbox.close()
            inbox.join_thread()
        outbox.close()
        outbox.join_thread()


async def _next(loop, outbox, workers, wait_until: float, what: str):
    """The next message of any client process; raises ClientProcessError when one died or time ran out."""
    while True:
        try:
            return await loop.run_in_executor(None, outbox.get, True, 0.5)
        except queue.Empty:
            dead = [p for p, _ in workers if p.exitcode not in (None, 0)]
            if dead:
                raise ClientProcessError(f"client process {dead[0].name} exited with {dead[0].exitcode}") from None
            if time.monotonic() > wait_until:
                raise ClientProcessError(f"the client processes took too long {what}") from None


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
