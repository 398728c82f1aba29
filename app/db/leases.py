"""Leases: which process of a deployment runs a once-per-deployment loop.

Several web processes share one database; the cache sampler and keep-warm must run in only one of
them. A process holds a named lease by renewing it before it expires; when it dies, the lease
expires and another process takes it over. Plain rows, so SQLite and PostgreSQL work the same.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.db.models import Lease, utcnow


def acquire(s: Session, *, name: str, holder: str, ttl_s: float) -> bool:
    """Take or renew lease ``name`` for ``holder`` for ``ttl_s``; False when another live holder has it."""
    now = utcnow()
    expires = now + timedelta(seconds=ttl_s)
    taken = s.execute(
        update(Lease).where(Lease.name == name, (Lease.holder == holder) | (Lease.expires_at < now))
        .values(holder=holder, expires_at=expires)
    ).rowcount
    if taken:
        return True
    if s.scalar(select(Lease.name).where(Lease.name == name)) is not None:
        return False
    try:
        with s.begin_nested():
            s.add(Lease(name=name, holder=holder, expires_at=expires))
    except IntegrityError:  # another process inserted it first
        return False
    return True


def release(s: Session, *, name: str, holder: str) -> None:
    s.execute(update(Lease).where(Lease.name == name, Lease.holder == holder).values(expires_at=utcnow()))


def holder_of(s: Session, *, name: str) -> str | None:
    """The live holder of ``name``, or None."""
    return s.scalar(select(Lease.holder).where(Lease.name == name, Lease.expires_at >= utcnow()))
