"""The numbers the console plots and tabulates: cache samples, TTFT of hits and misses, per-template reuse,
and the customers' own hit rate; and what /metrics reads at each scrape (the person queue, ratings, splits).
Only customers' answers are stored (the demo, the A/B and warmups never are), so every number here is the
customers' — unlike vLLM's counters, which count every request."""

from __future__ import annotations

import statistics
from datetime import datetime

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from app.db.models import CacheSample, Conversation, Message, Rating, Template, TemplateVersion
from app.db.rows import HitRate, RatingCount, SampleRow, SplitArm, StoredFigures, TtftSplit
from app.db.states import Handoff


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


def scrape_figures(s: Session, *, now: datetime) -> StoredFigures:
    """The figures /metrics reads from the database, as they stand at ``now``: the person queue (deleted
    conversations included: a person still owes them an answer), stored thumbs per template version, and
    every live split's arms since it began. Three grouped queries, and two more per live split, whatever the
    number of rows."""
    handoffs = dict(s.execute(
        select(Conversation.handoff, func.count(Conversation.id))
        .where(Conversation.handoff.in_((Handoff.WAITING, Handoff.PERSON))).group_by(Conversation.handoff)).all())
    oldest = s.scalar(select(func.min(Conversation.handoff_requested_at))
                      .where(Conversation.handoff == Handoff.WAITING))
    ratings = s.execute(
        select(Template.name, TemplateVersion.number, Rating.thumbs, func.count(Rating.id))
        .join(TemplateVersion, Rating.template_version_id == TemplateVersion.id)
        .join(Template, TemplateVersion.template_id == Template.id)
        .group_by(Template.name, TemplateVersion.number, Rating.thumbs)
        .order_by(Template.name, TemplateVersion.number, Rating.thumbs)).all()
    return StoredFigures(
        person_waiting=int(handoffs.get(Handoff.WAITING, 0)), person_answering=int(handoffs.get(Handoff.PERSON, 0)),
        oldest_wait_s=max(0.0, (now - oldest).total_seconds()) if oldest else 0.0,
        ratings=tuple(RatingCount(name, number, thumbs, n) for name, number, thumbs, n in ratings),
        splits=_split_arms(s))


def _split_arms(s: Session) -> tuple[SplitArm, ...]:
    templates = s.scalars(select(Template).where(Template.candidate_version_id.is_not(None),
                                                 Template.candidate_since.is_not(None),
                                                 Template.deleted_at.is_(None)).order_by(Template.name)).all()
    arms = []
    for t in templates:
        started = dict(s.execute(
            select(Conversation.template_version_id, func.count(Conversation.id))
            .where(Conversation.template_id == t.id, Conversation.created_at >= t.candidate_since)
            .group_by(Conversation.template_version_id)).all())
        number = {v.id: v.number for v in t.versions}
        for version_id, candidate in ((t.published_version_id, False), (t.candidate_version_id, True)):
            if version_id not in number:
                continue
            share = t.candidate_share if candidate else 1.0 - t.candidate_share
            arms.append(SplitArm(t.name, number[version_id], candidate, share, int(started.get(version_id, 0))))
    return tuple(arms)
