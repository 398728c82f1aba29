"""The load generator in client processes: they share nothing with the server's event loop.

``run_in_client_processes`` runs ``bench.loadgen.run_schedule`` in spawned processes, each with a
slice of the requests and a target built by ``bench.paths.make_client_target``; all start at one
wall-clock time, set once every process has imported its code and built its client.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import queue
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass

from bench.loadgen import ClientResult, run_schedule
from bench.paths import make_client_target
from bench.workload import BenchRequest

START_LEAD_S = 1.0  # between "every client process is ready" and the shared start
CLIENT_READY_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class ClientJob:
    """What one client process runs: a target description, its requests and the shared schedule."""

    target: dict  # keyword arguments of bench.paths.make_client_target
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
                                  suffix_ids: dict[int, list[int]] | None = None,
                                  on_start=None) -> tuple[float, list[ClientResult]]:
    """Run the schedule in ``procs`` spawned processes; returns the shared start (wall clock) and each
    process's result. ``on_start(t0_wall)`` is called once the shared start is set.

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
        if on_start is not None:
            on_start(t0_wall)
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
