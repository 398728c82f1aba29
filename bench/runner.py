"""One benchmark run: empty the prefix cache, warm what the mode warms, drive a path on a schedule while
watching the engine (in-process) or the replicas (remote), and summarize.

A ``RunTarget`` is a path made concrete: an in-process target (raw, app) whose load generator runs
on this event loop, or a description from which each client process builds its own HTTP client.
The same target warms the templates first, so a warm prefix sits where the measured requests go
(the family's replica, behind the router).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench import clients, loadgen
from bench.loadgen import ClientResult, LoopLag, Timer
from bench.paths import make_client_target
from bench.report import NO_ENGINE, EngineWindow, RunInfo, RunSummary, percentile, summarize
from bench.workload import BenchRequest, BenchTemplate, Workload

WARM_QUESTION = "你好"
PROBE_PERIOD_S = 0.05
IN_PROCESS_START_S = 0.3
ALIVE_CHECK_S = 1.0


@dataclass(frozen=True)
class Schedule:
    """Poisson arrivals (``arrivals_s``, counted after ``warmup_s``) or a closed loop of ``concurrency`` users."""

    arrivals_s: tuple[float, ...] | None = None
    concurrency: int | None = None
    rate_per_s: float | None = None
    warmup_s: float = 0.0
    window_s: float = 0.0

    @property
    def label(self) -> str:
        return f"poisson {self.rate_per_s:g}/s" if self.arrivals_s is not None else f"closed {self.concurrency} users"

    @property
    def n_warmup(self) -> int:
        return sum(1 for t in self.arrivals_s if t < self.warmup_s) if self.arrivals_s is not None else 0


@dataclass
class RunTarget:
    """A path to drive: ``local`` runs on this loop; ``client`` is built in each client process."""

    path: str
    local: object | None = None  # RawTarget / AppTarget
    client: dict | None = None  # make_client_target keyword arguments
    suffixes: object | None = None  # callable(requests) -> {index: token-id suffix}, for router/replica
    raw_ids: object | None = None  # callable(requests) -> {index: token ids}, for raw


class Backend:
    """What is measured behind the targets: resets its cache and watches it during a run."""

    async def reset(self) -> bool:
        return True

    def watch(self):
        return _NoWatch()


class _NoWatch:
    def start(self) -> None:
        pass

    async def stop(self, t0_wall: float, start_wall: float, end_wall: float):
        return NO_ENGINE, []


class LocalBackend(Backend):
    """The in-process engine: reset through AsyncLLM, watched through its stat logger."""

    def __init__(self, engine, kv_block_bytes: int):
        self.engine, self.kv_block_bytes = engine, kv_block_bytes

    async def reset(self) -> bool:
        return await self.engine.reset_prefix_cache()

    def watch(self):
        return EngineProbe(self.engine, self.kv_block_bytes)


class RemoteBackend(Backend):
    """vllm serve replicas: reset with POST /reset_prefix_cache, watched through their /metrics."""

    def __init__(self, urls: Sequence[str], names: Sequence[str] = (), cascade_dir=None, check_alive=None):
        self.urls, self.names, self.cascade_dir, self.check_alive = list(urls), list(names), cascade_dir, check_alive

    async def reset(self) -> bool:
        from bench.cluster import reset_prefix_caches

        return await reset_prefix_caches(self.urls)

    def watch(self):
        from bench.cluster import ReplicaProbe

        return _ReplicaWatch(ReplicaProbe(self.urls, names=self.names, cascade_dir=self.cascade_dir))


class AppBackend(Backend):
    """``python -m app`` with its own engine, seen from outside: its restarts through /healthz and the running /
    waiting requests of the cache samples it stores (app/core/background.py) in its database. Its cache is
    not reset (that takes an operator's login): its templates stay as its start-up warmed them."""

    def __init__(self, url: str, db_path):
        self.url, self.db_path = url.rstrip("/"), db_path

    async def reset(self) -> bool:
        return True

    def watch(self):
        return _AppWatch(self)


class _AppWatch:
    def __init__(self, backend: AppBackend) -> None:
        self.backend = backend
        self.task: asyncio.Task | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(app_restarts(self.backend.url))

    async def stop(self, t0_wall: float, start_wall: float, end_wall: float):
        before = await self.task
        after = await app_restarts(self.backend.url)
        running = waiting = memory = 0
        if self.backend.db_path is not None:
            running, waiting, memory = await asyncio.to_thread(sample_peaks, self.backend.db_path, start_wall,
                                                               end_wall)
        restarts = after - before if before is not None and after is not None else None
        return EngineWindow(0, 0, 0, 0.0, running, waiting, memory / 2**20, None, restarts=restarts), []


async def app_restarts(url: str) -> int | None:
    """The engine restarts the app's /healthz reports (None: it did not answer)."""
    import httpx

    try:
        async with httpx.AsyncClient(timeout=10) as client:
            return int((await client.get(f"{url}/healthz")).json()["restarts"])
    except (httpx.HTTPError, ValueError, KeyError):
        return None


def sample_peaks(db_path, start_wall: float, end_wall: float) -> tuple[int, int, int]:
    """The most running and waiting requests, and the most memory, of the app's cache samples in the span."""
    import sqlite3
    from datetime import datetime, timezone

    def stamp(t: float) -> str:  # as the app stores them: naive UTC, ISO with a space
        return datetime.fromtimestamp(t, timezone.utc).replace(tzinfo=None).isoformat(sep=" ")

    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=10)
    try:
        row = db.execute("select max(running), max(waiting), max(memory_bytes) from cache_samples "
                         "where t >= ? and t <= ?", (stamp(start_wall), stamp(end_wall))).fetchone()
    finally:
        db.close()
    return tuple(int(x or 0) for x in row)


class _ReplicaWatch:
    def __init__(self, probe) -> None:
        self.probe = probe

    def start(self) -> None:
        self.probe.start()

    async def stop(self, t0_wall: float, start_wall: float, end_wall: float):
        await self.probe.stop()
        return NO_ENGINE, self.probe.window(start_wall, end_wall)


class Bench:
    """Runs paths against one backend (an in-process engine, or replicas)."""

    def __init__(self, backend: Backend, *, max_tokens: int, client_procs: int, drain_timeout_s: float,
                 burst_timeout_s: float, keep_warm_interval_s: float = 1.0, reset_cache: bool = True,
                 warm_copies: int = 1, alive=None):
        self.backend, self.max_tokens, self.client_procs = backend, max_tokens, client_procs
        self.drain_timeout_s, self.burst_timeout_s = drain_timeout_s, burst_timeout_s
        self.keep_warm_interval_s, self.reset_cache = keep_warm_interval_s, reset_cache
        self.warm_copies = warm_copies  # warm requests per template: several when a family has several shards
        self.alive = alive or (lambda: None)  # raises when a server process has died

    async def warm(self, target: RunTarget, templates: Sequence[BenchTemplate]) -> None:
        """1-token answers through ``target`` itself, so each template's prefix is computed where the measured
        requests will go (the family's replica behind the router; with family shards, ``warm_copies`` per
        template, whose random shards reach every shard's replica)."""
        if not templates:
            return
        reqs = [BenchRequest(-1 - i, t.name, WARM_QUESTION, None)
                for i, t in enumerate(t for t in templates for _ in range(self.warm_copies))]
        async with _warm_target(target, reqs) as send:
            for r in reqs:
                await send(r)

    async def run(self, target: RunTarget, workload: Workload, schedule: Schedule, *, policy: str = "",
                  repeat: int = 1, max_tokens: int | None = None, on_start=None) -> RunSummary:
        """Measure ``target`` on ``workload``: reset the cache, warm, run the schedule, summarize.

        ``on_start(t0_wall)`` is called once the run's start (wall clock) is fixed. A server that dies
        mid-run ends the run at once: ``alive`` raises, the run is cancelled and the error goes up."""
        self.alive()
        if self.reset_cache and not await self.backend.reset():
            print("bench: WARNING: the prefix cache could not be reset (replicas without "
                  "VLLM_SERVER_DEV_MODE=1?); this run starts with what earlier runs left", flush=True)
        await self.warm(target, [workload.template(n) for n in workload.warm_first])
        keeper = None
        if workload.keep_warm:
            keeper = asyncio.create_task(self._keep_warm(target, [workload.template(n) for n in workload.keep_warm]))
        watch = self.backend.watch()
        server_lag = LoopLag()
        watch.start()
        server_lag.start()
        max_tokens = max_tokens or self.max_tokens
        open_loop = schedule.arrivals_s is not None
        limit = self.drain_timeout_s if open_loop else self.burst_timeout_s
        try:
            if target.local is not None:
                t0_wall = time.time() + IN_PROCESS_START_S
                horizon = max(schedule.arrivals_s) if open_loop else 0.0
                if target.raw_ids is not None:
                    target.local.token_ids = target.raw_ids(workload.requests)
                if on_start is not None:
                    on_start(t0_wall)
                results = [await self._while_alive(loadgen.run_schedule(
                    target.local, workload.requests, max_tokens=max_tokens, t0_wall=t0_wall,
                    arrivals_s=schedule.arrivals_s, concurrency=schedule.concurrency, warmup_s=schedule.warmup_s,
                    drain_deadline_s=horizon + limit))]
            else:
                suffix_ids = target.suffixes(workload.requests) if target.suffixes is not None else None
                t0_wall, results = await self._while_alive(clients.run_in_client_processes(
                    target.client, workload.requests, max_tokens=max_tokens, procs=self.client_procs,
                    arrivals_s=schedule.arrivals_s, concurrency=schedule.concurrency, warmup_s=schedule.warmup_s,
                    drain_timeout_s=limit, suffix_ids=suffix_ids, on_start=on_start))
        finally:
            if keeper:
                keeper.cancel()
                await asyncio.gather(keeper, return_exceptions=True)
            lags = await server_lag.stop()
        start_wall, end_wall = _window(results, t0_wall, schedule)
        engine, replicas = await watch.stop(t0_wall, start_wall, end_wall)
        if isinstance(self.backend, LocalBackend):  # the engine (and the http path's server) use this loop
            engine = _with_lag(engine, lags)
        info = RunInfo(path=target.path, mode=workload.mode, policy=policy, schedule=schedule.label, repeat=repeat,
                       offered_req_per_s=schedule.rate_per_s, warmup_s=schedule.warmup_s, window_s=schedule.window_s,
                       n_warmup=schedule.n_warmup, client_procs=1 if target.local is not None else self.client_procs)
        deadline = (max(schedule.arrivals_s) + limit) if open_loop else limit
        summary = summarize(results, info, engine=engine, replicas=replicas, drain_deadline_s=deadline)
        self.alive()
        return summary

    async def _while_alive(self, coro):
        """Await ``coro`` while checking every second that the servers live; a death cancels it and raises."""
        task = asyncio.ensure_future(coro)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=ALIVE_CHECK_S)
                if done:
                    return task.result()
                self.alive()
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def _keep_warm(self, target: RunTarget, templates: Sequence[BenchTemplate]) -> None:
        """Re-warm ``templates`` every ``keep_warm_interval_s`` so LRU eviction leaves them alone."""
        while True:
            await asyncio.sleep(self.keep_warm_interval_s)
            with contextlib.suppress(Exception):
                await self.warm(target, templates)


@contextlib.asynccontextmanager
async def _warm_target(target: RunTarget, reqs: Sequence[BenchRequest]):
    """A ``send(request)`` for warm requests through ``target``, on this loop."""
    if target.local is not None:
        local = target.local
        if target.raw_ids is not None:  # raw: the warm requests' token ids, built like the workload's
            local = type(local)(local.engine, target.raw_ids(reqs), local.ignore_eos)

        async def send(r: BenchRequest) -> None:
            await local.send(r, 1, Timer(time.perf_counter()))
        yield send
        return
    suffixes = target.suffixes(reqs) if target.suffixes is not None else None
    client = make_client_target(**target.client, suffix_ids=suffixes)
    await client.open()
    try:
        async def send(r: BenchRequest) -> None:
            await client.send(r, 1, Timer(time.perf_counter()))
        yield send
    finally:
        await client.close()


def _window(results: Sequence[ClientResult], t0_wall: float, schedule: Schedule) -> tuple[float, float]:
    """The wall-clock span a run's engine numbers are read over: the counted window (open loop), or
    first send → last answer (closed)."""
    if schedule.arrivals_s is not None:
        return t0_wall + schedule.warmup_s, t0_wall + schedule.warmup_s + schedule.window_s
    ends = [s.end_s for r in results for s in r.samples if s.end_s is not None]
    return t0_wall, t0_wall + max(ends, default=0.0)


def _with_lag(engine: EngineWindow, lags: list[float]) -> EngineWindow:
    from dataclasses import replace

    return replace(engine, loop_lag_p99_ms=percentile(lags, 99) if lags else None)


@dataclass
class EngineProbe:
    """Samples the in-process engine's cache snapshot while a run is in flight."""

    engine: object
    kv_block_bytes: int
    blocks_peak: int = 0
    running_peak: int = 0
    waiting_peak: int = 0
    task: asyncio.Task | None = None
    start_queries: int = 0
    start_hits: int = 0
    memory: list[float] = field(default_factory=list)

    def start(self) -> None:
        snap = self.engine.snapshot()
        self.start_queries, self.start_hits = snap.queries, snap.hits
        self.task = asyncio.create_task(self._loop())

    async def stop(self, t0_wall: float, start_wall: float, end_wall: float):
        if self.task:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        self._read()
        snap = self.engine.snapshot()
        return EngineWindow(
            queries=snap.queries - self.start_queries, hits=snap.hits - self.start_hits,
            kv_blocks_peak=self.blocks_peak, kv_used_mib_peak=self.blocks_peak * self.kv_block_bytes / 2**20,
            running_peak=self.running_peak, waiting_peak=self.waiting_peak,
            memory_mib=max(self.memory, default=0.0), loop_lag_p99_ms=None,
        ), []

    async def _loop(self) -> None:
        next_memory = 0.0
        while True:
            self._read()
            if time.monotonic() >= next_memory:  # memory reads cost a few ms: once a second
                self.memory.append(await asyncio.to_thread(memory_mib, self.engine.info.device))
                next_memory = time.monotonic() + 1.0
            await asyncio.sleep(PROBE_PERIOD_S)

    def _read(self) -> None:
        snap = self.engine.snapshot()
        self.blocks_peak = max(self.blocks_peak, round(snap.kv_cache_usage * snap.num_blocks))
        self.running_peak = max(self.running_peak, snap.running)
        self.waiting_peak = max(self.waiting_peak, snap.waiting)


def memory_mib(device: str) -> float:
    """This engine's GPU's used memory (nvidia-smi) on CUDA; this process tree's resident memory on CPU."""
    if device == "cuda":
        gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
        try:
            out = subprocess.run(["nvidia-smi", "-i", gpu, "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=5).stdout
            return float(out.split()[0])
        except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
            return 0.0
    try:
        import psutil
    except ImportError:
        return 0.0
    me = psutil.Process()
    total = me.memory_info().rss
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total += child.memory_info().rss
    return total / 2**20


def raw_token_ids(tokenizer, requests: Sequence[BenchRequest], systems: dict[str, str]) -> dict[int, list[int]]:
    """Each request's prompt as a plain vLLM user would build it: the model's chat template, at once."""
    out = {}
    for r in requests:
        messages = [{"role": "system", "content": systems[r.template]}, {"role": "user", "content": r.question}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        out[r.index] = list(tokenizer(text, add_special_tokens=False).input_ids)
    return out


def token_suffixes(prompts, requests: Sequence[BenchRequest], systems: dict[str, str]) -> dict[int, list[int]]:
    """Each request's token ids after its template's prefix, as the app builds them (the prefix is sent
    per template, once per client process). With a chat template that frames each message on its
    own (ChatML) the suffix does not depend on the template, so it is built from one."""
    out = {}
    any_system = next(iter(systems.values()))
    for r in requests:
        system = any_system if prompts.framed else systems[r.template]
        ids = prompts.build(system, [], r.question).token_ids
        out[r.index] = ids[len(prompts.prefix_ids(system)):]
    return out
