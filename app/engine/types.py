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
    replica: str = ""  # the replica that served it (remote engine), "" in-process


@dataclass(frozen=True)
class Logprobs:
    """The model's log-probabilities for one prompt (``LocalEngine.logprobs``)."""

    prompt: tuple[float, ...]  # of each prompt token after the ones before it (the first has none)
    next_token: dict[int, float]  # the likeliest next tokens, token id -> log-probability


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
