"""The queue of conversations waiting for a person, and the caps that keep one client from filling it.

A session key costs nothing (a fresh browser gets one), so a queue without caps fills from one address: the
real customer then waits behind a page of forged requests. Three caps count the conversations *waiting* (an
operator's own ones no longer count): one client's (its address, or its IPv6 /64, which one subscriber holds
whole), one browser's (its session key) and everyone's. A request past a cap is refused and counted by the
hour in ``person_refusals`` (a flood is a number, not a row per request), so the operators see a flood as one.

The counts are read and the conversation marked in one transaction on SQLite's single writer: exact there.
On PostgreSQL, web processes that ask at the same instant may each pass the cap once.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.db.models import Conversation, PersonRefusal, utcnow
from app.db.states import Handoff

REFUSALS_KEPT = timedelta(days=7)
CLIENT_CHARS = 64


class Cap(StrEnum):
    CLIENT = "client"  # one client address's waiting conversations
    SESSION = "session"  # one browser's (session key's)
    TOTAL = "total"  # everyone's


@dataclass(frozen=True)
class PersonCaps:
    """Most conversations waiting for a person at once, per client, per browser and in all; 0: no cap."""

    per_client: int = 0
    per_session: int = 0
    total: int = 0


@dataclass(frozen=True)
class QueueState:
    """The person queue as the console shows it: how many wait now, and how many requests each cap refused
    from ``since`` on (the start of the previous hour)."""

    waiting: int
    total_cap: int  # 0: none
    since: datetime
    refused: dict[Cap, int]

    @property
    def full(self) -> bool:
        return bool(self.total_cap) and self.waiting >= self.total_cap


class QueueFull(Exception):
    """A request for a person that ``cap`` refused (the conversation stays with the model)."""

    def __init__(self, cap: Cap, limit: int):
        super().__init__(f"{limit} conversations already wait for a person ({cap} cap)")
        self.cap, self.limit = cap, limit


def client_key(address: str) -> str:
    """The key a client's requests count under: its IP address, an IPv6 address's /64 network (one subscriber's
    whole prefix), anything else as given, cut to CLIENT_CHARS."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address[:CLIENT_CHARS]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


def full_cap(s: Session, *, session_key: str, client: str, caps: PersonCaps) -> QueueFull | None:
    """The cap a new waiting conversation of this browser and client would pass, or None. Checked widest first:
    a full queue is what the customer is told about even when their own share is also used."""
    checks = ((Cap.TOTAL, caps.total, None), (Cap.CLIENT, caps.per_client, Conversation.handoff_client == client),
              (Cap.SESSION, caps.per_session, Conversation.session_key == session_key))
    for cap, limit, where in checks:
        if not limit or (cap is Cap.CLIENT and not client):
            continue
        query = select(func.count()).select_from(Conversation).where(Conversation.handoff == Handoff.WAITING)
        if where is not None:
            query = query.where(where)
        if s.scalar(query) >= limit:
            return QueueFull(cap, limit)
    return None


def record_refusal(s: Session, *, cap: str, now: datetime | None = None) -> None:
    """Count one refused request for a person in the current hour (and forget hours older than REFUSALS_KEPT)."""
    hour = _hour(now or utcnow())
    row = s.get(PersonRefusal, (hour, str(cap)))
    if row is None:
        s.add(PersonRefusal(hour=hour, cap=str(cap), count=1))
        s.query(PersonRefusal).filter(PersonRefusal.hour < hour - REFUSALS_KEPT).delete()
    else:
        row.count += 1


def queue_state(s: Session, *, total_cap: int, now: datetime | None = None) -> QueueState:
    """How many conversations wait for a person, and each cap's refusals since the previous hour began."""
    since = _hour(now or utcnow()) - timedelta(hours=1)
    waiting = s.scalar(select(func.count()).select_from(Conversation).where(Conversation.handoff == Handoff.WAITING))
    counts = dict(s.execute(select(PersonRefusal.cap, func.sum(PersonRefusal.count))
                            .where(PersonRefusal.hour >= since).group_by(PersonRefusal.cap)).all())
    return QueueState(waiting or 0, total_cap, since, {cap: int(counts.get(str(cap), 0)) for cap in Cap})


def _hour(t: datetime) -> datetime:
    return t.replace(minute=0, second=0, microsecond=0)
