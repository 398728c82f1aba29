"""The numbers the console plots and tabulates: cache samples, TTFT of hits and misses, per-template reuse,
and the customers' own hit rate. Only customers' answers are stored (the demo, the A/B and warmups
never are), so every number here is the customers' — unlike vLLM's counters, which count every request."""

from __future__ import annotations

import statistics
from datetime import datetime

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from app.db.models import CacheSample, Message, Template, TemplateVersion
from app.db.rows import HitRate, SampleRow, TtftSplit


def add_sample(s: Session, *, sample: SampleRow) -> None:
    s.add(CacheSample(
        t=sample.t, recent_hit_rate=sample.recent_hit_rate, kv_cache_usage=sample.kv_cache_usage,
        blocks_used=sample.blocks_used, blocks_cached=sample.blocks_cached, running=sample.running,
        waiting=sample.waiting, ttft_hit_ms=sample.ttft_hit_ms, ttft_miss_ms=sample.ttft_miss_ms,
        memory_bytes=sample.memory_bytes, customer_hit_rate=sample.customer_hit_rate,
    ))


def samples_since(s: Session, *, since: datetime) -> list[SampleRow]:
    """Stored readings from ``since`` on, oldest first."""
    rows = s.scalars(select(CacheSample).where(CacheSample.t >= since).order_by(CacheSample.t)).all()
    return [SampleRow(r.t, r.recent_hit_rate, r.kv_cache_usage, r.blocks_used, r.blocks_cached, r.running,
                      r.waiting, r.ttft_hit_ms, r.ttft_miss_ms, r.memory_bytes, r.customer_hit_rate) for r in rows]


def prune_samples(s: Session, *, older_than: datetime) -> int:
    return s.execute(delete(CacheSample).where(CacheSample.t < older_than)).rowcount


def ttft_split(s: Session, *, since: datetime) -> TtftSplit:
    """Median time to first token of answers since ``since`` that reused cached tokens, and of those that did not."""
    rows = s.execute(
        select(Message.ttft_ms, Message.num_cached_tokens)
        .where(Message.role == "assistant", Message.ttft_ms.is_not(None), Message.finished_at >= since)
    ).all()
    hits = [t for t, cached in rows if cached]
    misses = [t for t, cached in rows if not cached]
    return TtftSplit(statistics.median(hits) if hits else None, statistics.median(misses) if misses else None,
                     len(hits), len(misses))


def customer_hit_rate(s: Session, *, since: datetime) -> HitRate:
    """Cached over prompt tokens of the model's answers to customers finished since ``since``."""
    n, prompt, cached = s.execute(
        select(func.count(Message.id), func.sum(Message.prompt_tokens), func.sum(Message.num_cached_tokens))
        .where(Message.role == "assistant", Message.author == "", Message.prompt_tokens.is_not(None),
               Message.finished_at >= since)
    ).one()
    return HitRate(int(n or 0), int(prompt or 0), int(cached or 0))


def template_usage(s: Session) -> dict[str, tuple[int, int, int]]:
    """Per template name, over every stored answer with stats: (answers, prompt tokens, cached prompt tokens)."""
    rows = s.execute(
        select(Template.name, func.count(Message.id), func.sum(Message.prompt_tokens),
               func.sum(Message.num_cached_tokens))
        .join(TemplateVersion, Message.template_version_id == TemplateVersion.id)
        .join(Template, TemplateVersion.template_id == Template.id)
        .where(Message.role == "assistant", Message.prompt_tokens.is_not(None))
        .group_by(Template.name)
    ).all()
    return {name: (n, int(prompt or 0), int(cached or 0)) for name, n, prompt, cached in rows}
