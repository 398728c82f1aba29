"""Operator accounts of the admin console: salted scrypt hashes in the ``operators`` table.

The console is open only when at least one active operator exists. Gradio's login (``auth=``)
is the door; every handler still calls ``require_operator`` itself, so an operator disabled after
logging in is refused at their next click, and a hidden component never stands in for a check.
"""

from __future__ import annotations

import collections
import time

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select

from app.models import Operator, utcnow
from app.settings import Settings, password_weakness
from app.store import Store

# scrypt cost: about 50 ms and 16 MiB per check on one core, slow enough to make guessing expensive.
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1
DISABLED_MESSAGE = (
    "The admin console is closed: no operator account existed when the server started. Set "
    "PREFIXDESK_ADMIN_PASSWORD (and PREFIXDESK_ADMIN_USER) and restart, or run `python -m admin create-user NAME`, "
    "which works without a restart."
)


class NotAuthorized(PermissionError):
    """The caller is not a logged-in, active operator."""


class WeakPassword(ValueError):
    """The password would be easy to guess; the message says what a good one needs."""


class OperatorExists(ValueError):
    pass


@dataclass(frozen=True)
class OperatorRow:
    name: str
    source: str
    created_at: datetime
    disabled: bool


def hash_password(password: str) -> str:
    """``scrypt$n$r$p$salt$hash`` (hex) for ``password`` with a fresh random salt."""
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P)
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${salt.hex()}${digest.hex()}"


def verify_password(password: str, stored: str) -> bool:
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
    except ValueError:
        return False
    if scheme != "scrypt":
        return False
    got = hashlib.scrypt(password.encode(), salt=bytes.fromhex(salt), n=int(n), r=int(r), p=int(p))
    return hmac.compare_digest(got.hex(), digest)


def create_operator(*, store: Store, name: str, password: str, source: str = "cli") -> None:
    """Add an operator; raises WeakPassword or OperatorExists (nothing is written then)."""
    name = name.strip()
    if not name:
        raise ValueError("an operator needs a name")
    weakness = password_weakness(password)
    if weakness:
        raise WeakPassword(f"that password is too weak: {weakness}")
    with store.session() as s:
        if s.scalar(select(Operator).where(Operator.name == name)) is not None:
            raise OperatorExists(f"operator {name!r} already exists; use `python -m admin set-password {name}`")
        s.add(Operator(name=name, password_hash=hash_password(password), source=source))


def set_password(*, store: Store, name: str, password: str, allow_weak: bool = False) -> None:
    """Set (or create) ``name``'s password and enable the account; raises WeakPassword."""
    weakness = password_weakness(password)
    if weakness and not allow_weak:
        raise WeakPassword(f"that password is too weak: {weakness}")
    with store.session() as s:
        op = s.scalar(select(Operator).where(Operator.name == name))
        if op is None:
            s.add(Operator(name=name, password_hash=hash_password(password), source="cli"))
        else:
            op.password_hash = hash_password(password)
            op.disabled_at = None


def disable_operator(*, store: Store, name: str) -> None:
    """Lock ``name`` out: their next console action is refused, even in an open session."""
    with store.session() as s:
        op = s.scalar(select(Operator).where(Operator.name == name))
        if op is None:
            raise LookupError(f"there is no operator {name!r}")
        op.disabled_at = utcnow()


def sync_settings_operator(*, store: Store, settings: Settings) -> None:
    """Make PREFIXDESK_ADMIN_USER/PASSWORD an active operator (the settings validated its strength)."""
    if not settings.admin_password:
        return
    with store.session() as s:
        op = s.scalar(select(Operator).where(Operator.name == settings.admin_user))
        if op is None:
            s.add(Operator(name=settings.admin_user, password_hash=hash_password(settings.admin_password),
                           source="settings"))
        elif op.disabled_at is not None or not verify_password(settings.admin_password, op.password_hash):
            op.password_hash = hash_password(settings.admin_password)
            op.disabled_at = None


def check_login(*, store: Store, name: str, password: str) -> bool:
    """True when ``name`` is an active operator and ``password`` is theirs."""
    with store.session() as s:
        op = s.scalar(select(Operator).where(Operator.name == name, Operator.disabled_at.is_(None)))
        stored = op.password_hash if op is not None else None
    if stored is None:
        # Spend the same time as a real check, so timing does not tell which names exist.
        verify_password(password, _DUMMY_HASH)
        return False
    return verify_password(password, stored)


def require_operator(*, store: Store, name: str | None) -> str:
    """``name`` if it is an active operator; raises NotAuthorized otherwise."""
    if not name:
        raise NotAuthorized("Not logged in: open /admin and log in as an operator.")
    with store.session() as s:
        active = s.scalar(select(Operator.id).where(Operator.name == name, Operator.disabled_at.is_(None)))
    if active is None:
        raise NotAuthorized(f"Operator {name!r} is disabled or unknown; ask another operator to enable the account.")
    return name


def list_operators(*, store: Store) -> list[OperatorRow]:
    with store.session() as s:
        rows = s.scalars(select(Operator).order_by(Operator.id)).all()
        return [OperatorRow(o.name, o.source, o.created_at, o.disabled_at is not None) for o in rows]


def console_open(*, store: Store) -> bool:
    """Whether anyone can log in to the console at all."""
    return any(not o.disabled for o in list_operators(store=store))


_DUMMY_HASH = hash_password(secrets.token_hex(8))


LOCKOUT_WINDOW_S = 300.0


class LoginThrottle:
    """Counts failed logins per account; after ``attempts`` in LOCKOUT_WINDOW_S every login of that
    account fails (even a correct one) until the window has passed, so passwords cannot be guessed."""

    def __init__(self, attempts: int, clock=time.monotonic):
        self.attempts = attempts
        self._clock = clock
        self._failures: dict[str, collections.deque[float]] = collections.defaultdict(collections.deque)

    def locked(self, name: str) -> bool:
        failures = self._failures[name]
        while failures and failures[0] <= self._clock() - LOCKOUT_WINDOW_S:
            failures.popleft()
        return len(failures) >= self.attempts

    def record_failure(self, name: str) -> None:
        self._failures[name].append(self._clock())


class SessionClock:
    """When each console login token was first used; a token older than ``ttl_s`` has expired."""

    def __init__(self, ttl_s: float, clock=time.monotonic):
        self.ttl_s = ttl_s
        self._clock = clock
        self._first_seen: dict[str, float] = {}

    def check(self, token: str | None) -> None:
        """Raises NotAuthorized when the login behind ``token`` is older than ttl_s."""
        if not token:
            return
        first = self._first_seen.setdefault(token, self._clock())
        if self._clock() - first > self.ttl_s:
            raise NotAuthorized("Your console session has expired: log out and log in again.")
