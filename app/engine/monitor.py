"""The scheduler's numbers as the app reads them: ``CacheMonitor`` and vLLM's stat-logger hook.

vLLM marks ``SchedulerStats`` and ``IterationStats`` unstable, so this module is the one place that
reads them. The engine core runs in a child process; vLLM hands each step's stats to the stat
loggers in this process, and ``CacheMonitor.record`` keeps what the console shows, and
``CacheMonitor.progressed`` when the engine last computed tokens (the watchdog's clock).
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field

from app.engine.types import CacheSnapshot

HIT_RATE_WINDOW_S = 60.0


@dataclass
class CacheMonitor:
    """Running totals and the latest scheduler state, fed after every engine step."""

    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    queries: int = 0
    hits: int = 0
    resets: int = 0
    max_running_seen: int = 0
    tokens: int = 0  # prompt and output tokens the engine computed, since start
    last_tokens_at: float = field(default_factory=time.monotonic)  # when a step last computed any (monotonic s)
    window: collections.deque = field(default_factory=collections.deque)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def progressed(self, tokens: int) -> None:
        """An engine step computed ``tokens`` tokens: the watchdog's sign of life, whoever reads them."""
        if tokens:
            with self.lock:
                self.tokens += tokens
                self.last_tokens_at = time.monotonic()

    def record(self, *, running: int, waiting: int, usage: float, queries: int, hits: int, reset: bool) -> None:
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
                num_engine_tokens=self.tokens,
            )

    def reset_max_running_seen(self) -> None:
        with self.lock:
            self.max_running_seen = 0


def stat_logger_factory(monitor: CacheMonitor):
    """A vLLM stat-logger class that feeds ``monitor`` (vLLM instantiates it per engine)."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _MonitorLogger(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0):
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0, **_):
            # Called for every batch of outputs the engine core sends, whether or not a stream reads them.
            if iteration_stats is not None:
                monitor.progressed(iteration_stats.num_generation_tokens + iteration_stats.num_prompt_tokens)
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
