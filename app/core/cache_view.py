"""The numbers behind the console's cache page, free of any UI.

``read_cache_view`` gathers one reading: the KV cache's blocks (from the engine's scheduler stats
and the KV-event residency mirror), vLLM's prefix-cache hit rate (cached tokens / queried prompt
tokens), the time to first token of cache hits and misses, and memory. ``template_residency``
breaks residency down per template. Database reads and process probes run off the event loop.
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
from app.db.rows import SampleRow, TtftSplit
from app.engine import Engine, KVEventStats

TTFT_WINDOW_S = 300.0  # answers whose time to first token the hit/miss medians are taken over


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
    blocks_used: int  # held by running requests
    blocks_cached: int  # in the prefix cache (reusable; a running request may hold some of them)
    blocks_free: int  # not held by a request: empty, or cached and evictable
    kv_cache_usage: float  # 0-1, vLLM's kv_cache_usage
    queries: int  # prompt tokens looked up since start
    hits: int
    hit_rate: float  # hits / queries since start
    recent_hit_rate: float  # the same over vLLM stats of the last minute
    running: int
    waiting: int
    ttft: TtftSplit  # answers of the last TTFT_WINDOW_S
    memory: MemoryReading
    kv_events: KVEventStats | None  # None when KV-cache events are off


@dataclass(frozen=True)
class TemplateResidency:
    name: str
    parent: str
    pinned: bool
    internal: bool
    prefix_tokens: int
    num_blocks: int  # full blocks of the template's prefix
    resident_blocks: int  # of those, in the cache now (leading blocks, as a lookup finds them)


async def read_cache_view(*, engine: Engine, db: Database) -> CacheView:
    """A reading of the cache now; the TTFT medians come from the stored answers."""
    snap = engine.snapshot()
    usable = max(snap.num_blocks - 1, 0)  # vLLM keeps one null block out of use
    blocks_used = round(snap.kv_cache_usage * usable)
    mirror = engine.residency
    ttft = await db.read(db_metrics.ttft_split, since=utcnow() - timedelta(seconds=TTFT_WINDOW_S))
    memory = await asyncio.to_thread(read_memory, device=engine.info.device, kv_cache_bytes=engine.info.kv_cache_bytes)
    return CacheView(
        t=utcnow(), num_blocks=snap.num_blocks, block_size=snap.block_size, blocks_used=blocks_used,
        blocks_cached=mirror.num_cached_blocks() if mirror else 0, blocks_free=usable - blocks_used,
        kv_cache_usage=snap.kv_cache_usage, queries=snap.queries, hits=snap.hits, hit_rate=snap.hit_rate,
        recent_hit_rate=snap.recent_hit_rate, running=snap.running, waiting=snap.waiting, ttft=ttft,
        memory=memory, kv_events=mirror.stats() if mirror else None,
    )


def template_residency(*, catalog: TemplateCatalog, engine: Engine) -> list[TemplateResidency]:
    """Each published template's prefix blocks in the cache now (unsalted namespace); empty when
    KV-cache events are off."""
    mirror = engine.residency
    if mirror is None:
        return []
    result = []
    for t in catalog.all():
        prefix = catalog.prefix_ids(t.name)
        match = mirror.match(prefix)
        result.append(TemplateResidency(t.name, t.parent, t.pinned, t.internal, len(prefix), match.num_blocks,
                                        match.resident_blocks))
    return result


def sample_of(view: CacheView) -> SampleRow:
    memory = view.memory.gpu_used_bytes if view.memory.gpu_used_bytes is not None else view.memory.rss_bytes
    return SampleRow(t=view.t, recent_hit_rate=view.recent_hit_rate, kv_cache_usage=view.kv_cache_usage,
                     blocks_used=view.blocks_used, blocks_cached=view.blocks_cached, running=view.running,
                     waiting=view.waiting, ttft_hit_ms=view.ttft.hit_p50_ms, ttft_miss_ms=view.ttft.miss_p50_ms,
                     memory_bytes=memory)


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
