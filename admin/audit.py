"""The audit log: who did what to which template, and the version before and after."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.models import AuditEntry
from app.store import Store


@dataclass(frozen=True)
class AuditRow:
    t: datetime
    user: str
    action: str
    target: str
    before: str | None
    after: str | None


def record(session: Session, *, user: str, action: str, target: str,
           before: object = None, after: object = None) -> None:
    """Add an entry inside the caller's transaction, so the action and its record commit together."""
    session.add(AuditEntry(user=user, action=action, target=target[:200],
                           before=None if before is None else str(before),
                           after=None if after is None else str(after)))


def log_action(*, store: Store, user: str, action: str, target: str,
               before: object = None, after: object = None) -> None:
    """Record an action that changes no row of its own (a warmup, an export)."""
    with store.session() as s:
        record(s, user=user, action=action, target=target, before=before, after=after)


def recent(*, store: Store, limit: int = 200) -> list[AuditRow]:
    """The newest ``limit`` entries, newest first."""
    with store.session() as s:
        rows = s.scalars(select(AuditEntry).order_by(AuditEntry.id.desc()).limit(limit)).all()
        return [AuditRow(a.t, a.user, a.action, a.target, a.before, a.after) for a in rows]
