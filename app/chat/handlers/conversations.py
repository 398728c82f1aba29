"""The sidebar's conversations: the page as it was left when it loads (an answer still written for it followed), a
conversation opened, renamed or deleted, and a new one begun (New, another topic, the chatbot's trash icon)."""

from __future__ import annotations

from typing import Any

import gradio as gr

from app.chat.context import ChatContext, _conversation_id, calm
from app.chat.handlers.answers import following
from app.chat.outputs import Begun, Loaded, Opened, Renamed, nothing
from app.chat.render import _choices


@calm(Loaded)
async def on_load(chat: ChatContext, session_key: str, open_id: Any):
    """The page as it was
    left — the conversation it had open (kept in the browser) shown again, after a reload or a server
    restart alike."""
    key = chat.keys.browser(session_key)
    choose = chat.picker()
    if key is None:  # a browser this server has not seen (or a key it did not issue) has nothing to list
        return Loaded(chat.keys.mint_browser(), choose,
                      gr.update(choices=[], value=None, label=chat.t["no_conversations"]),
                      chat.loaded_chat(choose["value"]), [], None, gr.Timer(active=False), 0, gr.skip())
    open_id = _conversation_id(open_id)
    listed = await chat.desk.list_conversations(session_key=key)
    now = next((c for c in listed if c.id == open_id), None)
    found = await chat.stored(key, open_id) if now is not None else None
    if found is None:
        return Loaded(key, choose, _choices(listed, chat.t), chat.loaded_chat(choose["value"]), [], None,
                      gr.Timer(active=False), 0, gr.skip())
    if any(name == now.template for _, name in choose["choices"]):
        choose["value"] = now.template
    messages = chat.with_handoff(found[0], now)
    # An answer asked for before the reload is still written: shown so far, and followed (answers.follow).
    answering = chat.desk.answering(session_key=key, conversation_id=open_id)
    shown = following(messages, answering.text) if answering is not None else messages
    return Loaded(key, choose, _choices(listed, chat.t, open_id), chat.loaded_chat(now.template, shown, found[1]),
                  messages, open_id, *chat.watch(now, found[1]),
                  gr.Timer(active=True) if answering is not None else gr.skip())


@calm(Opened)
async def open_conversation(chat: ChatContext, chosen: Any, session_key: str):
    """The conversation the customer picked in the sidebar. Its value is the page's own (the Radio is not
    preprocessed: a server that restarted knows none of this page's choices), so it is checked here: a
    conversation id this browser owns, or nothing happens but a fresh list."""
    key = chat.keys.browser(session_key)  # a key this server did not issue opens nothing
    conversation_id = _conversation_id(chosen)
    if key is None:
        return nothing(Opened)
    listed = await chat.desk.list_conversations(session_key=key)
    now = next((c for c in listed if c.id == conversation_id), None)
    found = await chat.stored(key, conversation_id) if now is not None else None
    if found is None:
        return nothing(Opened)._replace(conversations=_choices(listed, chat.t))
    messages = chat.with_handoff(found[0], now)
    return Opened(chat.empty_chat(now.template, messages, found[1]), messages, conversation_id, now.template,
                  _choices(listed, chat.t, conversation_id), *chat.watch(now, found[1]))


@calm(Renamed)
async def rename(chat: ChatContext, title: Any, conversation_id: Any, session_key: str):
    """The sidebar, and the title box emptied: the open conversation under the customer's own title."""
    key = chat.keys.browser(session_key)
    conversation_id = _conversation_id(conversation_id)
    if key is None or conversation_id is None:
        return nothing(Renamed)
    if not await chat.desk.rename(session_key=key, conversation_id=conversation_id, title=title):
        return nothing(Renamed)
    return Renamed(_choices(await chat.desk.list_conversations(session_key=key), chat.t, conversation_id), "")


@calm(Begun)
async def delete(chat: ChatContext, conversation_id: Any, session_key: str, template: Any):
    """The open conversation off the list, and a new one begun."""
    key = chat.keys.browser(session_key)
    conversation_id = _conversation_id(conversation_id)
    if key is None or conversation_id is None:
        return nothing(Begun)
    await chat.desk.delete(session_key=key, conversation_id=conversation_id)
    listed = await chat.desk.list_conversations(session_key=key)
    return Begun(chat.empty_chat(template), [], None, _choices(listed, chat.t), gr.Timer(active=False))


def fresh(chat: ChatContext, template: Any) -> Begun:
    """A new conversation: the empty chat of the topic, with its suggested questions."""
    return Begun(chat.empty_chat(template), [], None, gr.update(value=None), gr.Timer(active=False))


@calm(Begun)
async def change_topic(chat: ChatContext, template: Any, conversation_id: Any, session_key: str):
    """Another topic picked: a new conversation of it. The picker also reports leaving it without a pick (its
    blur): the topic of the open conversation again changes nothing."""
    key = chat.keys.browser(session_key)
    conversation_id = _conversation_id(conversation_id)
    if key is not None and conversation_id is not None:
        listed = await chat.desk.list_conversations(session_key=key)
        if any(c.id == conversation_id and c.template == template for c in listed):
            return nothing(Begun)
    return fresh(chat, template)
