"""Who may use the console: logins, sessions, throttling, and the check every handler makes.

The console has its own login (app/console/login.py serves the page). A login that succeeds gets a random
token in one HttpOnly, SameSite=Strict cookie; the database keeps only its SHA-256 with the
operator and an expiry, so sessions work across web processes and survive restarts, and logging
out, disabling the operator or the TTL ends them everywhere. Every console handler calls
``require`` (a hidden component is not access control), which reads that one cookie by its exact
name. Passwords are hashed on threads, a few at a time.

Guessing is throttled per client address, never per account: after ``free_attempts`` failures a
client waits 1 s before its next try, then 2, 4, … up to 5 minutes, and nothing a stranger does
makes the operator wait.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

import gradio as gr

from app.console.passwords import verify_password
from app.db import Database
from app.db import operators as db_operators
from app.db.models import utcnow

SESSION_COOKIE = "prefixdesk_console"
SESSION_CACHE_S = 5.0  # a process re-reads a session from the database at most this often
BASE_DELAY_S = 1.0
MAX_DELAY_S = 300.0
HASH_CONCURRENCY = 2  # scrypt checks at once (16 MiB and ~50 ms of a core each)
MAX_WAITING_CHECKS = 16  # beyond this many logins in line, answer "try again" without hashing


class LoginRefused(PermissionError):
    """A login failed; ``status`` is the HTTP status and ``retry_after_s`` when to try again (0: now)."""

    def __init__(self, message: str, *, status: int = 401, retry_after_s: int = 0):
        super().__init__(message)
        self.status = status
        self.retry_after_s = retry_after_s


@dataclass
class _Failures:
    count: int = 0
    next_try_at: float = 0.0


class LoginThrottle:
    """Exponential delay per client address after ``free_attempts`` failed logins."""

    def __init__(self, free_attempts: int, clock: Callable[[], float] = time.monotonic):
        self.free_attempts = free_attempts
        self._clock = clock
        self._clients: dict[str, _Failures] = {}

    def wait_s(self, client: str) -> float:
        """Seconds ``client`` must wait before its next attempt (0: it may try now)."""
        f = self._clients.get(client)
        return 0.0 if f is None else max(0.0, f.next_try_at - self._clock())

    def failed(self, client: str) -> None:
        self._prune()
        f = self._clients.setdefault(client, _Failures())
        f.count += 1
        over = f.count - self.free_attempts
        f.next_try_at = self._clock() + (min(BASE_DELAY_S * 2 ** (over - 1), MAX_DELAY_S) if over > 0 else 0.0)

    def succeeded(self, client: str) -> None:
        self._clients.pop(client, None)

    def num_clients(self) -> int:
        return len(self._clients)

    def _prune(self) -> None:
        cutoff = self._clock() - 2 * MAX_DELAY_S
        for client in [c for c, f in self._clients.items() if f.next_try_at < cutoff]:
            del self._clients[client]


class Clock:
    """The console's time: ``monotonic()`` for login delays and the session cache, ``utcnow()`` for the
    expiry the database keeps. Tests pass one they move by hand."""

    def monotonic(self) -> float:
        return time.monotonic()

    def utcnow(self) -> datetime:
        return utcnow()


class ConsoleAccess:
    def __init__(self, db: Database, *, ttl_s: float, free_attempts: int, language: str = "en",
                 clock: Clock | None = None):
        self.db = db
        self.ttl_s = ttl_s
        self.language = language
        self._clock = clock or Clock()
        self.throttle = LoginThrottle(free_attempts, clock=self._clock.monotonic)
        self._hashing = asyncio.Semaphore(HASH_CONCURRENCY)
        self._waiting = 0
        self._cache: dict[str, tuple[str | None, float]] = {}  # token hash -> (operator, valid until, monotonic)

    async def login(self, *, name: str, password: str, client: str) -> str:
        """A new session token for ``name``; raises LoginRefused (with when to try again)."""
        wait_s = self.throttle.wait_s(client)
        if wait_s > 0:
            whole_s = math.ceil(wait_s)  # never "try again in 0 s", never a second more than the wait
            raise LoginRefused(f"Too many failed logins from your address; try again in {whole_s} s.",
                               status=429, retry_after_s=whole_s)
        if self._waiting >= MAX_WAITING_CHECKS:
            raise LoginRefused("The console is checking many logins at once; try again in a few seconds.",
                               status=429, retry_after_s=2)
        self._waiting += 1
        try:
            async with self._hashing:
                stored = await self.db.read(db_operators.password_hash, name=name)
                ok = await asyncio.to_thread(verify_password, password, stored)
        finally:
            self._waiting -= 1
        if not ok:
            self.throttle.failed(client)
            raise LoginRefused("Wrong name or password.")
        self.throttle.succeeded(client)
        token = secrets.token_urlsafe(32)
        await self.db.write(db_operators.open_session, token_hash=_hash(token), operator=name,
                            expires_at=self._clock.utcnow() + timedelta(seconds=self.ttl_s), client=client)
        return token

    async def operator_of(self, token: str | None, *, fresh: bool = False) -> str | None:
        """The operator whose live session ``token`` is, or None (no, expired, revoked or disabled).

        The gate asks for every asset of a page and may use an answer up to SESSION_CACHE_S old;
        handlers ask ``fresh``, so a disabled operator's next action is refused at once.
        """
        if not token:
            return None
        key = _hash(token)
        cached = self._cache.get(key)
        now = self._clock.monotonic()
        if not fresh and cached is not None and now < cached[1]:
            return cached[0]
        utc_now = self._clock.utcnow()
        session = await self.db.read(db_operators.find_session, token_hash=key, now=utc_now)
        if len(self._cache) > 10_000:
            self._cache.clear()
        operator = session.operator if session else None
        # Trusted for SESSION_CACHE_S, and never past the session's own expiry.
        left_s = (session.expires_at - utc_now).total_seconds() if session else SESSION_CACHE_S
        self._cache[key] = (operator, now + min(SESSION_CACHE_S, left_s))
        return operator

    async def logout(self, token: str | None) -> None:
        if token:
            await self.db.write(db_operators.revoke_session, token_hash=_hash(token))
            self._cache.pop(_hash(token), None)

    async def require(self, request: gr.Request | None) -> str:
        """The calling operator's name; raises gr.Error (shown to them, nothing done) otherwise."""
        cookies = getattr(request, "cookies", None) or {}
        operator = await self.operator_of(cookies.get(SESSION_COOKIE), fresh=True)
        if operator is None:
            title, message = _REFUSED[self.language]
            raise gr.Error(message, title=title)
        return operator


_REFUSED = {
    "en": ("Not authorized", "Your console session has ended or was never opened: log in again at /admin/login."),
    "zh": ("无权操作", "控制台会话已结束或尚未登录：请在 /admin/login 重新登录。"),
}


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()

