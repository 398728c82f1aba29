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
