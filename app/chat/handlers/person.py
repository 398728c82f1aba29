"""A person takes the conversation: the customer asks for one, and the page polls for their replies while one
has it (app/core/desk.py keeps the queue and its caps)."""

from __future__ import annotations

from typing import Any

import gradio as gr

from app.chat.context import ChatContext, _conversation_id, calm, own
from app.chat.outputs import PersonAsked, Polled, nothing
from app.chat.render import _answer_id, _answer_messages, _notice, _one_person_notice
from app.chat.text import refusal_text
from app.core.callers import TenantRefused
from app.core.desk import DeskInputError
from app.db.states import Handoff


@calm(PersonAsked)
async def ask_person(chat: ChatContext, conversation_id: Any, session_key: str, shown: list, request: gr.Request):
    """The conversation handed to a person, and the page polling for their
    replies from the last answer it shows; a full queue (the desk's caps) said in plain words."""
    key = chat.keys.browser(session_key)
    conversation_id = _conversation_id(conversation_id)
    shown = own(shown, key)
    if key is None or conversation_id is None:
        return _notified(chat, shown, chat.t["person_first"])
    try:
        asked = await chat.desk.request_person(session_key=key, conversation_id=conversation_id,
                                               client=chat.caller_of(request).address)
    except TenantRefused:
        return _notified(chat, shown, chat.t["refusals"]["no_conversation"])
    except DeskInputError as exc:
        return _notified(chat, shown, refusal_text(exc.code, exc.params, chat.language))
    handoff = await chat.desk.handoff(session_key=key, conversation_id=conversation_id)
    if not asked and not handoff:
        return _notified(chat, shown, chat.t["refusals"]["no_conversation"])
    seen = max((_answer_id(m) or 0 for m in shown), default=0)
    shown = _one_person_notice(
        shown + [_notice(chat.t["waiting_person" if handoff == Handoff.WAITING else "with_person"], chat.t)], chat.t)
    return PersonAsked(shown, shown, gr.Timer(active=True), seen)


@calm(Polled)
async def poll(chat: ChatContext, conversation_id: Any, session_key: str, shown: list, seen: Any):
    """Every few seconds while a person has the conversation: their new replies,
    marked as theirs, and the timer stopped once the conversation is handed back. Nothing new: nothing sent."""
    key = chat.keys.browser(session_key)
    conversation_id = _conversation_id(conversation_id)
    if key is None or conversation_id is None:
        return nothing(Polled)._replace(person_timer=gr.Timer(active=False))
    handoff = await chat.desk.handoff(session_key=key, conversation_id=conversation_id)
    if handoff is None:
        return nothing(Polled)._replace(person_timer=gr.Timer(active=False))
    after = seen if type(seen) is int and seen >= 0 else 0
    new = await chat.desk.messages_after(session_key=key, conversation_id=conversation_id, after_id=after)
    replies = [out for m in new if m.role == "assistant" and m.author
               for out in _answer_messages(m, chat.t, chat.language)]
    if not replies and handoff:
        return nothing(Polled)._replace(seen=max((m.id for m in new), default=gr.skip()))
    shown = list(shown or []) + replies + ([] if handoff else [_notice(chat.t["released"], chat.t)])
    return Polled(shown, shown, max((m.id for m in new), default=after), gr.Timer(active=bool(handoff)))



def _notified(chat: ChatContext, shown: list, text: str) -> PersonAsked:
    """The conversation shown with ``text`` under it, and nothing else changed."""
    return nothing(PersonAsked)._replace(chatbot=shown + [_notice(text, chat.t)])
