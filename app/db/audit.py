"""The audit log: who changed what, with a before and an after that measure one named thing."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.models import AuditEntry
from app.db.rows import AuditRow


def record(s: Session, *, user: str, action: str, target: str, field: str = "",
           before: object = None, after: object = None) -> None:
    """Add an entry inside the caller's transaction, so an action and its record commit together.

    ``field`` names what ``before`` and ``after`` measure ("published version", "pinned",
    "cached prefix tokens", "cached blocks"), so a column never mixes quantities.
    """
    s.add(AuditEntry(user=user, action=action, target=target[:200], field=field,
                     before=None if before is None else str(before),
                     after=None if after is None else str(after)))


def recent(s: Session, *, limit: int = 200) -> list[AuditRow]:
    """The newest ``limit`` entries, newest first."""
    rows = s.scalars(select(AuditEntry).order_by(AuditEntry.id.desc()).limit(limit)).all()
    return [AuditRow(a.t, a.user, a.action, a.target, a.field, a.before, a.after) for a in rows]
