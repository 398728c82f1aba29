"""Who may use the console: logins, sessions, throttling, and the check every handler makes.

The console has its own login (admin/login.py serves the page). A login that succeeds gets a random
token in one HttpOnly, SameSite=Strict cookie; the database keeps only its SHA-256 with the
operator and an expiry, so sessions work across web processes and survive restarts, and logging
out, disabling the operator or the TTL ends them everywhere. Every console handler calls
``require`` (a hidden component is not access control), which reads that one cookie by its exact
name.

Guessing is throttled per client address, never per account: after ``free_attempts`` failures a
client waits 1 s before its next try, then 2, 4, … up to 5 minutes. An attempt counts as a failure
as soon as it is let in, before its password is hashed (a burst of concurrent guesses gets exactly
the free attempts hashed), and is forgiven when it succeeds. Passwords are hashed on threads, a few
at a time, shared fairly: each address has at most one check hashing, and a free slot goes to the
address that has failed least, so no stranger's traffic — one address's or many — keeps the operator
out or makes them wait behind guesses.

Fresh addresses have failed no less than the operator, though: 300 addresses with one guess each once kept
the operator's login waiting 28 s. So a login that succeeds also gives the browser a device mark (a cookie
of its own, 90 days, HttpOnly): the operator's name, a nonce and an HMAC of both keyed by the operator's
stored password hash (no new secret to keep; a new password voids every mark). A login that brings a valid
mark for the name it logs in as goes before every address in the hashing queue: it waits only for the
checks already running.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import itertools
import math
import os
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

import gradio as gr

from admin.passwords import verify_password
from app.db import Database
from app.db import operators as db_operators
from app.db.models import utcnow

SESSION_COOKIE = "prefixdesk_console"
DEVICE_COOKIE = "prefixdesk_console_device"  # the device mark: this browser's operator logged in here before
DEVICE_TTL_S = 90 * 24 * 3600
SESSION_CACHE_S = 5.0  # a process re-reads a session from the database at most this often
BASE_DELAY_S = 1.0
MAX_DELAY_S = 300.0
# scrypt checks at once (16 MiB and ~50 ms of a core each): half the cores, so that a flood of logins,
# which now gets every admitted guess hashed, leaves the other half to the event loop and the engine.
HASH_CONCURRENCY = max(1, (os.cpu_count() or 2) // 2)


class LoginRefused(PermissionError):
    """A login failed; ``status`` is the HTTP status and ``retry_after_s`` when to try again (0: now)."""

    def __init__(self, message: str, *, status: int = 401, retry_after_s: int = 0):
        super().__init__(message)
        self.status = status
        self.retry_after_s = retry_after_s


@dataclass
class _Failures:
    count: int = 0  # failed attempts, and those let in and not yet checked
    checking: int = 0  # attempts let in whose check has not finished
    next_try_at: float = 0.0


class LoginThrottle:
    """Exponential delay per client address once it has used ``free_attempts`` attempts without success.

    ``admit`` counts an attempt as failed before it is checked; ``finished`` sets the wait when its check
    failed, or forgets the address when it succeeded.
    """

    def __init__(self, free_attempts: int, clock: Callable[[], float] = time.monotonic):
        self.free_attempts = free_attempts
        self._clock = clock
        self._clients: dict[str, _Failures] = {}

    def admit(self, client: str) -> float:
        """Let an attempt in (0.0, counted as failed until it succeeds), or the seconds to wait before the next."""
        f = self._clients.get(client)
        if f is not None:
            if f.checking and f.count >= self.free_attempts:  # its earlier tries are still being checked
                return self._delay_s(f.count)
            if (wait_s := f.next_try_at - self._clock()) > 0:
                return wait_s
        self._prune()
        f = self._clients.setdefault(client, _Failures())
        f.count += 1
        f.checking += 1
        return 0.0

    def finished(self, client: str, *, ok: bool) -> None:
        f = self._clients.get(client)
        if f is None:
            return
        if ok:
            del self._clients[client]
            return
        f.checking -= 1
        f.next_try_at = max(f.next_try_at, self._clock() + self._delay_s(f.count))

    def failures(self, client: str) -> int:
        """Attempts of ``client`` that failed or are being checked."""
        f = self._clients.get(client)
        return 0 if f is None else f.count

    def wait_s(self, client: str) -> float:
        """Seconds ``client`` must wait before its next attempt (0: it may try now)."""
        f = self._clients.get(client)
        return 0.0 if f is None else max(0.0, f.next_try_at - self._clock())

    def num_clients(self) -> int:
        return len(self._clients)

    def _delay_s(self, failures: int) -> float:
        over = failures - self.free_attempts
        return 0.0 if over < 0 else min(BASE_DELAY_S * 2 ** over, MAX_DELAY_S)

    def _prune(self) -> None:
        cutoff = self._clock() - 2 * MAX_DELAY_S
        for client in [c for c, f in self._clients.items() if not f.checking and f.next_try_at < cutoff]:
            del self._clients[client]


class FairHashing:
    """``capacity`` password checks at once, shared by client address: an address has at most one check
    running, and a free slot goes to the waiting check whose address has failed least (``rank``), the
    earliest first among equals. The operator's address, with no failures, goes before every address that
    keeps guessing: a flood delays it by at most the checks running and the first tries of fresh addresses."""

    def __init__(self, capacity: int):
        self._capacity = capacity
        self._running: set[str] = set()
        self._waiting: list[tuple[int, int, str, asyncio.Future]] = []  # (rank, arrival, client, turn)
        self._arrivals = itertools.count()

    @contextlib.asynccontextmanager
    async def turn(self, client: str, *, rank: int) -> AsyncIterator[None]:
        """Wait for ``client``'s turn (``rank``: its failures before this attempt), hold a slot for the block."""
        entry = (rank, next(self._arrivals), client, asyncio.get_running_loop().create_future())
        self._waiting.append(entry)
        self._dispatch()
        try:
            await entry[3]
        except asyncio.CancelledError:
            if entry in self._waiting:
                self._waiting.remove(entry)
            elif client in self._running:  # the slot was given just as the waiter left
                self._release(client)
            raise
        try:
            yield
        finally:
            self._release(client)

    def num_queued(self) -> int:
        """Checks waiting for a slot or holding one."""
        return len(self._waiting) + len(self._running)

    def _dispatch(self) -> None:
        while len(self._running) < self._capacity:
            ready = [e for e in self._waiting if e[2] not in self._running and not e[3].done()]  # done: cancelled
            if not ready:
                return
            entry = min(ready, key=lambda e: e[:2])
            self._waiting.remove(entry)
            self._running.add(entry[2])
            entry[3].set_result(None)

    def _release(self, client: str) -> None:
        self._running.discard(client)
        self._dispatch()
class Clock:
    """The console's time: ``monotonic()`` for login delays and the session cache, ``utcnow()`` for the
    expiry the database keeps. Tests pass one they move by hand."""

    def monotonic(self) -> float:
        return time.monotonic()

    def utcnow(self) -> datetime:
        return utcnow()


class AdminAccess:
    def __init__(self, db: Database, *, ttl_s: float, free_attempts: int, language: str = "en",
                 clock: Clock | None = None):
        self.db = db
        self.ttl_s = ttl_s
        self.language = language
        self._clock = clock or Clock()
        self.throttle = LoginThrottle(free_attempts, clock=self._clock.monotonic)
        self._hashing = FairHashing(HASH_CONCURRENCY)
        self._cache: dict[str, tuple[str | None, float]] = {}  # token hash -> (operator, valid until, monotonic)

    async def login(self, *, name: str, password: str, client: str, device: str | None = None) -> tuple[str, str]:
        """(a new session token, a device mark) for ``name``; raises LoginRefused (with when to try again).

        ``device``: the browser's device mark, if it sent one; valid for ``name``, the check goes first."""
        wait_s = self.throttle.admit(client)
        if wait_s > 0:
            retry_s = math.ceil(wait_s)
            raise LoginRefused(f"Too many failed logins from your address; try again in {retry_s} s.",
                               status=429, retry_after_s=retry_s)
        ok = False
        try:
            stored = await self.db.read(db_operators.password_hash, name=name)
            rank = -1 if device_mark_valid(device, name, stored) else self.throttle.failures(client) - 1
            async with self._hashing.turn(client, rank=rank):
                ok = await asyncio.to_thread(verify_password, password, stored)
        finally:
            self.throttle.finished(client, ok=ok)
        if not ok:
            raise LoginRefused("Wrong name or password.")
        token = secrets.token_urlsafe(32)
        await self.db.write(db_operators.open_session, token_hash=_hash(token), operator=name,
                            expires_at=self._clock.utcnow() + timedelta(seconds=self.ttl_s), client=client)
        return token, device_mark(name, stored)

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


def device_mark(name: str, stored_hash: str) -> str:
    """A device mark for ``name``: ``nonce.mac``, the mac an HMAC of name and nonce keyed by the stored hash."""
    nonce = secrets.token_urlsafe(12)
    return f"{nonce}.{_mark_mac(name, nonce, stored_hash)}"


def device_mark_valid(mark: str | None, name: str, stored_hash: str | None) -> bool:
    """Whether ``mark`` is one that a login as ``name`` with its current password gave; any other value
    (absent, malformed, another operator's, from before a new password) is no mark."""
    if not mark or not stored_hash or len(mark) > 200 or mark.count(".") != 1:
        return False
    nonce, mac = mark.split(".")
    return hmac.compare_digest(mac, _mark_mac(name, nonce, stored_hash))


def _mark_mac(name: str, nonce: str, stored_hash: str) -> str:
    return hmac.new(stored_hash.encode(), f"{name}\n{nonce}".encode(), hashlib.sha256).hexdigest()

