"""Per-client limits: messages a minute and answers streaming at once, per browser and per address.

A browser that holds a key this server issued (app/core/session_keys.py; the chat checks it before the
desk sees it) has limits of its own, so thirty customers of an office behind one NAT address each get
their share. A key costs nothing to get (load the page), so the address also has an outer bound, several
times a browser's: one host minting keys gets that far and no further. A caller without a browser key
(/v1, the scriptable /chat) is limited by its address at a browser's limits, as before.

Addresses come from ``app.core.callers`` (the TCP peer, or the address a trusted proxy forwards), never
from anything the client can send. Idle keys are pruned, so the tables stay as small as the set of
clients of the last minute.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable

from app.core.refusals import Refused

WINDOW_S = 60.0
PRUNE_EVERY = 256  # calls between sweeps of idle keys


class RateLimited(Refused, Exception):
    """A client exceeded a limit (code "rate", "streams", "address_rate" or "address_streams"); the message says
    how long to wait or what to do."""

    def __init__(self, code: str, *, retry_after_s: int, **params):
        super().__init__(self._refuse(code, params))
        self.retry_after_s = retry_after_s


class ClientLimiter:
    """``per_minute`` and ``concurrent`` are one browser's (or one keyless address's) limits; ``per_address_*``
    bound everything one address sends, browsers together. 0: no limit."""

    def __init__(self, *, per_minute: int, concurrent: int, per_address_per_minute: int = 0,
                 per_address_concurrent: int = 0, clock: Callable[[], float] = time.monotonic):
        self.per_minute = per_minute
        self.concurrent = concurrent
        self.per_address_per_minute = per_address_per_minute
        self.per_address_concurrent = per_address_concurrent
        self._clock = clock
        self._sent: dict[tuple[str, str], collections.deque[float]] = {}  # ("b", key) / ("a", address) / ("k", ...)
        self._open: collections.Counter[tuple[str, str]] = collections.Counter()
        self._calls = 0

    def check_rate(self, address: str, *, browser: str = "") -> None:
        """Count one message from ``address`` (of the browser whose checked key is ``browser``, if any); raises
        RateLimited past the browser's ``per_minute`` (the address's, without a key) or the address's bound.
        A refused message counts against nothing."""
        self._calls += 1
        if self._calls % PRUNE_EVERY == 0:
            self._prune()
        now = self._clock()
        own = ("b", browser) if browser else ("k", address)
        windows = [(own, self.per_minute, "rate"), (("a", address), self.per_address_per_minute, "address_rate")]
        for key, limit, code in windows:
            if not limit:
                continue
            sent = self._sent.get(key)
            while sent and sent[0] <= now - WINDOW_S:
                sent.popleft()
            if sent and len(sent) >= limit:
                wait_s = int(sent[0] + WINDOW_S - now) + 1
                raise RateLimited(code, retry_after_s=wait_s, per_minute=limit, wait_s=wait_s)
        for key, limit, _ in windows:
            if limit:
                self._sent.setdefault(key, collections.deque()).append(now)

    def stream(self, address: str, *, browser: str = "") -> StreamSlot:
        """Take one of the concurrent answers of ``browser`` (or of keyless ``address``) and of ``address``
        (release it, or use it as a context manager); raises RateLimited past either limit."""
        own = ("b", browser) if browser else ("k", address)
        whole = ("a", address)
        if self.concurrent and self._open[own] >= self.concurrent:
            raise RateLimited("streams", retry_after_s=1, open=self._open[own], limit=self.concurrent)
        if self.per_address_concurrent and self._open[whole] >= self.per_address_concurrent:
            raise RateLimited("address_streams", retry_after_s=1, open=self._open[whole],
                              limit=self.per_address_concurrent)
        self._open[own] += 1
        self._open[whole] += 1
        return StreamSlot(self, (own, whole))

    def _release(self, keys: tuple[tuple[str, str], ...]) -> None:
        for key in keys:
            self._open[key] -= 1
            if self._open[key] <= 0:
                del self._open[key]

    def num_keys(self) -> int:
        return len(self._sent) + len(self._open)

    def _prune(self) -> None:
        cutoff = self._clock() - WINDOW_S
        for key in [k for k, sent in self._sent.items() if not sent or sent[-1] <= cutoff]:
            del self._sent[key]


class StreamSlot:
    """One answer in progress of one client; released once, however often ``release`` is called."""

    def __init__(self, limiter: ClientLimiter, keys: tuple[tuple[str, str], ...]):
        self._limiter, self._keys, self._held = limiter, keys, True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._limiter._release(self._keys)

    def __enter__(self) -> StreamSlot:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


FEEDBACK_WINDOW_S = 3600.0


class FeedbackLimiter:
    """Customers' reports that become the operators' figures — a rating, a first-text time — counted per kind: at
    most ``per_client`` an hour from one address and ``per_session`` from one browser (0: no limit). A report past
    either is not counted: nothing is stored, and the customer, who did nothing wrong, is told nothing. Without
    it, 24 scripted conversations from 3 addresses made one arm of a split 100% 👍 and the other 100% 👎.
    Counted in this process (each web process keeps its own)."""

    def __init__(self, *, per_client: int, per_session: int, window_s: float = FEEDBACK_WINDOW_S,
                 clock: Callable[[], float] = time.monotonic):
        self.per_client, self.per_session, self.window_s = per_client, per_session, window_s
        self._clock = clock
        self._counted: dict[tuple[str, str, str], collections.deque[float]] = {}
        self._calls = 0

    def allow(self, kind: str, *, client: str, session_key: str) -> bool:
        """Count one report of ``kind`` from ``client`` and ``session_key``; False (and not counted) past a limit."""
        now = self._clock()
        self._calls += 1
        if self._calls % PRUNE_EVERY == 0:
            self._prune(now)
        keys = [(key, limit) for key, limit in (((kind, "client", client), self.per_client),
                                                ((kind, "session", session_key), self.per_session)) if limit]
        for key, limit in keys:
            counted = self._counted.setdefault(key, collections.deque())
            while counted and counted[0] <= now - self.window_s:
                counted.popleft()
            if len(counted) >= limit:
                return False
        for key, _ in keys:
            self._counted[key].append(now)
        return True

    def num_keys(self) -> int:
        return len(self._counted)

    def _prune(self, now: float) -> None:
        for key in [k for k, counted in self._counted.items() if not counted or counted[-1] <= now - self.window_s]:
            del self._counted[key]
