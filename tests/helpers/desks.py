"""A Desk of a test's own on the session's engine: its own database, catalog or limits; and the store's end of
every answer held until a test lets it go."""

from __future__ import annotations

import threading

from app.core.desk import Desk
from app.db import conversations as db_conversations
from app.core.limits import ClientLimiter, FeedbackLimiter


def desk_for(services, *, db=None, catalog=None, limiter: ClientLimiter | None = None,
             tenant_secret: str = "test-secret", feedback: FeedbackLimiter | None = None) -> Desk:
    """The session's engine and prompts with ``db``, ``catalog`` and ``limiter`` of the test's choosing
    (default: the session's database and catalog, no limits)."""
    return Desk(db=db or services.db, catalog=catalog or services.catalog, engine=services.engine,
                prompts=services.prompts, limiter=limiter or ClientLimiter(per_minute=0, concurrent=0),
                tenant_secret=tenant_secret, feedback=feedback)


HOLD_S = 120  # how long a held write waits to be let go: a test that failed on the way lets the store go on


class HeldFinish:
    """The store's finish_answer from now on, each held before it writes until ``release()``."""

    def __init__(self, monkeypatch):
        self.entered = threading.Event()
        self._released = threading.Event()
        finish = db_conversations.finish_answer

        def held(s, **kwargs):
            self.entered.set()
            self._released.wait(HOLD_S)
            return finish(s, **kwargs)

        monkeypatch.setattr(db_conversations, "finish_answer", held)

    def release(self) -> None:
        self._released.set()
