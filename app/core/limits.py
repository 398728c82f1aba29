"""Per-client limits: messages a minute and answers streaming at once, keyed by the client's address.

Keys come from ``app.core.callers`` (the TCP peer, or the address a trusted proxy forwards), never from
anything the client can mint for itself, such as a fresh browser session. Idle keys are pruned, so
the tables stay as small as the set of clients of the last minute.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable

from app.core.refusals import Refused

WINDOW_S = 60.0
PRUNE_EVERY = 256  # calls between sweeps of idle keys


class RateLimited(Refused, Exception):
    """A client exceeded a limit (code "rate" or "streams"); the message says how long to wait or what to do."""

    def __init__(self, code: str, *, retry_after_s: int, **params):
        super().__init__(self._refuse(code, params))
        self.retry_after_s = retry_after_s


class ClientLimiter:
    def __init__(self, *, per_minute: int, concurrent: int, clock: Callable[[], float] = time.monotonic):
        self.per_minute = per_minute  # 0: no limit
        self.concurrent = concurrent  # 0: no limit
        self._clock = clock
        self._sent: dict[str, collections.deque[float]] = {}
        self._open: collections.Counter[str] = collections.Counter()
        self._calls = 0

    def check_rate(self, key: str) -> None:
        """Count one message of ``key``; raises RateLimited past ``per_minute`` in a minute."""
        self._calls += 1
        if self._calls % PRUNE_EVERY == 0:
            self._prune()
        if not self.per_minute:
            return
        now = self._clock()
        sent = self._sent.setdefault(key, collections.deque())
        while sent and sent[0] <= now - WINDOW_S:
            sent.popleft()
        if len(sent) >= self.per_minute:
            wait_s = int(sent[0] + WINDOW_S - now) + 1
            raise RateLimited("rate", retry_after_s=wait_s, per_minute=self.per_minute, wait_s=wait_s)
        sent.append(now)

    def stream(self, key: str) -> StreamSlot:
        """Take one of ``key``'s concurrent answers (release it, or use it as a context manager);
        raises RateLimited past ``concurrent``."""
        if self.concurrent and self._open[key] >= self.concurrent:
            raise RateLimited("streams", retry_after_s=1, open=self._open[key], limit=self.concurrent)
        self._open[key] += 1
        return StreamSlot(self, key)

    def _release(self, key: str) -> None:
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

    def __init__(self, limiter: ClientLimiter, key: str):
        self._limiter, self._key, self._held = limiter, key, True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._limiter._release(self._key)

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
