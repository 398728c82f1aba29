"""One benchmark run on a running engine: warm what the mode warms, drive a path, read the engine's stats.

``Bench`` holds the engine, the prompt builder and the HTTP servers of one benchmark process, and
``run`` measures one (mode, path, schedule). Everything runs on the engine's event loop; client
paths send from spawned processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from app.bench import loadgen
from app.bench.loadgen import LoopLag, Sample
from app.bench.paths import AppTarget, BenchDesk, RawTarget
from app.bench.report import EngineWindow, RunSummary, percentile, summarize
from app.bench.workload import BenchTemplate, Workload
from app.engine.local import LocalEngine
from app.prompts import PromptBuilder

WARM_QUESTION = "你好"
PROBE_PERIOD_S = 0.05


@dataclass(frozen=True)
class Schedule:
    """Open loop at ``rate_per_s`` (Poisson ``arrivals_s``) or closed loop of ``concurrency`` users."""

    arrivals_s: tuple[float, ...] | None = None
    concurrency: int | None = None
    rate_per_s: float | None = None

    @property
    def label(self) -> str:
        return f"poisson {self.rate_per_s:g}/s" if self.arrivals_s is not None else f"closed {self.concurrency} users"


@dataclass
class EngineProbe:
    """Samples the engine's cache snapshot while a run is in flight."""

    engine: LocalEngine
    kv_block_bytes: int
    blocks_peak: int = 0
    running_peak: int = 0
    waiting_peak: int = 0
    task: asyncio.Task | None = None
    start_queries: int = 0
    start_hits: int = 0
    memory_mib: list[float] = field(default_factory=list)

    def start(self) -> None:
        snap = self.engine.snapshot()
        self.start_queries, self.start_hits = snap.queries, snap.hits
        self.task = asyncio.create_task(self._loop())

    async def stop(self, loop_lag_p99_ms: float | None) -> EngineWindow:
        if self.task:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        self._read()
        snap = self.engine.snapshot()
        return EngineWindow(
            queries=snap.queries - self.start_queries, hits=snap.hits - self.start_hits,
            kv_blocks_peak=self.blocks_peak, kv_used_mib_peak=self.blocks_peak * self.kv_block_bytes / 2**20,
            running_peak=self.running_peak, waiting_peak=self.waiting_peak,
            memory_mib=max(self.memory_mib, default=0.0), loop_lag_p99_ms=loop_lag_p99_ms,
        )

    async def _loop(self) -> None:
        next_memory = 0.0
        while True:
            self._read()
            if time.monotonic() >= next_memory:  # memory reads cost a few ms: once a second
                self.memory_mib.append(await asyncio.to_thread(memory_mib, self.engine.info.device))
                next_memory = time.monotonic() + 1.0
            await asyncio.sleep(PROBE_PERIOD_S)

    def _read(self) -> None:
        snap = self.engine.snapshot()
        self.blocks_peak = max(self.blocks_peak, round(snap.kv_cache_usage * snap.num_blocks))
        self.running_peak = max(self.running_peak, snap.running)
        self.waiting_peak = max(self.waiting_peak, snap.waiting)


def memory_mib(device: str) -> float:
    """The GPU's used memory (nvidia-smi) on CUDA; this process tree's resident memory on CPU."""
    if device == "cuda":
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=5).stdout
            return float(out.split()[0])
        except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
            return 0.0
    import psutil

    me = psutil.Process()
    total = me.memory_info().rss
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total += child.memory_info().rss
    return total / 2**20


class Bench:
    """The benchmark's side of one engine: warming, running paths, and the HTTP servers."""

    def __init__(self, engine: LocalEngine, prompts: PromptBuilder, *, kv_block_bytes: int, ignore_eos: bool = True):
        self.engine, self.prompts = engine, prompts
        self.kv_block_bytes, self.ignore_eos = kv_block_bytes, ignore_eos
        self.desk = BenchDesk(prompts, engine, ())
        self.http_url: str | None = None
        self._servers: list[tuple[object, asyncio.Task]] = []

    async def warm(self, templates: Sequence[BenchTemplate]) -> None:
        """Compute each template's prefix once (one 1-token answer each), so later requests hit it."""
        for t in templates:
            prompt = self.prompts.build(t.system, [], WARM_QUESTION)
            async with contextlib.aclosing(self.engine.stream(prompt.token_ids, max_tokens=1)) as stream:
                async for _ in stream:
                    pass

    async def keep_warm(self, templates: Sequence[BenchTemplate], interval_s: float) -> None:
        """Re-warm ``templates`` every ``interval_s`` so LRU eviction leaves them alone (until cancelled)."""
        while True:
            await asyncio.sleep(interval_s)
            await self.warm(templates)

    def raw_token_ids(self, workload: Workload) -> dict[int, list[int]]:
        """Each request's prompt as a plain vLLM user would build it: the model's chat template, at once."""
        tok = self.prompts.tokenizer
        out = {}
        for r in workload.requests:
            messages = [{"role": "system", "content": workload.template(r.template).system},
                        {"role": "user", "content": r.question}]
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            out[r.index] = list(tok(text, add_special_tokens=False).input_ids)
        return out

    async def run(self, path: str, workload: Workload, schedule: Schedule, *, max_tokens: int,
                  client_procs: int = 1, keep_warm_interval_s: float = 1.0, client_target: dict | None = None,
                  reset_cache: bool = True) -> tuple[RunSummary, list[Sample]]:
        """Measure ``path`` on ``workload``: reset the cache, warm, run the schedule, summarize."""
        if reset_cache:
            await self.engine.reset_prefix_cache()
        warm = [workload.template(n) for n in workload.warm_first]
        await self.warm(warm)
        keeper = None
        if workload.keep_warm:
            keeper = asyncio.create_task(self.keep_warm([workload.template(n) for n in workload.keep_warm],
                                                        keep_warm_interval_s))
        self.desk.published = workload.templates
        probe = EngineProbe(self.engine, self.kv_block_bytes)
        lag = LoopLag()
        probe.start()
        lag.start()
        try:
            if path in ("raw", "app"):
                target = (RawTarget(self.engine, self.raw_token_ids(workload), self.ignore_eos) if path == "raw"
                          else AppTarget(self.engine, self.prompts, workload.templates, self.ignore_eos))
                t0 = time.time() + 0.2
                samples = await loadgen.run_schedule(target, workload.requests, max_tokens=max_tokens, t0_wall=t0,
                                                     arrivals_s=schedule.arrivals_s, concurrency=schedule.concurrency)
            else:
                if client_target is None:
                    raise ValueError(f"path {path!r} needs a client target")
                _, samples = await loadgen.run_in_client_processes(
                    client_target, workload.requests, max_tokens=max_tokens, procs=client_procs,
                    arrivals_s=schedule.arrivals_s, concurrency=schedule.concurrency)
        finally:
            if keeper:
                keeper.cancel()
                await asyncio.gather(keeper, return_exceptions=True)
            lags = await lag.stop()
        window = await probe.stop(percentile(lags, 99) if lags else None)
        summary = summarize(samples, path=path, mode=workload.mode, schedule=schedule.label,
                            offered_req_per_s=schedule.rate_per_s, window=window)
        return summary, samples

    async def serve_http(self, app, port: int) -> str:
        """Serve ``app`` with uvicorn on this loop at 127.0.0.1:``port``; returns its base URL."""
        import uvicorn

        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on",
                                timeout_keep_alive=600, backlog=4096)
        server = uvicorn.Server(config)
        server.install_signal_handlers = lambda: None  # older uvicorn; newer ones ask nothing of signals here
        task = asyncio.create_task(server.serve())
        deadline = time.monotonic() + 30
        while not server.started:
            if task.done():
                task.result()
            if time.monotonic() > deadline:
                raise RuntimeError(f"the benchmark's HTTP server did not start on port {port} in 30 s")
            await asyncio.sleep(0.05)
        self._servers.append((server, task))
        return f"http://127.0.0.1:{port}"

    async def close(self) -> None:
        for server, task in self._servers:
            server.should_exit = True
            await asyncio.gather(task, return_exceptions=True)
        self._servers.clear()


def openai_app(desk: BenchDesk):
    """A FastAPI app with only the OpenAI-compatible routes (no UI imports: fits the GPU machine)."""
    from fastapi import FastAPI

    from app.openai_api import build_openai_router

    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    app.include_router(build_openai_router(desk))
    return app


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
