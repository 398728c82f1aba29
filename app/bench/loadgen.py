"""The load generator: sends a workload to a target on a schedule and records what each request saw.

Two schedules: ``arrivals`` (open loop: each request leaves at its own time, Poisson in the CLI)
and ``concurrency`` (closed loop: N users, each sending its next question when its answer ends).

``run_in_client_processes`` runs the generator in separate processes (spawned, so they share
nothing with the server's event loop), each with a slice of the requests and the same start time,
and returns their samples. In-process paths use ``run_schedule`` directly; ``LoopLag`` measures how
late the shared event loop runs so a reader can tell when that sharing skews the numbers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from app.bench.workload import BenchRequest

CLIENT_START_LEAD_S = 3.0  # time for spawned clients to import and connect before the shared start


@dataclass(frozen=True)
class Sample:
    """One request as the client saw it. Times in ms; ``start_s`` from the run's start."""

    index: int
    template: str
    start_s: float
    end_s: float
    ttft_ms: float | None
    e2e_ms: float
    output_tokens: int
    itl_ms: float | None  # mean gap between tokens after the first
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class Timer:
    """Collects a request's timings while its stream is read."""

    index: int
    template: str
    t0_wall: float
    started_wall: float = field(default_factory=time.time)
    started: float = field(default_factory=time.perf_counter)
    first: float | None = None
    last: float | None = None

    def token(self) -> None:
        now = time.perf_counter()
        self.first = self.first or now
        self.last = now

    def sample(self, output_tokens: int, *, prompt_tokens: int | None = None, cached_tokens: int | None = None,
               error: str | None = None) -> Sample:
        end = time.perf_counter()
        ttft = (self.first - self.started) * 1000 if self.first else None
        itl = ((self.last - self.first) * 1000 / (output_tokens - 1)
               if self.first and self.last and output_tokens > 1 else None)
        start_s = self.started_wall - self.t0_wall
        return Sample(self.index, self.template, start_s, start_s + (end - self.started), ttft,
                      (end - self.started) * 1000, output_tokens, itl, prompt_tokens, cached_tokens, error)


async def run_schedule(target, requests: Sequence[BenchRequest], *, max_tokens: int, t0_wall: float,
                       arrivals_s: Sequence[float] | None = None, concurrency: int | None = None) -> list[Sample]:
    """Send ``requests`` to ``target`` open-loop at ``arrivals_s`` or closed-loop with ``concurrency`` users.

    The run starts at wall time ``t0_wall`` (it waits until then). Every request yields one Sample;
    a failed one carries its error.
    """
    await asyncio.sleep(max(0.0, t0_wall - time.time()))
    t0 = time.perf_counter() - (time.time() - t0_wall)
    samples: list[Sample] = []

    async def one(req: BenchRequest) -> None:
        try:
            samples.append(await target.send(req, max_tokens, t0_wall))
        except Exception as exc:  # a failed request is a data point, not the end of the run
            samples.append(Sample(req.index, req.template, time.time() - t0_wall, time.time() - t0_wall, None, 0.0,
                                  0, None, error=f"{type(exc).__name__}: {exc}"[:300]))

    if arrivals_s is not None:
        tasks = []
        for req, at in zip(requests, arrivals_s):
            delay = t0 + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(req)))
        await asyncio.gather(*tasks)
    else:
        queue = list(reversed(requests))

        async def user() -> None:
            while queue:
                await one(queue.pop())

        await asyncio.gather(*(user() for _ in range(max(1, concurrency or 1))))
    samples.sort(key=lambda s: s.index)
    return samples


@dataclass(frozen=True)
class ClientJob:
    """What one client process runs: a target description, its requests and the shared schedule."""

    target: dict  # keyword arguments of app.bench.paths.make_client_target
    requests: tuple[BenchRequest, ...]
    max_tokens: int
    t0_wall: float
    arrivals_s: tuple[float, ...] | None
    concurrency: int | None


def run_client_job(job: ClientJob) -> list[Sample]:
    """Entry point of a client process."""
    from app.bench.paths import make_client_target

    async def main() -> list[Sample]:
        target = make_client_target(**job.target)
        try:
            return await run_schedule(target, job.requests, max_tokens=job.max_tokens, t0_wall=job.t0_wall,
                                      arrivals_s=job.arrivals_s, concurrency=job.concurrency)
        finally:
            await target.close()

    return run_loop(main())


def run_loop(coro):
    """Run ``coro`` on uvloop when it is installed, as uvicorn serves the app, else on asyncio's loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


async def run_in_client_processes(target: dict, requests: Sequence[BenchRequest], *, max_tokens: int, procs: int,
                                  arrivals_s: Sequence[float] | None = None,
                                  concurrency: int | None = None) -> tuple[float, list[Sample]]:
    """Run the schedule in ``procs`` spawned processes; returns the shared start time and all samples.

    Requests are dealt round-robin, keeping their send times, so the merged traffic is the schedule.
    """
    procs = max(1, min(procs, len(requests)))
    t0_wall = time.time() + CLIENT_START_LEAD_S
    jobs = []
    for k in range(procs):
        reqs = tuple(requests[k::procs])
        arr = tuple(arrivals_s[k::procs]) if arrivals_s is not None else None
        conc = None if concurrency is None else max(1, concurrency // procs + (k < concurrency % procs))
        jobs.append(ClientJob(target, reqs, max_tokens, t0_wall, arr, conc))
    ctx = multiprocessing.get_context("spawn")
    loop = asyncio.get_running_loop()
    with concurrent.futures.ProcessPoolExecutor(max_workers=procs, mp_context=ctx) as pool:
        results = await asyncio.gather(*(loop.run_in_executor(pool, run_client_job, job) for job in jobs))
    samples = sorted((s for part in results for s in part), key=lambda s: s.index)
    return t0_wall, samples


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
            await asyncio.gather(self._task, return_exceptions=True)
        return self.lags_ms

    async def _probe(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(self.PERIOD_S)
            self.lags_ms.append(max(0.0, (time.perf_counter() - before - self.PERIOD_S) * 1000))
