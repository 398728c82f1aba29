"""What the app knows of an engine: its errors, its results and the ``Engine`` protocol.

Every backend (the in-process ``LocalEngine``, the HTTP ``RemoteEngine``) speaks these types, so
nothing above the engine package sees a vLLM object or an HTTP response.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from app.engine.residency import CacheBranch, KVEventStats, ResidencyMatch, ResidencyMirror


# The SamplingParams.extra_args key (vllm_xargs over HTTP) of an answer's pause after each engine step,
# which app.engine.step_delay honours (tests only).
STEP_DELAY_ARG = "prefixdesk_step_delay_ms"
STEP_DELAY_PROCESSOR = "app.engine.step_delay:StepDelay"  # as vLLM's --logits-processors names it


class EngineError(RuntimeError):
    """Generation failed inside the engine; the message is safe to show to a user."""


class EngineBusy(EngineError):
    """More answers are being generated than ``max_concurrent_requests`` allows."""


class EngineRejected(EngineError):
    """The engine refused the request as sent (a bad parameter); retrying the same request fails again."""


class EngineStartError(RuntimeError):
    """The engine could not start with these settings; the message names what to change."""


@dataclass(frozen=True)
class EngineInfo:
    model: str
    is_demo_model: bool
    device: str  # "cpu" or "cuda" in-process; "remote" behind an OpenAI-compatible server
    block_size: int
    num_blocks: int
    kv_cache_bytes: int
    max_model_len: int
    max_num_seqs: int
    max_concurrent_requests: int
    backend: str = "local"  # "local" (in-process AsyncLLM) or "remote" (OpenAI-compatible server)
    precision: str = ""  # what serves, e.g. "bf16 weights · fp8 KV"; "" where the engine cannot tell (remote)


@dataclass(frozen=True)
class Delta:
    """New answer text: from one engine step, or from every step since a slow reader last read (both engines
    merge for a reader that falls behind, as vLLM's own output collector does). ``last``: the answer's
    final text (its ``RequestStats`` follow at once)."""

    text: str
    last: bool = False


@dataclass(frozen=True)
class RequestStats:
    """How one request went, measured in the app's process."""

    prompt_tokens: int
    num_cached_tokens: int
    output_tokens: int
    ttft_ms: float
    decode_tokens_per_s: float
    finish_reason: str  # "stop", "length" or "abort"
    replica: str = ""  # the replica that served it (remote engine), "" in-process
    last_token_s: float = 0.0  # time.perf_counter() in this process when the last token arrived (0: none came)


@dataclass(frozen=True)
class Logprobs:
    """The model's log-probabilities for one prompt (tests/helpers/baichuan.py reads them from vLLM)."""

    prompt: tuple[float, ...]  # of each prompt token after the ones before it (the first has none)
    next_token: dict[int, float]  # the likeliest next tokens, token id -> log-probability


@dataclass(frozen=True)
class BlockCounts:
    """Every usable KV block in exactly one state, so ``usable == empty + evictable + held``.

    vLLM's block pool has no "cached" state of its own: a cached block no request holds sits in the
    free queue (``get_num_free_blocks`` counts it) until a hit takes it back or an allocation evicts
    it. ``held`` comes from vLLM's kv_cache_usage; which held blocks are cached, from matching the
    running requests' sequences in the KV-event mirror.
    """

    usable: int  # num_blocks minus vLLM's null block
    held: int  # reference count above 0: held by running requests
    held_cached: int  # of those, in the prefix cache (the full blocks of their sequences)
    evictable: int  # in the prefix cache and held by no request: reused on a hit, evicted (LRU) for room

    @property
    def empty(self) -> int:
        """Blocks with nothing reusable in them (never filled, or a request's partial last block)."""
        return self.usable - self.held - self.evictable

    @property
    def free(self) -> int:
        """What vLLM counts as free: empty and evictable blocks together."""
        return self.empty + self.evictable

    @property
    def cached(self) -> int:
        """Blocks in the prefix cache, held or not."""
        return self.held_cached + self.evictable


@dataclass(frozen=True)
class PromptTokenSources:
    """Prompt tokens by where their KV came from, as vLLM counts them (vllm:prompt_tokens_by_source)."""

    computed: int  # "local_compute": prefilled by the engine
    local_cache_hit: int  # from the engine's own prefix cache
    external_kv_transfer: int  # from a KV connector (another instance, an offload tier)
    cached: int  # vllm:prompt_tokens_cached: local cache hits and external transfers together

    @property
    def total(self) -> int:
        return self.computed + self.local_cache_hit + self.external_kv_transfer


@dataclass(frozen=True)
class WaitingReasons:
    """Waiting requests by why they wait (vllm:num_requests_waiting_by_reason)."""

    capacity: int  # no room yet in the batch or the KV cache
    deferred: int  # held back by a transient constraint (LoRA budget, KV transfer, a blocked status)


@dataclass(frozen=True)
class EvictionSample:
    """KV blocks vLLM sampled as they were evicted (its --kv-cache-metrics, PREFIXDESK_KV_CACHE_METRICS)."""

    num_blocks: int  # sampled evictions since start
    mean_lifetime_s: float  # allocated to evicted
    mean_idle_s: float  # last used to evicted


@dataclass(frozen=True)
class CacheSnapshot:
    """The prefix cache and scheduler as the last engine step left them.

    The optional numbers are None where the engine cannot tell: ``blocks`` without KV-cache events,
    the others where the installed vLLM does not report them (``evictions`` also while
    PREFIXDESK_KV_CACHE_METRICS is off).
    """

    num_blocks: int
    block_size: int
    kv_cache_usage: float  # 0-1, blocks held by running requests
    running: int
    waiting: int  # vllm:num_requests_waiting: every reason together
    queries: int  # prompt tokens looked up since start (vLLM's "queries")
    hits: int  # of those, tokens found in the cache
    recent_queries: int  # the same over the last HIT_RATE_WINDOW_S seconds
    recent_hits: int
    resets: int
    max_running_seen: int
    blocks: BlockCounts | None = None
    prompt_tokens: PromptTokenSources | None = None  # since start
    preemptions: int | None = None  # since start (vllm:num_preemptions)
    waiting_by_reason: WaitingReasons | None = None
    evictions: EvictionSample | None = None
    # Prompt and output tokens of the engine's steps since start (a prompt's, cached ones included, when its
    # prefill completes): what the watchdog counts as progress. 0 where the engine does not say (remote).
    num_engine_tokens: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0

    @property
    def recent_hit_rate(self) -> float:
        return self.recent_hits / self.recent_queries if self.recent_queries else 0.0


@dataclass(frozen=True)
class Health:
    """Whether the engine answers, and why not."""

    ok: bool
    reason: str = ""  # empty when ok


@dataclass(frozen=True)
class ReplicaView:
    """A replica as of its latest scrape."""

    url: str
    up: bool
    reason: str  # why it is down; "" when up
    running: int
    waiting: int
    kv_cache_usage: float
    queries: int
    hits: int
    requests: int
    generation_tokens: int
    num_blocks: int
    block_size: int
    mirror: ResidencyMirror | None  # its KV-cache events, when it publishes them
    blocks: BlockCounts | None = None  # None without its KV-cache events
    prompt_tokens: PromptTokenSources | None = None  # None: its vLLM exports no vllm:prompt_tokens_by_source
    preemptions: int | None = None
    waiting_by_reason: WaitingReasons | None = None
    evictions: EvictionSample | None = None  # None unless it runs with --kv-cache-metrics

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


class Residency(Protocol):
    """What the cache holds, from KV-cache events: one engine's mirror, or a cluster's mirrors read as one."""

    block_size: int

    def match(self, token_ids: Sequence[int], *, cache_salt: str | None = None) -> ResidencyMatch: ...

    def num_cached_blocks(self) -> int: ...

    def tree(self) -> list[CacheBranch]: ...

    def stats(self) -> KVEventStats: ...

    def wait_quiet(self, quiet_s: float = 0.3, timeout_s: float = 10.0) -> bool: ...

    def clear(self) -> None: ...


class Engine(Protocol):
    """What the app needs from a backend."""

    info: EngineInfo
    residency: Residency | None  # None when KV-cache events are off
    restarts: int

    @property
    def restarting(self) -> bool: ...

    @property
    def in_flight(self) -> int:
        """Answers this process is streaming from the engine now."""
        ...

    def replicas(self) -> tuple[ReplicaView, ...]:
        """The engine's replicas as of their latest scrape; empty for an in-process engine."""
        ...

    def stream(
        self,
        prompt_token_ids: Sequence[int],
        *,
        max_tokens: int,
        cache_salt: str | None = None,
        ignore_eos: bool = False,
        request_id: str | None = None,
        routing_key: str | None = None,
        step_delay_ms: int = 0,  # PREFIXDESK_STEP_DELAY_MS (tests only)
        warmup: bool = False,
    ) -> AsyncIterator[Delta | RequestStats]:
        """The answer as ``Delta``s, then one ``RequestStats``. ``warmup``: the app's own request, kept out of
        the prefix-cache statistics the console shows where the engine can (in-process)."""
        ...

    async def abort_all(self) -> int: ...

    def snapshot(self) -> CacheSnapshot: ...

    async def health(self) -> Health: ...

    async def reset_prefix_cache(self) -> bool: ...

    def shutdown(self) -> None: ...
