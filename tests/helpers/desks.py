"""A Desk of a test's own on the session's engine: its own database, catalog or limits; and, until a test lets
them go, every answer held after its first text or the store's end of every answer."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

from app.core.desk import PROGRESS_INTERVAL_S, Desk
from app.engine.types import Delta
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


class HeldAnswers:
    """The engine's answers from now on, each held after its first text until ``release()``: a test that acts on
    an answer's first text (a Stop, a closed tab, typing) finds it still being written, however slow the machine.
    Held between the engine and the desk: vLLM may write the rest meanwhile, but no desk sees the answer's end.
    Once released, the rest reaches the desk as two parts at least, the first a frame after the hold began: the
    desk sends the page one more update before the end (a page gone meanwhile is closed at that update)."""

    def __init__(self, monkeypatch, engine):
        self.held = 0  # answers held so far, each once
        self._released = threading.Event()
        stream = engine.stream

        async def held(*args, **kwargs):
            waiting, held_at = not kwargs.get("warmup"), None
            async with contextlib.aclosing(stream(*args, **kwargs)) as parts:
                async for part in parts:
                    if held_at is not None:  # the first part after the release
                        await asyncio.sleep(max(0.0, PROGRESS_INTERVAL_S - (time.monotonic() - held_at)))
                        held_at = None
                        if isinstance(part, Delta) and part.last and len(part.text) > 1:
                            yield Delta(part.text[:1])
                            part = Delta(part.text[1:], last=True)
                    # Held after text the page shows: a first part of only spaces or a newline (a random model's
                    # token) is drawn as an empty answer, and a test waiting for the first text would wait forever.
                    hold = waiting and isinstance(part, Delta) and part.text.strip() and not part.last
                    if hold:
                        waiting = False
                        self.held += 1  # (before the text goes out: a page that shows it finds it counted)
                    yield part
                    if hold:
                        held_at = time.monotonic()
                        while not self._released.is_set():  # a Stop cancels this wait, and the request with it
                            await asyncio.sleep(0.02)

        monkeypatch.setattr(engine, "stream", held)

    def release(self) -> None:
        self._released.set()

    def hold_again(self) -> None:
        """Hold the answers that start from now on, as before the release (call it once the released ones ended)."""
        self._released.clear()
