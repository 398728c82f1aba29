"""The scheduler's numbers as the app reads them: ``CacheMonitor`` and vLLM's stat-logger hook.

vLLM marks ``SchedulerStats`` and ``IterationStats`` unstable, so this module is the one place that
reads them. The engine core runs in a child process; vLLM hands each step's stats to the stat
loggers in this process, and ``CacheMonitor`` keeps what the console shows: the scheduler's state,
prefix-cache hits, prompt tokens by source, preemptions, waiting reasons and (with
--kv-cache-metrics) sampled block evictions; ``CacheMonitor.last_progress_at`` keeps when the engine
last finished a step over running requests (the watchdog's clock: a chunk of a long prefill is such a
step, though it hands back no token). What the installed vLLM lacks is found once, from its classes, and
reported as None rather than as zero.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field

from app.engine.types import CacheSnapshot, EvictionSample, PromptTokenSources, WaitingReasons

HIT_RATE_WINDOW_S = 60.0


@dataclass(frozen=True)
class VllmStatsFeatures:
    """Which of the optional numbers the installed vLLM's stats carry."""

    prompt_token_sources: bool  # IterationStats.prompt_token_stats
    preemptions: bool  # IterationStats.num_preempted_reqs
    waiting_reasons: bool  # SchedulerStats.num_skipped_waiting_reqs
    evictions: bool  # SchedulerStats.kv_cache_eviction_events, filled with --kv-cache-metrics


NO_FEATURES = VllmStatsFeatures(False, False, False, False)


@dataclass(frozen=True)
class StepStats:
    """What one engine step reported, in the app's terms (None: not in this step's stats)."""

    running: int | None = None
    waiting_capacity: int = 0
    waiting_deferred: int = 0
    usage: float = 0.0
    queries: int = 0
    hits: int = 0
    reset: bool = False
    computed: int = 0
    local_cache_hit: int = 0
    external_kv_transfer: int = 0
    cached: int = 0
    preempted: int = 0
    evictions: tuple[tuple[float, float], ...] = ()  # (lifetime s, idle s) per sampled evicted block


@dataclass
class CacheMonitor:
    """Running totals and the latest scheduler state, fed after every engine step."""

    features: VllmStatsFeatures = NO_FEATURES
    evictions_enabled: bool = False  # the engine runs with --kv-cache-metrics
    running: int = 0
    waiting_capacity: int = 0
    waiting_deferred: int = 0
    kv_cache_usage: float = 0.0
    queries: int = 0
    hits: int = 0
    resets: int = 0
    max_running_seen: int = 0
    computed: int = 0
    local_cache_hit: int = 0
    external_kv_transfer: int = 0
    cached: int = 0
    preemptions: int = 0
    evicted: int = 0
    lifetime_s: float = 0.0
    idle_s: float = 0.0
    tokens: int = 0  # prompt and output tokens the engine handed back, since start
    steps: int = 0  # engine steps over running requests, since start (chunks of a prefill included)
    last_progress_at: float = field(default_factory=time.monotonic)  # when either last grew (monotonic s)
    window: collections.deque = field(default_factory=collections.deque)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def progressed(self, tokens: int) -> None:
        """An engine step handed back ``tokens`` tokens: the watchdog's sign of life, whoever reads them."""
        if tokens:
            with self.lock:
                self.tokens += tokens
                self.last_progress_at = time.monotonic()

    def stepped(self) -> None:
        """The engine finished a step with requests running: it computed their next tokens, or the next chunk
        of a prompt. A prompt's tokens are handed back only with its first output token, so a long prefill is
        steps like this one and no tokens, and it is progress all the same."""
        with self.lock:
            self.steps += 1
            self.last_progress_at = time.monotonic()

    def record(self, step: StepStats) -> None:
        now = time.monotonic()
        with self.lock:
            if step.running is not None:  # a step with scheduler stats
                self.running, self.kv_cache_usage = step.running, step.usage
                self.waiting_capacity, self.waiting_deferred = step.waiting_capacity, step.waiting_deferred
                self.max_running_seen = max(self.max_running_seen, step.running)
                self.resets += int(step.reset)
            if step.queries:
                self.queries += step.queries
                self.hits += step.hits
                self.window.append((now, step.queries, step.hits))
            self.computed += step.computed
            self.local_cache_hit += step.local_cache_hit
            self.external_kv_transfer += step.external_kv_transfer
            self.cached += step.cached
            self.preemptions += step.preempted
            for lifetime_s, idle_s in step.evictions:
                self.evicted += 1
                self.lifetime_s += lifetime_s
                self.idle_s += idle_s
            while self.window and self.window[0][0] < now - HIT_RATE_WINDOW_S:
                self.window.popleft()

    def snapshot(self, num_blocks: int, block_size: int) -> CacheSnapshot:
        f = self.features
        with self.lock:
            evictions = None
            if f.evictions and self.evictions_enabled:
                n = self.evicted
                evictions = EvictionSample(n, self.lifetime_s / n if n else 0.0, self.idle_s / n if n else 0.0)
            return CacheSnapshot(
                num_blocks=num_blocks,
                block_size=block_size,
                kv_cache_usage=self.kv_cache_usage,
                running=self.running,
                waiting=self.waiting_capacity + self.waiting_deferred,
                queries=self.queries,
                hits=self.hits,
                recent_queries=sum(q for _, q, _ in self.window),
                recent_hits=sum(h for _, _, h in self.window),
                resets=self.resets,
                max_running_seen=self.max_running_seen,
                prompt_tokens=PromptTokenSources(self.computed, self.local_cache_hit, self.external_kv_transfer,
                                                 self.cached) if f.prompt_token_sources else None,
                preemptions=self.preemptions if f.preemptions else None,
                waiting_by_reason=WaitingReasons(self.waiting_capacity, self.waiting_deferred)
                if f.waiting_reasons else None,
                evictions=evictions,
                num_engine_tokens=self.tokens,
            )

    def reset_max_running_seen(self) -> None:
        with self.lock:
            self.max_running_seen = 0


def vllm_stats_features() -> VllmStatsFeatures:
    """What the installed vLLM's SchedulerStats and IterationStats carry (read from the classes)."""
    from vllm.v1.metrics.stats import IterationStats, SchedulerStats

    scheduler, iteration = SchedulerStats(), IterationStats()
    return VllmStatsFeatures(
        prompt_token_sources=hasattr(iteration, "prompt_token_stats"),
        preemptions=hasattr(iteration, "num_preempted_reqs"),
        waiting_reasons=hasattr(scheduler, "num_skipped_waiting_reqs"),
        evictions=hasattr(scheduler, "kv_cache_eviction_events"),
    )


def step_stats(scheduler_stats, iteration_stats) -> StepStats:
    """One step's vLLM stats (either may be None) as a StepStats; absent attributes read as 0."""
    values: dict = {}
    if scheduler_stats is not None:
        prefix = scheduler_stats.prefix_cache_stats
        values.update(
            running=scheduler_stats.num_running_reqs,
            waiting_capacity=scheduler_stats.num_waiting_reqs,
            waiting_deferred=getattr(scheduler_stats, "num_skipped_waiting_reqs", 0),
            usage=scheduler_stats.kv_cache_usage, queries=prefix.queries, hits=prefix.hits, reset=prefix.reset,
            evictions=tuple((e.lifetime_seconds, e.idle_seconds)
                            for e in getattr(scheduler_stats, "kv_cache_eviction_events", None) or ()),
        )
    if iteration_stats is not None:
        values["preempted"] = getattr(iteration_stats, "num_preempted_reqs", 0)
        sources = getattr(iteration_stats, "prompt_token_stats", None)
        if sources is not None:
            values.update(computed=sources.computed, local_cache_hit=sources.local_cache_hit,
                          external_kv_transfer=sources.external_kv_transfer, cached=sources.cached_tokens)
    return StepStats(**values)


def stat_logger_factory(monitor: CacheMonitor):
    """A vLLM stat-logger class that feeds ``monitor`` (vLLM instantiates it per engine)."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    monitor.features = vllm_stats_features()

    class _MonitorLogger(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0):
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0, **_):
            # Called for every batch of outputs the engine core sends, whether or not a stream reads them.
            if iteration_stats is not None:
                monitor.progressed(iteration_stats.num_generation_tokens + iteration_stats.num_prompt_tokens)
            # The scheduler's stats come after every step, tokens or none. A step that ends with requests running
            # computed tokens for them: vLLM's scheduler gives running requests its token budget first and
            # preempts one back to waiting when it cannot.
            if scheduler_stats is not None and scheduler_stats.num_running_reqs:
                monitor.stepped()
            if scheduler_stats is not None or iteration_stats is not None:
                monitor.record(step_stats(scheduler_stats, iteration_stats))

        def log_engine_initialized(self):
            pass

    return _MonitorLogger
