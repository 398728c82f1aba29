"""Console operators (scrypt hashes) and their login sessions (only a token's SHA-256 is stored).

Hashing is the caller's (admin/access.py): these functions store and compare what they are given.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from app.db.models import AdminSession, Operator, utcnow
from app.db.rows import AdminSessionRow, OperatorRow


class OperatorExists(ValueError):
    pass


def password_hash(s: Session, *, name: str) -> str | None:
    """The stored hash of an active operator, or None (unknown or disabled)."""
    return s.scalar(select(Operator.password_hash).where(Operator.name == name, Operator.disabled_at.is_(None)))


def add(s: Session, *, name: str, password_hash: str, source: str = "cli") -> None:
    if s.scalar(select(Operator.id).where(Operator.name == name)) is not None:
        raise OperatorExists(f"operator {name!r} already exists; use `python -m admin set-password {name}`")
    s.add(Operator(name=name, password_hash=password_hash, source=source))


def set_hash(s: Session, *, name: str, password_hash: str, source: str = "cli") -> None:
    """Set (or create) ``name``'s password hash and enable the account."""
    op = s.scalar(select(Operator).where(Operator.name == name))
    if op is None:
        s.add(Operator(name=name, password_hash=password_hash, source=source))
    else:
        op.password_hash = password_hash
        op.disabled_at = None


def disable(s: Session, *, name: str) -> None:
    """Lock ``name`` out and end their console sessions; raises LookupError for an unknown name."""
    op = s.scalar(select(Operator).where(Operator.name == name))
    if op is None:
        raise LookupError(f"there is no operator {name!r}")
    op.disabled_at = utcnow()
    s.execute(update(AdminSession).where(AdminSession.operator == name, AdminSession.revoked_at.is_(None))
              .values(revoked_at=utcnow()))


def list_all(s: Session) -> list[OperatorRow]:
    rows = s.scalars(select(Operator).order_by(Operator.id)).all()
    return [OperatorRow(o.name, o.source, o.created_at, o.disabled_at is not None) for o in rows]


def any_active(s: Session) -> bool:
    return s.scalar(select(Operator.id).where(Operator.disabled_at.is_(None)).limit(1)) is not None


# -- console sessions --------------------------------------------------------------------------------


def open_session(s: Session, *, token_hash: str, operator: str, expires_at: datetime, client: str) -> None:
    s.add(AdminSession(token_hash=token_hash, operator=operator, expires_at=expires_at, client=client[:100]))


def find_session(s: Session, *, token_hash: str, now: datetime) -> AdminSessionRow | None:
    """The live session of ``token_hash``: not revoked, not expired, its operator still active."""
    row = s.execute(
        select(AdminSession)
        .join(Operator, Operator.name == AdminSession.operator)
        .where(AdminSession.token_hash == token_hash, AdminSession.revoked_at.is_(None),
               AdminSession.expires_at > now, Operator.disabled_at.is_(None))
    ).scalar()
    return None if row is None else AdminSessionRow(row.operator, row.created_at, row.expires_at)


def revoke_session(s: Session, *, token_hash: str) -> None:
    s.execute(update(AdminSession).where(AdminSession.token_hash == token_hash).values(revoked_at=utcnow()))


def prune_sessions(s: Session, *, now: datetime) -> int:
    """Forget sessions that ended; returns how many."""
    return s.execute(delete(AdminSession).where(AdminSession.expires_at <= now)).rowcount
