"""The numbers behind the console's cache tab, free of any UI.

``read_cache_view`` gathers one reading: the KV cache's blocks (from vLLM's scheduler stats and the
KV-event residency mirror), vLLM's prefix-cache hit rate (cached tokens / queried prompt tokens),
the time to first token of cache hits and misses, and memory. ``template_stats`` and
``template_residency`` break them down per template. ``CacheSampler`` stores a reading every
``sample_interval_s`` so the plots survive a restart; ``KeepWarm`` re-sends each pinned template's
prefix so LRU eviction takes other blocks first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import statistics
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, func, select

from app.desk import Desk
from app.engine import Engine, KVEventStats, RequestStats
from app.models import CacheSample, Message, Template, TemplateVersion, utcnow
from app.prompts import system_text
from app.settings import Settings
from app.store import Store

log = logging.getLogger(__name__)

TTFT_WINDOW_S = 300.0  # answers whose time to first token the hit/miss medians are taken over
KEEP_WARM_MESSAGE = "你好"


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
    ttft_hit_p50_ms: float | None  # answers with cached tokens, last TTFT_WINDOW_S
    ttft_miss_p50_ms: float | None
    memory: MemoryReading
    kv_events: KVEventStats | None  # None when KV-cache events are off


@dataclass(frozen=True)
class TtftSplit:
    hit_p50_ms: float | None
    miss_p50_ms: float | None
    num_hits: int
    num_misses: int


@dataclass(frozen=True)
class TemplateCacheStats:
    name: str
    requests: int  # answers with stats
    prompt_tokens: int
    num_cached_tokens: int  # also the prompt tokens the cache saved computing

    @property
    def hit_rate(self) -> float:
        return self.num_cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass(frozen=True)
class TemplateResidency:
    name: str
    parent: str
    pinned: bool
    prefix_tokens: int
    num_blocks: int  # full blocks of the template's prefix
    resident_blocks: int  # of those, in the cache now (leading blocks, as a lookup finds them)


@dataclass(frozen=True)
class SampleRow:
    t: datetime
    hit_rate: float
    kv_cache_usage: float
    blocks_used: int
    blocks_cached: int
    running: int
    waiting: int
    ttft_hit_ms: float | None
    ttft_miss_ms: float | None
    memory_bytes: int


def read_cache_view(*, engine: Engine, store: Store) -> CacheView:
    """A reading of the cache now; the TTFT medians come from the stored answers."""
    snap = engine.snapshot()
    usable = max(snap.num_blocks - 1, 0)  # vLLM keeps one null block out of use
    blocks_used = round(snap.kv_cache_usage * usable)
    mirror = engine.residency
    ttft = ttft_split(store=store)
    return CacheView(
        t=utcnow(), num_blocks=snap.num_blocks, block_size=snap.block_size, blocks_used=blocks_used,
        blocks_cached=mirror.num_cached_blocks() if mirror else 0, blocks_free=usable - blocks_used,
        kv_cache_usage=snap.kv_cache_usage, queries=snap.queries, hits=snap.hits, hit_rate=snap.hit_rate,
        recent_hit_rate=snap.recent_hit_rate, running=snap.running, waiting=snap.waiting,
        ttft_hit_p50_ms=ttft.hit_p50_ms, ttft_miss_p50_ms=ttft.miss_p50_ms,
        memory=read_memory(device=engine.info.device, kv_cache_bytes=engine.info.kv_cache_bytes),
        kv_events=mirror.stats() if mirror else None,
    )


def ttft_split(*, store: Store, window_s: float = TTFT_WINDOW_S) -> TtftSplit:
    """Median time to first token of answers that reused cached tokens, and of those that did not."""
    since = utcnow() - timedelta(seconds=window_s)
    with store.session() as s:
        rows = s.execute(
            select(Message.ttft_ms, Message.num_cached_tokens)
            .where(Message.role == "assistant", Message.ttft_ms.is_not(None), Message.finished_at >= since)
        ).all()
    hits = [t for t, cached in rows if cached]
    misses = [t for t, cached in rows if not cached]
    return TtftSplit(statistics.median(hits) if hits else None, statistics.median(misses) if misses else None,
                     len(hits), len(misses))


def template_stats(*, store: Store) -> list[TemplateCacheStats]:
    """Per template, from every stored answer: requests, prompt tokens and cached prompt tokens."""
    with store.session() as s:
        rows = s.execute(
            select(Template.name, func.count(Message.id), func.sum(Message.prompt_tokens),
                   func.sum(Message.num_cached_tokens))
            .join(TemplateVersion, Message.template_version_id == TemplateVersion.id)
            .join(Template, TemplateVersion.template_id == Template.id)
            .where(Message.role == "assistant", Message.prompt_tokens.is_not(None))
            .group_by(Template.id)
            .order_by(Template.id)
        ).all()
    return [TemplateCacheStats(name, n, int(prompt or 0), int(cached or 0)) for name, n, prompt, cached in rows]


def template_residency(*, desk: Desk, engine: Engine) -> list[TemplateResidency]:
    """Each published template's prefix blocks in the cache now (unsalted namespace).

    Empty when KV-cache events are off.
    """
    mirror = engine.residency
    if mirror is None:
        return []
    result = []
    for t in desk.templates():
        prefix = desk.prefix_ids(t)
        match = mirror.match(prefix)
        result.append(TemplateResidency(t.name, t.parent, t.pinned, len(prefix), match.num_blocks,
                                        match.resident_blocks))
    return result


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


# -- history ---------------------------------------------------------------------------------------


def record_sample(*, store: Store, view: CacheView) -> None:
    memory = view.memory.gpu_used_bytes if view.memory.gpu_used_bytes is not None else view.memory.rss_bytes
    with store.session() as s:
        s.add(CacheSample(
            t=view.t, hit_rate=view.recent_hit_rate, kv_cache_usage=view.kv_cache_usage,
            blocks_used=view.blocks_used, blocks_cached=view.blocks_cached, running=view.running,
            waiting=view.waiting, ttft_hit_ms=view.ttft_hit_p50_ms, ttft_miss_ms=view.ttft_miss_p50_ms,
            memory_bytes=memory,
        ))


def load_samples(*, store: Store, since: datetime) -> list[SampleRow]:
    """Stored readings from ``since`` on, oldest first."""
    with store.session() as s:
        rows = s.scalars(select(CacheSample).where(CacheSample.t >= since).order_by(CacheSample.t)).all()
        return [SampleRow(r.t, r.hit_rate, r.kv_cache_usage, r.blocks_used, r.blocks_cached, r.running,
                          r.waiting, r.ttft_hit_ms, r.ttft_miss_ms, r.memory_bytes) for r in rows]


def prune_samples(*, store: Store, older_than: datetime) -> int:
    with store.session() as s:
        return s.execute(delete(CacheSample).where(CacheSample.t < older_than)).rowcount


class CacheSampler:
    """Writes a reading every ``interval_s``; runs on the server's event loop."""

    def __init__(self, *, engine: Engine, store: Store, interval_s: float, retention_h: int):
        self.engine, self.store = engine, store
        self.interval_s, self.retention_h = interval_s, retention_h
        self.samples = 0

    def sample_once(self) -> CacheView:
        view = read_cache_view(engine=self.engine, store=self.store)
        record_sample(store=self.store, view=view)
        if self.samples % 500 == 0:
            prune_samples(store=self.store, older_than=view.t - timedelta(hours=self.retention_h))
        self.samples += 1
        return view

    async def run(self) -> None:
        while True:
            try:
                # SQLite and psutil block; keep them off the loop the engine streams on.
                await asyncio.to_thread(self.sample_once)
            except Exception:  # a locked database must not end the sampler
                log.exception("cache sample failed")
            await asyncio.sleep(self.interval_s)


class KeepWarm:
    """Keeps pinned templates resident: each tick sends every pinned template's prefix (with a
    one-token answer), which moves its blocks to the young end of vLLM's LRU eviction queue, or
    computes them again if something evicted them."""

    def __init__(self, *, desk: Desk, interval_s: float):
        self.desk = desk
        self.interval_s = interval_s
        self.ticks = 0

    async def tick(self) -> dict[str, RequestStats]:
        """Warm each pinned template once; returns its request's stats by template name."""
        done: dict[str, RequestStats] = {}
        for t in self.desk.templates():
            if not t.pinned:
                continue
            prompt = self.desk.prompts.build(system_text(t.chain), [], KEEP_WARM_MESSAGE)
            async with contextlib.aclosing(self.desk.engine.stream(prompt.token_ids, max_tokens=1)) as stream:
                async for event in stream:
                    if isinstance(event, RequestStats):
                        done[t.name] = event
        self.ticks += 1
        return done

    async def run(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception:  # a busy engine or a bad template must not end the loop
                log.exception("keep-warm tick failed")
            await asyncio.sleep(self.interval_s)


@contextlib.asynccontextmanager
async def cache_background(*, settings: Settings, engine: Engine, store: Store, desk: Desk) -> AsyncIterator[None]:
    """Runs the sampler (and, when ``keep_warm_interval_s`` > 0, the keep-warm loop) while open."""
    tasks = [asyncio.create_task(CacheSampler(engine=engine, store=store, interval_s=settings.sample_interval_s,
                                              retention_h=settings.sample_retention_h).run(), name="cache-sampler")]
    if settings.keep_warm_interval_s > 0:
        tasks.append(asyncio.create_task(KeepWarm(desk=desk, interval_s=settings.keep_warm_interval_s).run(),
                                         name="keep-warm"))
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _gpu_memory() -> tuple[int | None, int | None]:
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        info = pynvml.nvmlDeviceGetMemoryInfo(handle)
        return int(info.total), int(info.used)
    except Exception:  # no NVML library or no permission: the view shows GPU memory as unknown
        return None, None
