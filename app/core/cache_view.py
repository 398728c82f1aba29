"""The numbers behind the console's cache page, free of any UI.

``read_cache_view`` gathers one reading: the KV cache's blocks, each in one state — held by running
requests, evictable (cached, held by none) or empty — so they add up to the total; the customers'
hit rate, from their stored answers (the demo, the A/B and warmups are never stored), beside vLLM's
own, which counts every request; prompt tokens by source, preemptions and waiting reasons where
the installed vLLM reports them; the time to first token of cache hits and misses; and memory.
``template_residency`` breaks residency down per template version. Database reads and process
probes run off the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass
from datetime import datetime, timedelta

from app.core.catalog import TemplateCatalog
from app.db import Database
from app.db import metrics as db_metrics
from app.db.models import utcnow
from app.db.rows import HitRate, SampleRow, TtftSplit
from app.engine import BlockCounts, Engine, EvictionSample, KVEventStats, PromptTokenSources, WaitingReasons

TTFT_WINDOW_S = 300.0  # answers whose time to first token the hit/miss medians are taken over
RECENT_S = 60.0  # the customers' "last minute", as vLLM's recent hit rate
HOUR_S = 3600.0


@dataclass(frozen=True)
class MemoryReading:
    device: str  # "cpu" or "cuda"
    kv_cache_bytes: int
    rss_bytes: int  # this process and its children (the engine core runs in one)
    gpu_total_bytes: int | None  # None on CPU, or when NVML is not available
    gpu_used_bytes: int | None


@dataclass(frozen=True)
class CacheView:
    """One reading of the cache, as the console shows it."""

    t: datetime
    num_blocks: int  # vLLM's KV-cache blocks, the null block included
    block_size: int
    blocks_used: int  # held by running requests (vLLM's kv_cache_usage × usable blocks)
    blocks: BlockCounts | None  # held + evictable + empty; None when KV-cache events are off
    kv_cache_usage: float  # 0-1, vLLM's kv_cache_usage
    customers_recent: HitRate  # the customers' answers of the last RECENT_S
    customers_hour: HitRate  # and of the last hour
    queries: int  # vLLM: prompt tokens looked up since start, every request (warmups, demo, A/B)
    hits: int
    hit_rate: float  # vLLM: hits / queries since start
    recent_hit_rate: float  # vLLM: the same over its stats of the last minute
    running: int
    waiting: int
    waiting_by_reason: WaitingReasons | None  # None: this vLLM does not report reasons
    preemptions: int | None  # since start; None: not reported
    prompt_tokens: PromptTokenSources | None  # since start; None: not reported
    evictions: EvictionSample | None  # None unless PREFIXDESK_KV_CACHE_METRICS is on
    ttft: TtftSplit  # answers of the last TTFT_WINDOW_S
    memory: MemoryReading
    kv_events: KVEventStats | None  # None when KV-cache events are off

    @property
    def blocks_cached(self) -> int:
        """Blocks in the prefix cache, held or not (0 when KV-cache events are off)."""
        return self.blocks.cached if self.blocks else 0


@dataclass(frozen=True)
class TemplateResidency:
    name: str
    version: int
    candidate: bool  # the candidate of a live split (else the published version)
    parent: str
    pinned: bool
    internal: bool
    prefix_tokens: int
    num_blocks: int  # full blocks of the template's prefix
    resident_blocks: int  # of those, in the cache now (leading blocks, as a lookup finds them)


async def read_cache_view(*, engine: Engine, db: Database) -> CacheView:
    """A reading of the cache now; the customers' hit rate and TTFT medians come from the stored answers."""
    snap = engine.snapshot()
    usable = max(snap.num_blocks - 1, 0)  # vLLM keeps one null block out of use
    mirror = engine.residency
    now = utcnow()
    ttft = await db.read(db_metrics.ttft_split, since=now - timedelta(seconds=TTFT_WINDOW_S))
    recent = await db.read(db_metrics.customer_hit_rate, since=now - timedelta(seconds=RECENT_S))
    hour = await db.read(db_metrics.customer_hit_rate, since=now - timedelta(seconds=HOUR_S))
    memory = await asyncio.to_thread(read_memory, device=engine.info.device, kv_cache_bytes=engine.info.kv_cache_bytes)
    return CacheView(
        t=now, num_blocks=snap.num_blocks, block_size=snap.block_size,
        blocks_used=snap.blocks.held if snap.blocks else round(snap.kv_cache_usage * usable), blocks=snap.blocks,
        kv_cache_usage=snap.kv_cache_usage, customers_recent=recent, customers_hour=hour, queries=snap.queries,
        hits=snap.hits, hit_rate=snap.hit_rate, recent_hit_rate=snap.recent_hit_rate, running=snap.running,
        waiting=snap.waiting, waiting_by_reason=snap.waiting_by_reason, preemptions=snap.preemptions,
        prompt_tokens=snap.prompt_tokens, evictions=snap.evictions, ttft=ttft, memory=memory,
        kv_events=mirror.stats() if mirror else None,
    )


def template_residency(*, catalog: TemplateCatalog, engine: Engine) -> list[TemplateResidency]:
    """Each published template's (and live split candidate's) prefix blocks in the cache now, in the
    customers' namespace; empty when KV-cache events are off."""
    mirror = engine.residency
    if mirror is None:
        return []
    result = []
    for entry in catalog.entries():
        t = entry.template
        match = mirror.match(entry.prefix_ids)
        result.append(TemplateResidency(t.name, t.version_number, entry.candidate, t.parent, t.pinned, t.internal,
                                        len(entry.prefix_ids), match.num_blocks, match.resident_blocks))
    return result


def sample_of(view: CacheView) -> SampleRow:
    memory = view.memory.gpu_used_bytes if view.memory.gpu_used_bytes is not None else view.memory.rss_bytes
    return SampleRow(t=view.t, recent_hit_rate=view.recent_hit_rate, kv_cache_usage=view.kv_cache_usage,
                     blocks_used=view.blocks_used, blocks_cached=view.blocks_cached, running=view.running,
                     waiting=view.waiting, ttft_hit_ms=view.ttft.hit_p50_ms, ttft_miss_ms=view.ttft.miss_p50_ms,
                     memory_bytes=memory, customer_hit_rate=view.customers_recent.hit_rate)


def read_memory(*, device: str, kv_cache_bytes: int) -> MemoryReading:
    import psutil

    me = psutil.Process(os.getpid())
    rss = me.memory_info().rss
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            rss += child.memory_info().rss
    total = used = None
    if device == "cuda":
        total, used = _gpu_memory()
    return MemoryReading(device, kv_cache_bytes, rss, total, used)


def _gpu_memory() -> tuple[int | None, int | None]:
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        info = pynvml.nvmlDeviceGetMemoryInfo(handle)
        return int(info.total), int(info.used)
    except Exception:  # no NVML library or no permission: the view shows GPU memory as unknown
        return None, None
