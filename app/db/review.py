"""The operator's review of conversations: the list, a transcript, exports, versions judged by their
answers, and the console's options.

Every list is a page (``MAX_PAGE_SIZE`` at most) of one filtered, indexed query; conversations waiting
for a person come first, longest waiting first. Exports stream the selection's messages to a file in
batches (``yield_per``), so a large table is never held in memory. A filter is checked before any
query: its types, sizes and values (``ReviewInputError`` says which is wrong).
"""

from __future__ import annotations

import csv
import json
import statistics
from collections.abc import Iterable
from datetime import datetime
from typing import IO

from sqlalchemy import case, exists, func, select
from sqlalchemy.orm import Session

from app.db import audit
from app.db.conversations import message_row
from app.db.models import Conversation, Message, Option, Rating, Template, TemplateVersion, utcnow
from app.db.rows import PersonQueue, ReviewFilter, ReviewPage, ReviewRow, SplitView, Transcript, VersionStats
from app.db.states import AnswerStatus, Handoff

MAX_PAGE_SIZE = 100
MAX_SEARCH_CHARS = 200
EXPORT_BATCH = 500
RATINGS = ("", "up", "down", "unrated")
ANSWER_STATUSES = (AnswerStatus.OK, AnswerStatus.STOPPED, AnswerStatus.ERROR)
STATUSES = ("", *ANSWER_STATUSES, Handoff.WAITING, Handoff.PERSON)
EXPORT_FORMATS = ("csv", "jsonl")
# The options an operator changes at run time, with their defaults.
OPTIONS = {"hide_transcripts": "no"}
EXPORT_FIELDS = ("conversation_id", "message_id", "template", "version", "tenant", "created_at", "role", "author",
                 "status", "finish_reason", "error", "prompt_tokens", "num_cached_tokens", "ttft_ms",
                 "first_visible_ms", "decode_tokens_per_s", "replica", "rating", "rating_reason", "text")
PRIVATE_FIELDS = ("text", "rating_reason", "error")  # what customers wrote or could read; left out when hidden
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")  # a spreadsheet runs a cell that starts so as a formula


class ReviewInputError(ValueError):
    """A filter, page or export request the review cannot run; the message says what to change."""


def check_filter(f: ReviewFilter) -> ReviewFilter:
    """``f`` with its text trimmed; raises ReviewInputError for a wrong type, size or value."""
    for name in ("text", "template", "rating", "status"):
        if not isinstance(getattr(f, name), str):
            raise ReviewInputError(f"The {name} filter must be text.")
    if f.tenant is not None and not isinstance(f.tenant, str):
        raise ReviewInputError("The tenant filter must be text.")
    if f.version is not None and (type(f.version) is not int or not 0 < f.version < 2**31):
        raise ReviewInputError("The version filter must be a version number (1, 2, …) or empty.")
    if max(len(f.text), len(f.template), len(f.tenant or "")) > MAX_SEARCH_CHARS:
        raise ReviewInputError(f"Search with at most {MAX_SEARCH_CHARS} characters.")
    if f.rating not in RATINGS:
        raise ReviewInputError(f"The rating filter is one of: {', '.join(r or 'any' for r in RATINGS)}.")
    if f.status not in STATUSES:
        raise ReviewInputError(f"The status filter is one of: {', '.join(s or 'any' for s in STATUSES)}.")
    return ReviewFilter(f.text.strip(), f.template.strip(), f.version, f.rating, f.status,
                        None if f.tenant is None else f.tenant.strip())


def search(s: Session, *, filter: ReviewFilter, page: int = 1, page_size: int = 20) -> ReviewPage:
    """One page of the conversations ``filter`` matches: waiting for a person first (longest waiting first),
    then newest first. Raises ReviewInputError."""
    f = check_filter(filter)
    if type(page) is not int or type(page_size) is not int or page < 1 or not 1 <= page_size <= MAX_PAGE_SIZE:
        raise ReviewInputError(f"A page is a number from 1, of 1 to {MAX_PAGE_SIZE} conversations.")
    where = _conditions(f)
    total = s.scalar(select(func.count()).select_from(_base(f).where(*where).subquery()))
    waiting = Conversation.handoff == Handoff.WAITING
    ids = list(s.scalars(
        _base(f).where(*where)
        .order_by(case((waiting, 0), else_=1), case((waiting, Conversation.handoff_requested_at), else_=None),
                  Conversation.id.desc())
        .offset((page - 1) * page_size).limit(page_size)
    ))
    return ReviewPage(tuple(_rows(s, ids)), int(total or 0), page, page_size)


def person_queue(s: Session, *, oldest: int = 10, newest: int = 100) -> PersonQueue:
    """The conversations waiting for a person: their number, the ``oldest`` longest waiting and the ids of the
    ``newest`` to ask. Three queries on the handoff index, whatever the table's size."""
    waiting = Conversation.handoff == Handoff.WAITING
    total = s.scalar(select(func.count()).select_from(Conversation).where(waiting)) or 0
    first = s.execute(select(Conversation.id, Conversation.handoff_requested_at).where(waiting)
                      .order_by(Conversation.handoff_requested_at, Conversation.id).limit(oldest)).all()
    latest = s.scalars(select(Conversation.id).where(waiting)
                       .order_by(Conversation.handoff_requested_at.desc(), Conversation.id.desc()).limit(newest)).all()
    return PersonQueue(int(total), tuple((cid, at) for cid, at in first if at is not None), tuple(latest))


def transcript(s: Session, *, conversation_id: int) -> Transcript | None:
    """The conversation with every message as the customer saw it, each with its stats; None if none."""
    rows = _rows(s, [conversation_id])
    if not rows:
        return None
    messages = s.scalars(select(Message).where(Message.conversation_id == conversation_id,
                                               Message.status != AnswerStatus.REPLACED).order_by(Message.id)).all()
    ratings = {r.message_id: r for r in s.scalars(select(Rating).where(Rating.conversation_id == conversation_id))}
    return Transcript(rows[0], tuple(message_row(m, ratings.get(m.id)) for m in messages))


def export(s: Session, *, filter: ReviewFilter, fmt: str, out: IO[str], include_text: bool) -> int:
    """Write the messages of every conversation ``filter`` matches to ``out`` as CSV or JSONL, oldest first,
    in batches; returns how many rows. Without ``include_text`` what customers wrote or read is left out.
    Cells that a spreadsheet would run as a formula are written with a leading apostrophe."""
    f = check_filter(filter)
    if fmt not in EXPORT_FORMATS:
        raise ReviewInputError(f"Export as {' or '.join(EXPORT_FORMATS)}.")
    fields = [x for x in EXPORT_FIELDS if include_text or x not in PRIVATE_FIELDS]
    matching = _base(f).where(*_conditions(f))
    query = (
        select(Message, Template.name, TemplateVersion.number, Conversation.tenant, Rating.thumbs, Rating.reason)
        .join(Conversation, Message.conversation_id == Conversation.id)
        .join(Template, Conversation.template_id == Template.id)
        .outerjoin(TemplateVersion, Message.template_version_id == TemplateVersion.id)
        .outerjoin(Rating, Rating.message_id == Message.id)
        .where(Message.conversation_id.in_(matching),
               Message.status.not_in((AnswerStatus.REPLACED, AnswerStatus.GENERATING)))
        .order_by(Message.conversation_id, Message.id)
        .execution_options(yield_per=EXPORT_BATCH)
    )
    writer = csv.DictWriter(out, fieldnames=fields, extrasaction="ignore") if fmt == "csv" else None
    if writer is not None:
        writer.writeheader()
    n = 0
    for m, template, version, tenant, thumbs, reason in s.execute(query):
        record = {"conversation_id": m.conversation_id, "message_id": m.id, "template": template, "version": version,
                  "tenant": tenant, "created_at": m.created_at.isoformat(timespec="seconds"), "role": m.role,
                  "author": m.author, "status": m.status, "finish_reason": m.finish_reason, "error": m.error,
                  "prompt_tokens": m.prompt_tokens, "num_cached_tokens": m.num_cached_tokens, "ttft_ms": m.ttft_ms,
                  "first_visible_ms": m.first_visible_ms, "decode_tokens_per_s": m.decode_tokens_per_s,
                  "replica": m.replica, "rating": thumbs, "rating_reason": reason, "text": m.text}
        if writer is not None:
            writer.writerow({k: _cell(record[k]) for k in fields})
        else:
            out.write(json.dumps({k: record[k] for k in fields}, ensure_ascii=False) + "\n")
        n += 1
    return n


def split_view(s: Session, *, template: str) -> SplitView:
    """``template``'s versions judged by their answers, and its live split's two arms since it began.
    Raises LookupError for an unknown template."""
    t = s.scalar(select(Template).where(Template.name == template, Template.deleted_at.is_(None)))
    if t is None:
        raise LookupError(f"There is no template named {template!r}.")
    versions = _version_stats(s, t, since=None)
    arms: tuple[VersionStats, ...] = ()
    if t.candidate_version_id is not None and t.candidate_since is not None:
        by_id = {v.version_id: v for v in _version_stats(s, t, since=t.candidate_since)}
        arms = tuple(by_id[i] for i in (t.published_version_id, t.candidate_version_id) if i in by_id)
    number = {v.id: v.number for v in t.versions}
    return SplitView(template=t.name, published=number.get(t.published_version_id),
                     candidate=number.get(t.candidate_version_id),
                     share=t.candidate_share if t.candidate_version_id else 0.0,
                     since=t.candidate_since if t.candidate_version_id else None,
                     versions=tuple(reversed(versions)), arms=arms)


def tenants(s: Session) -> list[str]:
    """The tenants conversations were held under (an empty name is conversations without one)."""
    return sorted(x for x in s.scalars(select(Conversation.tenant).distinct()) if x is not None)


def get_option(s: Session, *, name: str) -> str:
    if name not in OPTIONS:
        raise KeyError(name)
    return s.scalar(select(Option.value).where(Option.name == name)) or OPTIONS[name]


def set_option(s: Session, *, name: str, value: str, user: str) -> None:
    """Change a console option; audited with its value before and after."""
    if name not in OPTIONS:
        raise KeyError(name)
    row = s.get(Option, name)
    before = row.value if row else OPTIONS[name]
    if row is None:
        s.add(Option(name=name, value=value, updated_by=user))
    else:
        row.value, row.updated_by, row.updated_at = value, user, utcnow()
    audit.record(s, user=user, action="set option", target="console", field=name, before=before, after=value)


# -- helpers ----------------------------------------------------------------------------------------------


def _base(f: ReviewFilter):
    query = select(Conversation.id).join(Template, Conversation.template_id == Template.id)
    if f.version is not None:
        query = query.join(TemplateVersion, Conversation.template_version_id == TemplateVersion.id)
    return query


def _conditions(f: ReviewFilter) -> list:
    where = []
    if f.template:
        where.append(Template.name == f.template)
    if f.version is not None:
        where.append(TemplateVersion.number == f.version)
    if f.tenant is not None:
        where.append(Conversation.tenant == f.tenant)
    if f.text:
        pattern = "%" + f.text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        said = exists().where(Message.conversation_id == Conversation.id, Message.status != AnswerStatus.REPLACED,
                              Message.text.like(pattern, escape="\\"))
        where.append(said | Conversation.title.like(pattern, escape="\\"))
    if f.rating in ("up", "down"):
        where.append(exists().where(Rating.conversation_id == Conversation.id,
                                    Rating.thumbs == (1 if f.rating == "up" else -1)))
    elif f.rating == "unrated":
        where.append(~exists().where(Rating.conversation_id == Conversation.id))
    if f.status in (Handoff.WAITING, Handoff.PERSON):
        where.append(Conversation.handoff == f.status)
    elif f.status:
        where.append(exists().where(Message.conversation_id == Conversation.id, Message.role == "assistant",
                                    Message.status == f.status))
    return where


def _rows(s: Session, ids: list[int]) -> list[ReviewRow]:
    if not ids:
        return []
    conversations = s.execute(
        select(Conversation, Template.name, TemplateVersion.number)
        .join(Template, Conversation.template_id == Template.id)
        .outerjoin(TemplateVersion, Conversation.template_version_id == TemplateVersion.id)
        .where(Conversation.id.in_(ids))
    ).all()
    counts = {cid: (n, last) for cid, n, last in s.execute(
        select(Message.conversation_id, func.count(Message.id), func.max(Message.created_at))
        .where(Message.conversation_id.in_(ids), Message.status != AnswerStatus.REPLACED)
        .group_by(Message.conversation_id))}
    statuses: dict[int, set[str]] = {}
    for cid, status in s.execute(select(Message.conversation_id, Message.status).distinct()
                                 .where(Message.conversation_id.in_(ids), Message.role == "assistant",
                                        Message.status != AnswerStatus.REPLACED)):
        statuses.setdefault(cid, set()).add(status)
    thumbs = {(cid, t): n for cid, t, n in s.execute(
        select(Rating.conversation_id, Rating.thumbs, func.count(Rating.id))
        .where(Rating.conversation_id.in_(ids)).group_by(Rating.conversation_id, Rating.thumbs))}
    by_id = {}
    for c, name, number in conversations:
        n, last = counts.get(c.id, (0, c.created_at))
        by_id[c.id] = ReviewRow(
            id=c.id, created_at=c.created_at, last_at=last or c.created_at, title=c.title, template=name,
            version=number, tenant=c.tenant, handoff=Handoff(c.handoff), handoff_requested_at=c.handoff_requested_at,
            handoff_operator=c.handoff_operator, num_messages=n, status=_worst(statuses.get(c.id, set())),
            ups=thumbs.get((c.id, 1), 0), downs=thumbs.get((c.id, -1), 0), deleted=c.deleted_at is not None)
    return [by_id[i] for i in ids if i in by_id]


def _worst(statuses: set[str]) -> str:
    for status in (AnswerStatus.ERROR, AnswerStatus.STOPPED, AnswerStatus.GENERATING, AnswerStatus.OK):
        if status in statuses:
            return status
    return ""


def _version_stats(s: Session, t: Template, *, since: datetime | None) -> list[VersionStats]:
    """Per version of ``t``, oldest first: its model answers (in conversations started since ``since``)."""
    query = (
        select(Message.template_version_id, Message.conversation_id, Message.status, Message.first_visible_ms,
               Message.ttft_ms, Message.prompt_tokens, Message.num_cached_tokens, Rating.thumbs)
        .join(TemplateVersion, Message.template_version_id == TemplateVersion.id)
        .outerjoin(Rating, Rating.message_id == Message.id)
        .where(TemplateVersion.template_id == t.id, Message.role == "assistant", Message.author == "",
               Message.status.in_(ANSWER_STATUSES))
    )
    if since is not None:
        query = query.join(Conversation, Message.conversation_id == Conversation.id).where(
            Conversation.created_at >= since)
    answers: dict[int, list] = {}
    for row in s.execute(query):
        answers.setdefault(row[0], []).append(row)
    return [_stats(t, v, answers.get(v.id, [])) for v in t.versions]


def _stats(t: Template, v: TemplateVersion, rows: Iterable) -> VersionStats:
    rows = list(rows)
    visible = [r.first_visible_ms for r in rows if r.first_visible_ms is not None]
    ttft = [r.ttft_ms for r in rows if r.ttft_ms is not None]
    return VersionStats(
        number=v.number, version_id=v.id, published=v.id == t.published_version_id,
        candidate=v.id == t.candidate_version_id, num_conversations=len({r.conversation_id for r in rows}),
        num_answers=len(rows), ups=sum(1 for r in rows if r.thumbs == 1), downs=sum(1 for r in rows if r.thumbs == -1),
        stopped=sum(1 for r in rows if r.status == AnswerStatus.STOPPED),
        errors=sum(1 for r in rows if r.status == AnswerStatus.ERROR),
        first_visible_p50_ms=statistics.median(visible) if visible else None,
        ttft_p50_ms=statistics.median(ttft) if ttft else None,
        prompt_tokens=sum(r.prompt_tokens or 0 for r in rows),
        num_cached_tokens=sum(r.num_cached_tokens or 0 for r in rows),
    )


def _cell(value):
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value
