"""What every handler of one chat page shares: the desk, the page's language and words, the session keys and
the proxy's trust (``ChatContext``, built once per page by page.py), and the checks of what a browser sends.

Handlers stay thin: they check the session key (app/core/session_keys.py) and translate between Gradio's values
and the Desk's events. The server-side state (the conversation shown) is returned only to a caller with a key
this server issued (``own``): an event run without one — by whoever took over a session's hash — gets nothing of
it back.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any, NamedTuple

import gradio as gr

from app.chat.outputs import Screen, nothing
from app.chat.render import _feedback, _history_messages, _notice, _one_person_notice
from app.chat.stream import update_interval_s
from app.chat.text import TEXT, refusal_text
from app.core.callers import ProxyTrust
from app.core.desk import MAX_MESSAGE_CHARS, Desk
from app.core.refusals import Refused
from app.core.session_keys import SessionKeys
from app.db.rows import ConversationRow, MessageRow
from app.db.states import Handoff
from app.engine import EngineInfo

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ChatContext:
    """One chat page's shared parts. ``updates_per_s``: the screen updates all streaming answers share
    (PREFIXDESK_CHAT_UPDATES_PER_S)."""
    desk: Desk
    info: EngineInfo
    language: str
    keys: SessionKeys
    trust: ProxyTrust
    updates_per_s: int = 2000
    # The default topic's questions are the page's own: a page loading on it needs no update (loaded_chat).
    default_questions: list[str] = dataclasses.field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "default_questions", self.suggested(self.picker()["value"]))

    @property
    def t(self) -> dict:
        """The page's words, in its language."""
        return TEXT[self.language]

    def pace_s(self) -> float:
        return update_interval_s(self.desk.engine.in_flight, self.updates_per_s)

    def caller_of(self, request: gr.Request | None):
        headers = dict(request.headers) if request is not None else {}
        peer = request.client.host if request is not None and request.client else None
        return self.trust.caller(peer, headers)

    def topics(self) -> list[tuple[str, str]]:
        """(title, name) of each topic a customer may pick: those in the page's language, else all."""
        shown = self.desk.catalog.customer_facing(self.language) or self.desk.catalog.customer_facing()
        return [(tpl.shown_name, tpl.name) for tpl in shown]

    def picker(self) -> dict:
        choices = self.topics()
        return gr.update(choices=choices, value=choices[0][1] if choices else None)

    def suggested(self, template: Any) -> list[str]:
        """The questions an empty chat of ``template`` suggests (a topic customers may pick; else none)."""
        tpl = next((x for x in self.desk.catalog.customer_facing() if x.name == template), None) \
            if isinstance(template, str) else None
        return list(tpl.examples) if tpl else []

    def empty_chat(self, template: Any, messages: list | None = None, rows: list[MessageRow] = ()) -> dict:
        """The chatbot showing ``messages`` (none: an empty chat) with the thumbs ``rows`` hold, and the topic's
        suggested questions (Gradio shows them only while the chat is empty)."""
        questions = self.suggested(template)
        return gr.update(value=messages or [], examples=[{"text": q} for q in questions] or None,
                         feedback_value=_feedback(messages or [], rows))

    def loaded_chat(self, template: Any, messages: list | None = None, rows: list[MessageRow] = ()) -> list | dict:
        """The chatbot as a page loads: its bare value when the page's own (the default topic's questions, no
        thumbs) is right, which costs Gradio no component of the session's own; else ``empty_chat``."""
        if (messages and not any(r.rating for r in rows)) or \
                (not messages and self.suggested(template) == self.default_questions):
            return messages or []
        return self.empty_chat(template, messages, rows)

    def say(self, exc: Exception) -> str:
        """A refusal in the customer's words (a caller the proxy settings refuse: the general apology)."""
        if isinstance(exc, Refused):
            return refusal_text(exc.code, exc.params, self.language)
        return self.t["internal"]

    def refused(self, shown: list, text: str, conversation_id, session_key: str, message: Any = "", *,
                key: str | None = "") -> Screen:
        """The screen after a refusal: the conversation as it was with the notice (which so replaces an earlier
        notice, never stacks on it), the shown state as it was, and ``message`` to hand back to the box (one the
        box could hold; anything larger is nobody's typing). ``key`` None: the caller has no key this server
        issued, and changes nothing of the session's state either."""
        back = message if isinstance(message, str) and len(message) <= MAX_MESSAGE_CHARS else ""
        return Screen(shown + [_notice(text, self.t)], gr.skip() if key is None else shown, conversation_id,
                      session_key, back)

    async def stored(self, key: str, conversation_id: int | None) -> tuple[list[dict], list[MessageRow]] | None:
        """The shown messages of a conversation this browser owns, and its rows; None when it has none such."""
        rows = None if conversation_id is None else await self.desk.conversation(session_key=key,
                                                                                 conversation_id=conversation_id)
        return None if rows is None else (_history_messages(rows, self.t, self.language), rows)

    def watch(self, now: ConversationRow | None, rows: list[MessageRow]) -> tuple:
        """(timer, last seen id): the page polls for a person's replies only while one has the conversation."""
        return gr.Timer(active=bool(now and now.handoff)), max((m.id for m in rows), default=0)

    def with_handoff(self, messages: list[dict], now: ConversationRow) -> list[dict]:
        if now.handoff:
            messages = _one_person_notice(messages + [
                _notice(self.t["waiting_person" if now.handoff == Handoff.WAITING else "with_person"], self.t)], self.t)
        return messages


def own(shown: Any, key: str | None) -> list:
    """The session's shown conversation for a caller with a key this server issued (``key``, checked); for
    anyone else nothing of it: whoever runs an event in a session they took over without the page's key
    reads none of the state the page left on the server."""
    return list(shown) if key is not None and isinstance(shown, list) else []


def _conversation_id(value: Any) -> int | None:
    """A conversation id as the browser holds it: a positive integer, or None for anything else."""
    return value if type(value) is int and 0 < value < 2**63 else None


def calm(outputs: type[NamedTuple]):
    """A short handler that never shows Gradio's error: on an unexpected exception it logs it and leaves its
    ``outputs`` as they are."""
    def wrap(fn):
        @functools.wraps(fn)
        async def run(*args, **kwargs):
            try:
                return await fn(*args, **kwargs)
            except Exception:
                log.exception("chat handler %s failed", fn.__name__)
                return nothing(outputs)
        return run
    return wrap
