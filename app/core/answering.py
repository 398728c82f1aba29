"""An answer runs to its end whoever reads it.

A page that asked may go away while its answer is written (a reload, a closed tab, a lost connection): the answer
is still written to its end and stored, and a page that opens its conversation meanwhile follows it (the text so
far, then the stored answer). Only a Stop ends it early (``Answering.stop``, through Desk.stop_answers).

While a page reads the answer, the desk's events are taken when the page asks for the next (the first one at once:
the desk stores the question and the engine starts answering while the page is sent the question), so the engine's
output gathers between two updates and each carries all the text so far. Once no page reads it, they are taken as
they come.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from app.core.refusals import Refused

log = logging.getLogger(__name__)


class Answering:
    """One answer's events (``Desk.answer``, ``retry``, ``edit_last``, ``continue_answer``), driven by a task of
    its own. ``conversation_id``: the conversation it was asked in (None: a new one, learnt from its first
    event). ``on_end`` runs once it has ended, however it ended."""

    def __init__(self, events: AsyncIterator[Any], *, conversation_id: int | None,
                 on_end: Callable[[Answering], None] = lambda _: None):
        self.conversation_id = conversation_id
        self.text = ""  # the answer so far
        self.done = False
        self._events = events
        self._on_end = on_end
        self._reading = True
        self._next: Any = None  # the event the reader has not taken yet
        self._has_next = False
        self._error: BaseException | None = None
        self._wanted = asyncio.Event()  # the reader wants the next event (the first at once; no one reads: always)
        self._wanted.set()
        self._arrived = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run())  # (made on the loop that serves it)

    async def _run(self) -> None:
        try:
            while True:
                await self._wanted.wait()
                try:
                    event = await anext(self._events)
                except StopAsyncIteration:
                    return
                self._learn(event)
                self._next, self._has_next = event, True
                if self._reading:
                    self._wanted.clear()
                self._arrived.set()
        except BaseException as exc:  # a refusal, a failure, or a Stop (cancelled): the reader is told
            self._error = exc
            if not isinstance(exc, Exception):
                raise
            if not self._reading and not isinstance(exc, Refused):  # no page will log it
                log.error("an answer no page was reading failed", exc_info=exc)
        finally:
            with contextlib.suppress(BaseException):  # a generator a Stop caught between events stores itself
                await self._events.aclose()
            self.done = True
            self._arrived.set()
            self._on_end(self)

    def _learn(self, event: Any) -> None:
        text = getattr(event, "text", None)
        if isinstance(text, str):
            self.text = text
        message = getattr(event, "message", None)
        conversation_id = getattr(event, "conversation_id", None) or getattr(message, "conversation_id", None)
        if conversation_id is not None:
            self.conversation_id = conversation_id

    def __aiter__(self):
        return self

    async def __anext__(self) -> Any:
        """The next event, for the page that asked (one at a time, at its pace). A refusal or a failure of the
        desk's is raised here; a stopped answer simply ends."""
        while True:
            if self._has_next:
                event, self._next, self._has_next = self._next, None, False
                return event
            if self.done:
                if isinstance(self._error, Exception):
                    error, self._error = self._error, None
                    raise error
                raise StopAsyncIteration
            self._arrived.clear()
            self._wanted.set()  # taken now, the desk's next event carries all the text written meanwhile
            await self._arrived.wait()

    def detach(self) -> None:
        """The page stopped reading (Gradio closed its event): the answer goes on to its end by itself."""
        self._reading = False
        self._has_next = False
        self._next = None
        self._wanted.set()

    async def stop(self) -> None:
        """End the answer now (a Stop): the desk stores it as stopped. Returns once it has ended."""
        if not self._task.done():
            self._task.cancel()
        await asyncio.wait({self._task})
