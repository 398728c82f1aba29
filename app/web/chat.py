"""The chat page: template picker, conversations, send / stop / retry — and the scriptable ``/chat``.

The conversation a customer sees is rebuilt from the database after every answer and kept in
server-side state; the chatbot is only ever an output, so no value a browser sends is echoed back
as a component value (Gradio would serve a file named in such a value). Every text in it is shown
as text, except answers (the model's and a person's), which are safe Markdown made into HTML here
(app/web/render.py): HTML written in any message is escaped, an image stays text and a link goes only to
http(s) or mailto, so no message can draw a form or fetch an image. Nothing a browser sends is kept before
the desk has taken it in: a refused message leaves the conversation state as it was (and goes back to the message box).
Handlers stay thin: they check the session key (app/core/session_keys.py) and translate between
Gradio's values and the Desk's events. The server-side state (the conversation shown) is returned only
to a caller with a key this server issued (``own``): an event run without one — by whoever took over
a session's hash — gets nothing of it back.

Streaming is where the page spends its server's time, so its events do the least Gradio lets them
(docs/benchmarks.md, "The chat path"): their outputs are the chatbot, the server-side states and the
session key, with no ``gr.skip()`` of a component (Gradio 6 rebuilds a component for each skip: 1.1
of the 1.7 ms an update cost; and the page sets every output again from every update, so an output
cannot simply repeat its value either); Gradio's postprocessing is off for them, because the messages
are built here in the chatbot's own format, each once (the history when the answer starts, then only
the answer); the page empties the message box itself; and the sidebar's list is refreshed once,
after the answer, by a short event of its own (which also hands a refused message back to the box).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import html
import inspect
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import gradio as gr

from app.core.callers import ProxyTrust, TenantRefused
from app.core.desk import (MAX_FIRST_VISIBLE_MS, MAX_MESSAGE_CHARS, PERSON_MARKERS, WITH_PERSON, Desk,
                           DeskInputError, Finished, Progress)
from app.core.prompts import Turn
from app.core.session_keys import SessionKeys
from app.db.rows import ConversationRow, MessageRow
from app.db.states import AnswerStatus, Handoff
from app.engine import EngineInfo
from app.core.refusals import Refused
from app.web.chat_text import API_TEXT, TEXT, caption_details, caption_title, refusal_text
from app.web.render import markdown_html, streaming_html

PERSON_POLL_S = 3.0  # how often a page whose conversation a person has asks for their replies
# Ten updates a second read as smooth streaming; each one makes the page render the whole answer again,
# and at the desk's fifty a second a slow or busy device falls seconds behind and stops answering clicks.
# Under load the interval grows (update_interval_s): the server's cost is per update, not per token.
UI_UPDATE_INTERVAL_S = 0.1
# Runs in the page when a question is sent, after its inputs were read (Gradio runs an event's js between reading
# its inputs and calling the server, and not at all when the event is skipped because an answer still streams).
# The question is kept in the browser until the page shows it (static/chat.js: a lost connection gives it back).
# A question sent right after New (or another topic, or Delete) starts a new conversation even when it leaves before
# the server has emptied the page's conversation (static/chat.js sets the mark): its conversation id is dropped.
CLEAR_BOX_JS = """(...inputs) => {
  if (window.__pdFresh) { inputs[2] = null; window.__pdFresh = false; }
  const box = document.querySelector('#message textarea');
  if (box) {
    try { localStorage.setItem('prefixdesk-sending', box.value); localStorage.removeItem('prefixdesk-draft'); }
    catch (e) {}
    box.value = ''; box.dispatchEvent(new Event('input', {bubbles: true}));
  }
  return inputs;
}"""
# The same for a suggested question (its inputs: the topic, then the conversation id).
SUGGESTED_JS = """(...inputs) => {
  if (window.__pdFresh) { inputs[1] = null; window.__pdFresh = false; }
  return inputs;
}"""

log = logging.getLogger(__name__)
STATIC = Path(__file__).with_name("static")
CSS = (STATIC / "chat.css").read_text(encoding="utf-8")
# The page's script: the browser's first-glyph clock, and the sidebar closed on a phone.
JS = (STATIC / "chat.js").read_text(encoding="utf-8")


def page_js(language: str) -> str:
    """The page's script with the texts it shows itself, in the UI language."""
    t = TEXT[language]
    shown = ("offline", "offline_title", "cut_off", "notice", "waiting_person", "with_person", "released", "pasted_cut",
             "delete_confirm")
    return JS.replace("/*PD_TEXT*/{}", json.dumps({k: t[k] for k in shown}))


def build_chat(desk: Desk, info: EngineInfo, *, language: str, browser_secret: str, keys: SessionKeys,
               trust: ProxyTrust, model_name: str, updates_per_s: int = 2000) -> gr.Blocks:
    """The chat page. ``browser_secret`` encrypts the browser's copy of its session key (every page
    carries it: it is no secret from the browser); ``keys`` issues and checks the session keys. Both
    must outlive restarts. ``updates_per_s``: the screen updates all streaming answers share
    (PREFIXDESK_CHAT_UPDATES_PER_S)."""
    t = TEXT[language]

    def pace_s() -> float:
        return update_interval_s(desk.engine.in_flight, updates_per_s)

    def caller_of(request: gr.Request | None):
        headers = dict(request.headers) if request is not None else {}
        peer = request.client.host if request is not None and request.client else None
        return trust.caller(peer, headers)

    def topics() -> list[tuple[str, str]]:
        """(title, name) of each topic a customer may pick: those in the page's language, else all."""
        shown = desk.catalog.customer_facing(language) or desk.catalog.customer_facing()
        return [(tpl.shown_name, tpl.name) for tpl in shown]

    def picker() -> dict:
        choices = topics()
        return gr.update(choices=choices, value=choices[0][1] if choices else None)

    def suggested(template: Any) -> list[str]:
        """The questions an empty chat of ``template`` suggests (a topic customers may pick; else none)."""
        tpl = next((x for x in desk.catalog.customer_facing() if x.name == template), None) \
            if isinstance(template, str) else None
        return list(tpl.examples) if tpl else []

    def empty_chat(template: Any, messages: list | None = None, rows: list[MessageRow] = ()) -> dict:
        """The chatbot showing ``messages`` (none: an empty chat) with the thumbs ``rows`` hold, and the topic's
        suggested questions (Gradio shows them only while the chat is empty)."""
        questions = suggested(template)
        return gr.update(value=messages or [], examples=[{"text": q} for q in questions] or None,
                         feedback_value=_feedback(messages or [], rows))

    def loaded_chat(template: Any, messages: list | None = None, rows: list[MessageRow] = ()) -> list | dict:
        """The chatbot as a page loads: its bare value when the page's own (the default topic's questions, no
        thumbs) is right, which costs Gradio no component of the session's own; else ``empty_chat``."""
        if (messages and not any(r.rating for r in rows)) or (not messages and suggested(template) == default_questions):
            return messages or []
        return empty_chat(template, messages, rows)

    def say(exc: Exception) -> str:
        """A refusal in the customer's words (a caller the proxy settings refuse: the general apology)."""
        if isinstance(exc, Refused):
            return refusal_text(exc.code, exc.params, language)
        return t["internal"]

    def refused(shown: list, text: str, conversation_id, session_key: str, message: Any = "", *,
                key: str | None = "") -> tuple:
        """The screen after a refusal: the conversation as it was with the notice (which so replaces an earlier
        notice, never stacks on it), the shown state as it was, and ``message`` to hand back to the box (one the
        box could hold; anything larger is nobody's typing). ``key`` None: the caller has no key this server
        issued, and changes nothing of the session's state either."""
        back = message if isinstance(message, str) and len(message) <= MAX_MESSAGE_CHARS else ""
        return shown + [_notice(text, t)], gr.skip() if key is None else shown, conversation_id, session_key, back

    async def stored(key: str, conversation_id: int | None) -> tuple[list[dict], list[MessageRow]] | None:
        """The shown messages of a conversation this browser owns, and its rows; None when it has none such."""
        rows = None if conversation_id is None else await desk.conversation(session_key=key,
                                                                            conversation_id=conversation_id)
        return None if rows is None else (_history_messages(rows, t, language), rows)

    def watch(now: ConversationRow | None, rows: list[MessageRow]) -> tuple:
        """(timer, last seen id): the page polls for a person's replies only while one has the conversation."""
        return gr.Timer(active=bool(now and now.handoff)), max((m.id for m in rows), default=0)

    def with_handoff(messages: list[dict], now: ConversationRow) -> list[dict]:
        if now.handoff:
            messages = _one_person_notice(
                messages + [_notice(t["waiting_person" if now.handoff == Handoff.WAITING else "with_person"], t)], t)
        return messages

    @_calm(8)
    async def on_load(session_key: str, open_id: Any):
        """(session key, picker, sidebar, chatbot, shown, open conversation, timer, seen): the page as it was
        left — the conversation it had open (kept in the browser) shown again, after a reload or a server
        restart alike."""
        key = keys.browser(session_key)
        choose = picker()
        if key is None:  # a browser this server has not seen (or a key it did not issue) has nothing to list
            return (keys.mint_browser(), choose,
                    gr.update(choices=[], value=None, label=t["no_conversations"]),
                    loaded_chat(choose["value"]), [], None, gr.Timer(active=False), 0)
        open_id = _conversation_id(open_id)
        listed = await desk.list_conversations(session_key=key)
        now = next((c for c in listed if c.id == open_id), None)
        found = await stored(key, open_id) if now is not None else None
        if found is None:
            return (key, choose, _choices(listed, t), loaded_chat(choose["value"]), [], None,
                    gr.Timer(active=False), 0)
        if any(name == now.template for _, name in choose["choices"]):
            choose["value"] = now.template
        messages = with_handoff(found[0], now)
        return (key, choose, _choices(listed, t, open_id), loaded_chat(now.template, messages, found[1]),
                messages,
                open_id, *watch(now, found[1]))

    async def on_screen(shown: list, base: list, conversation_id, session_key: str, events, *, restore: Any = "",
                        rows: list[MessageRow] | None = None):
        """(chatbot, shown, conversation id, session key, returned) while the desk's ``events`` run: the
        question at once, then the answer as it streams, then the stored conversation. A refusal shows the
        conversation as it was (``shown``) with the desk's notice, and hands ``restore`` back to the box.
        ``rows``: the stored conversation, when the answer replaces the last one (Retry, an edit): the thumbs
        shown are set again from it, so the old answer's 👍 does not mark the new one."""
        events = _Ahead(events)
        try:
            first = base if rows is None else gr.update(value=base, feedback_value=_feedback(base, rows))
            yield first, base, conversation_id, session_key, gr.skip()
            async for update in _stream(events, base, conversation_id, session_key, t, language, pace_s):
                yield update
        except DeskInputError as exc:
            yield marked(refused(shown, say(exc), conversation_id, session_key, restore), rows)
        except Exception:  # never Gradio's red "Error" over the chat: the stored conversation stays as it was
            log.exception("the chat's answer failed")
            yield marked(refused(shown, t["internal"], conversation_id, session_key, restore), rows)
        finally:
            await events.aclose()

    def marked(screen: tuple, rows: list[MessageRow] | None) -> tuple:
        """A refusal's screen with the stored thumbs marked again, when the answer's first update had set them
        for the conversation without its last answer (Retry, an edit)."""
        if rows is None:
            return screen
        return (gr.update(value=screen[0], feedback_value=_feedback(screen[0], rows)), *screen[1:])

    async def send(message: Any, template: str, conversation_id: Any, session_key: str, shown: list,
                   request: gr.Request):
        async for update in ask(message, template, conversation_id, session_key, shown, request):
            yield update

    async def ask_suggested(choice: gr.SelectData, template: Any, conversation_id: Any, session_key: str,
                            shown: list, request: gr.Request):
        """A suggested question the customer clicked, asked as if typed. The page names it by its place; the
        text is the topic's own (what the page sends as its text is not read)."""
        shown = own(shown, keys.browser(session_key))
        questions = suggested(template)
        index = choice.index if type(choice.index) is int else -1
        if not 0 <= index < len(questions):
            yield gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()
            return
        clicked = choice.value.get("text") if isinstance(choice.value, dict) else None
        if clicked != questions[index]:  # the page showed other questions (changed since): it gets today's
            yield empty_chat(template, shown), gr.skip(), gr.skip(), gr.skip(), gr.skip()
            return
        async for update in ask(questions[index], template, conversation_id, session_key, shown, request):
            yield update

    async def edit(change: gr.EditData, conversation_id: Any, session_key: str, shown: list, request: gr.Request):
        """The customer edited their last question: it is asked again as edited, and the new question and answer
        replace the old ones on screen (the old ones stay in the record). An earlier question cannot be edited."""
        key = keys.browser(session_key)
        shown = own(shown, key)
        conversation_id = _conversation_id(conversation_id)
        found = None if key is None or conversation_id is None else \
            await desk.conversation(session_key=key, conversation_id=conversation_id)
        if conversation_id is not None and key is not None and found is None:  # not this browser's
            yield refused(shown, t["refusals"]["no_conversation"], conversation_id, session_key)
            return
        rows = found or []
        if not shown:  # a server that forgot this page: the screen from the store
            shown = _history_messages(rows, t, language)
        last_user = max((i for i, m in enumerate(shown) if isinstance(m, dict) and m.get("role") == "user"),
                        default=None)
        index = change.index if type(change.index) is int else None
        if conversation_id is None or key is None or last_user is None:
            yield refused(shown, t["refusals"]["nothing_to_edit"], conversation_id, session_key, key=key)
            return
        if index != last_user:
            yield refused(shown, t["refusals"]["edit_last_only"], conversation_id, session_key)
            return
        value = change.value
        if value is None or (isinstance(value, str) and not value.strip()):
            yield refused(shown, t["empty"], conversation_id, session_key)
            return
        try:
            caller = caller_of(request)
            admitted = desk.admit(client=caller.address, message=value, browser=key)
        except (TenantRefused, DeskInputError) as exc:
            yield refused(shown, say(exc), conversation_id, session_key)
            return
        edited = shown[last_user]
        events = desk.edit_last(session_key=key, client=caller.address, conversation_id=conversation_id,
                                message=admitted, replaces=lambda text: _message("user", text) == edited,
                                tenant=caller.tenant)
        base = shown[:last_user] + [_message("user", admitted.text)]
        async for update in on_screen(shown, base, conversation_id, key, events, rows=rows):
            yield update

    async def ask(message: Any, template: Any, conversation_id: Any, session_key: str, shown: list,
                  request: gr.Request):
        key = keys.browser(session_key)
        shown = own(shown, key)
        conversation_id = _conversation_id(conversation_id)
        if message is None or (isinstance(message, str) and not message.strip()):
            yield refused(shown, t["empty"], conversation_id, session_key, key=key)
            return
        try:  # type, rate and size, before anything keeps the message
            caller = caller_of(request)
            admitted = desk.admit(client=caller.address, message=message, browser=keys.browser(session_key) or "")
        except (TenantRefused, DeskInputError) as exc:
            yield refused(shown, say(exc), conversation_id, session_key, message, key=key)
            return
        if key is None:  # not a key this server issued (a page from before its key changed, or forged): write nothing
            yield refused([], t["expired"], None, keys.mint_browser(), message)
            return
        if conversation_id is not None and not shown:  # a server that forgot this page: the screen from the store
            found = await stored(key, conversation_id)
            shown = found[0] if found else []
        events = desk.answer(session_key=key, client=caller.address,
                             template_name=template if isinstance(template, str) else "", message=admitted,
                             conversation_id=conversation_id, tenant=caller.tenant)
        base = shown + [_message("user", admitted.text)]
        async for update in on_screen(shown, base, conversation_id, key, events, restore=message):
            yield update

    async def answer_again(conversation_id: Any, session_key: str, shown: list, request: gr.Request, *,
                           go_on: bool):
        """Retry (a new answer to the last question) or Continue (``go_on``: the cut-off last answer goes on)."""
        key = keys.browser(session_key)
        shown = own(shown, key)
        conversation_id = _conversation_id(conversation_id)
        if conversation_id is None or key is None:
            yield refused(shown, t["nothing_to_retry"], conversation_id, session_key, key=key)
            return
        try:
            caller = caller_of(request)
        except TenantRefused as exc:
            yield refused(shown, say(exc), conversation_id, session_key)
            return
        rows = await desk.conversation(session_key=key, conversation_id=conversation_id) or []
        if not shown:
            shown = _history_messages(rows, t, language)
        last_user = max((i for i, m in enumerate(rows) if m.role == "user"), default=None)
        base = _history_messages(rows[:last_user + 1] if last_user is not None else rows, t, language)
        run = desk.continue_answer if go_on else desk.retry
        events = run(session_key=key, client=caller.address, conversation_id=conversation_id, tenant=caller.tenant)
        async for update in on_screen(shown, base, conversation_id, key, events, rows=rows):
            yield update

    async def retry(conversation_id: Any, session_key: str, shown: list, request: gr.Request):
        async for update in answer_again(conversation_id, session_key, shown, request, go_on=False):
            yield update

    async def go_on(conversation_id: Any, session_key: str, shown: list, request: gr.Request):
        async for update in answer_again(conversation_id, session_key, shown, request, go_on=True):
            yield update

    @_calm(5)
    async def after_answer(session_key: str, returned: str, open_id: Any, shown: list):
        """The sidebar's list once an answer is stored (the open conversation marked), a refused message back
        in the box, and the poll for a person's replies started when the answer handed the conversation to one."""
        key = keys.browser(session_key)
        open_id = _conversation_id(open_id)
        if not key:
            return gr.update(choices=[], value=None, label=t["no_conversations"]), gr.skip(), gr.skip(), \
                gr.skip(), gr.skip()
        listed = await desk.list_conversations(session_key=key)
        now = next((c for c in listed if c.id == open_id), None)
        timer, seen = gr.skip(), gr.skip()
        if now is not None and now.handoff:  # polled from the last answer shown: a reply stored meanwhile comes too
            timer, seen = gr.Timer(active=True), max((_answer_id(m) or 0 for m in shown or []), default=0)
        if not returned:
            return _choices(listed, t, open_id), gr.skip(), gr.skip(), timer, seen
        return _choices(listed, t, open_id), returned, "", timer, seen

    @_calm(4)
    async def after_stop(conversation_id: Any, session_key: str, shown: list):
        """The stored conversation once the cancelled answer has stored itself as stopped (awaited on its own
        end, no deadline: app/core/desk.py settled_conversation), and the sidebar's list with it. A Stop that
        landed before the answer's first text finds the conversation it started (the page did not learn its id
        yet): the browser's newest, if the desk began it for this browser's last new question."""
        key = keys.browser(session_key)
        conversation_id = _conversation_id(conversation_id)
        if key is None:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip()
        await desk.turns_written(session_key=key)  # a question the Stop caught on its way is stored first
        listed = await desk.list_conversations(session_key=key)
        if conversation_id is None:  # the newest, if this browser's last question on this desk began it
            newest = listed[0] if listed else None
            started = await desk.last_started(session_key=key)
            if newest is None or newest.id != started or newest.num_messages > 2:
                return gr.skip(), gr.skip(), gr.skip(), _choices(listed, t)
            conversation_id = newest.id
        rows = await desk.settled_conversation(session_key=key, conversation_id=conversation_id) or []
        messages = _history_messages(rows, t, language)
        return messages, messages, conversation_id, _choices(listed, t, conversation_id)

    @_calm(2)
    async def report_first_visible(report: Any, conversation_id: Any, session_key: str, shown: list,
                                   request: gr.Request):
        """The page's own measure of its last answer's first text (chat.js): stored with the answer, and the
        caption's title says it. Anything but a whole number of milliseconds in range is ignored."""
        key = keys.browser(session_key)
        ms = _first_visible_ms(report)
        conversation_id = _conversation_id(conversation_id)
        if key is None or ms is None or conversation_id is None:
            return gr.skip(), gr.skip()
        try:
            client = caller_of(request).address
        except TenantRefused:
            return gr.skip(), gr.skip()
        row = await desk.first_visible(session_key=key, conversation_id=conversation_id, ms=ms, client=client)
        shown = list(shown or [])
        last = next((i for i in range(len(shown) - 1, -1, -1) if (shown[i].get("metadata") or {}).get("title")), None)
        if row is None or last is None:
            return gr.skip(), gr.skip()
        shown[last:] = _answer_messages(row, t, language)[-1:] + shown[last + 1:]
        return shown, shown

    @_calm(7)
    async def open_conversation(chosen: Any, session_key: str):
        """The conversation the customer picked in the sidebar. Its value is the page's own (the Radio is not
        preprocessed: a server that restarted knows none of this page's choices), so it is checked here: a
        conversation id this browser owns, or nothing happens but a fresh list."""
        key = keys.browser(session_key)  # a key this server did not issue opens nothing
        conversation_id = _conversation_id(chosen)
        if key is None:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()
        listed = await desk.list_conversations(session_key=key)
        now = next((c for c in listed if c.id == conversation_id), None)
        found = await stored(key, conversation_id) if now is not None else None
        if found is None:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip(), _choices(listed, t), gr.skip(), gr.skip()
        messages = with_handoff(found[0], now)
        return (empty_chat(now.template, messages, found[1]), messages, conversation_id, now.template,
                _choices(listed, t, conversation_id), *watch(now, found[1]))

    @_calm(4)
    async def ask_person(conversation_id: Any, session_key: str, shown: list, request: gr.Request):
        """(chatbot, shown, timer, seen): the conversation handed to a person, and the page polling for their
        replies from the last answer it shows; a full queue (the desk's caps) said in plain words."""
        key = keys.browser(session_key)
        conversation_id = _conversation_id(conversation_id)
        shown = own(shown, key)
        if key is None or conversation_id is None:
            return shown + [_notice(t["person_first"], t)], gr.skip(), gr.skip(), gr.skip()
        try:
            asked = await desk.request_person(session_key=key, conversation_id=conversation_id,
                                              client=caller_of(request).address)
        except TenantRefused:
            return shown + [_notice(t["refusals"]["no_conversation"], t)], gr.skip(), gr.skip(), gr.skip()
        except DeskInputError as exc:
            return shown + [_notice(refusal_text(exc.code, exc.params, language), t)], gr.skip(), gr.skip(), \
                gr.skip()
        handoff = await desk.handoff(session_key=key, conversation_id=conversation_id)
        if not asked and not handoff:
            return shown + [_notice(t["refusals"]["no_conversation"], t)], gr.skip(), gr.skip(), gr.skip()
        seen = max((_answer_id(m) or 0 for m in shown), default=0)
        shown = _one_person_notice(
            shown + [_notice(t["waiting_person" if handoff == Handoff.WAITING else "with_person"], t)], t)
        return shown, shown, gr.Timer(active=True), seen

    @_calm(4)
    async def poll(conversation_id: Any, session_key: str, shown: list, seen: Any):
        """(chatbot, shown, seen, timer) every few seconds while a person has the conversation: their new replies,
        marked as theirs, and the timer stopped once the conversation is handed back. Nothing new: nothing sent."""
        key = keys.browser(session_key)
        conversation_id = _conversation_id(conversation_id)
        if key is None or conversation_id is None:
            return gr.skip(), gr.skip(), gr.skip(), gr.Timer(active=False)
        handoff = await desk.handoff(session_key=key, conversation_id=conversation_id)
        if handoff is None:
            return gr.skip(), gr.skip(), gr.skip(), gr.Timer(active=False)
        after = seen if type(seen) is int and seen >= 0 else 0
        new = await desk.messages_after(session_key=key, conversation_id=conversation_id, after_id=after)
        replies = [out for m in new if m.role == "assistant" and m.author for out in _answer_messages(m, t, language)]
        if not replies and handoff:
            return gr.skip(), gr.skip(), max((m.id for m in new), default=gr.skip()), gr.skip()
        shown = list(shown or []) + replies + ([] if handoff else [_notice(t["released"], t)])
        return shown, shown, max((m.id for m in new), default=after), gr.Timer(active=bool(handoff))

    @_calm(4)
    async def rated(data: gr.LikeData, shown: list, session_key: str, request: gr.Request):
        """(reason row, rating for, reason box, thanks): 👍 or 👎 on an answer, kept at once; 👎 asks for an optional
        reason (and an earlier reason's thanks goes)."""
        key = keys.browser(session_key)
        shown = shown or []
        index = data.index if type(data.index) is int else -1
        # Gradio names an answer's group by its first message; its caption, which holds the answer's id, is last.
        group = []
        for message in shown[index:] if 0 <= index < len(shown) else []:
            if not isinstance(message, dict) or message.get("role") != "assistant":
                break
            group.append(message)
        message_id = next((ref for m in reversed(group) if (ref := _answer_id(m)) is not None), None)
        if key is None or message_id is None or data.liked not in (True, False):
            return gr.skip(), gr.skip(), gr.skip(), gr.skip()
        thumbs = 1 if data.liked else -1
        try:
            client = caller_of(request).address
        except TenantRefused:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip()
        if not await desk.rate(session_key=key, message_id=message_id, thumbs=thumbs, client=client):
            return gr.skip(), gr.skip(), gr.skip(), gr.skip()
        return gr.Row(visible=thumbs < 0), message_id if thumbs < 0 else None, "", gr.Markdown(visible=False)

    @_calm(4)
    async def send_reason(reason: Any, rating_for: Any, session_key: str, request: gr.Request):
        """(reason row, rating for, reason box, thanks): the 👎's reason kept, and the customer thanked for it."""
        key = keys.browser(session_key)
        kept = False
        if key is not None and type(rating_for) is int and isinstance(reason, str) and len(reason) <= 500:
            with contextlib.suppress(TenantRefused):
                kept = await desk.rate(session_key=key, message_id=rating_for, thumbs=-1, reason=reason,
                                       client=caller_of(request).address)
        return gr.Row(visible=False), None, "", gr.Markdown(visible=bool(kept))

    @_calm(2)
    async def rename(title: Any, conversation_id: Any, session_key: str):
        """(sidebar, title box): the open conversation under the customer's own title."""
        key = keys.browser(session_key)
        conversation_id = _conversation_id(conversation_id)
        if key is None or conversation_id is None:
            return gr.skip(), gr.skip()
        if not await desk.rename(session_key=key, conversation_id=conversation_id, title=title):
            return gr.skip(), gr.skip()
        return await _conversation_choices(desk, key, t, conversation_id), ""

    @_calm(5)
    async def delete(conversation_id: Any, session_key: str, template: Any):
        """The open conversation off the list, and a new one begun."""
        key = keys.browser(session_key)
        conversation_id = _conversation_id(conversation_id)
        if key is None or conversation_id is None:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()
        await desk.delete(session_key=key, conversation_id=conversation_id)
        return empty_chat(template), [], None, await _conversation_choices(desk, key, t), gr.Timer(active=False)

    def fresh(template: Any):
        """A new conversation: the empty chat of the topic, with its suggested questions."""
        return empty_chat(template), [], None, gr.update(value=None), gr.Timer(active=False)

    @_calm(5)
    async def change_topic(template: Any, conversation_id: Any, session_key: str):
        """Another topic picked: a new conversation of it. The picker also reports leaving it without a pick (its
        blur): the topic of the open conversation again changes nothing."""
        key = keys.browser(session_key)
        conversation_id = _conversation_id(conversation_id)
        if key is not None and conversation_id is not None:
            listed = await desk.list_conversations(session_key=key)
            if any(c.id == conversation_id and c.template == template for c in listed):
                return gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()
        return fresh(template)

    async def api_chat(message: Any, history: Any, template: Any, conversation_id: Any, tenant: Any,
                       request: gr.Request) -> AsyncIterator[dict]:
        """Scriptable chat: streams {"text", "done", ...}; the last one carries the stored stats."""
        try:
            args = _api_args(message, history, template, conversation_id, tenant, API_TEXT[language])
            caller = caller_of(request)
            async for event in desk.answer(session_key=keys.api(request.session_hash), client=caller.address,
                                           template_name=args[2], message=args[0], history=args[1],
                                           conversation_id=args[3], tenant=caller.tenant):
                if isinstance(event, Progress):
                    yield {"text": event.text, "done": False, "conversation_id": event.conversation_id}
                else:
                    yield _api_final(event, language)
        except (DeskInputError, TenantRefused, ApiArgumentError) as exc:
            yield {"text": "", "done": True, "status": "rejected", "error": str(exc)}

    with gr.Blocks(title=t["title"], analytics_enabled=False, fill_height=True) as demo:
        session_key = gr.BrowserState("", storage_key="prefixdesk-session", secret=browser_secret)
        # The open conversation, kept in the browser: a reload or a server restart opens it again. Its value is
        # the browser's, so every handler checks it (_conversation_id) and the desk checks who owns it.
        conversation_id = gr.BrowserState(None, storage_key="prefixdesk-open", secret=browser_secret)
        shown = gr.State([])  # the conversation as displayed, kept on the server
        with gr.Sidebar(label=t["sidebar"], open=True, elem_id="pd-sidebar"):
            new_btn = gr.Button(t["new"], variant="secondary", elem_id="new-conversation", size="sm")
            conversations = gr.Radio([], label=t["history"], elem_id="conversations")
            with gr.Row(elem_id="pd-manage"):
                new_title = gr.Textbox(placeholder=t["rename_placeholder"], show_label=False, container=False,
                                       max_length=60, elem_id="new-title", scale=3)
                rename_btn = gr.Button(t["rename"], elem_id="rename", size="sm", scale=1, min_width=64)
            delete_btn = gr.Button(t["delete"], elem_id="delete", size="sm", variant="secondary")
        # The topic sits by the title, not in the sidebar: a phone, whose sidebar starts closed, shows it too.
        with gr.Row(elem_id="pd-top", equal_height=False):
            with gr.Column(elem_id="pd-header", scale=3):
                gr.Markdown(f"## {t['title']}\n{t['subtitle']}")
                gr.Markdown(t["model"].format(model=model_name), elem_id="pd-model")
                if info.is_demo_model:
                    gr.Markdown(t["demo"], elem_id="demo-notice")
            # Empty until the page loads (its script and the tests take a filled picker for a loaded page).
            template = gr.Dropdown([], label=t["template"], elem_id="template", interactive=True, scale=1,
                                   min_width=160)
        returned = gr.State("")  # a refused message, handed back to the box by after_answer
        # Where the page's script reports when an answer's first text reached the screen (hidden by chat.css).
        with gr.Row(elem_id="pd-glyph-report"):
            first_visible = gr.Textbox("", show_label=False, container=False, max_length=8, lines=1,
                                       interactive=True)
            first_visible_btn = gr.Button("", elem_id="pd-glyph-send")
        # Messages come as HTML made here (as_text, and answers' Markdown by app/web/render.py): Gradio renders no
        # Markdown or LaTeX of its own, and its sanitizer (which keeps images and forms) is only the second line.
        # The default topic's questions are the page's own: a page loading on it needs no update (loaded_chat).
        default_questions = suggested(picker()["value"])
        chatbot = gr.Chatbot(elem_id="chatbot", height="58vh", show_label=False, buttons=["copy"],
                             examples=[{"text": q} for q in default_questions] or None,
                             feedback_options=("Like", "Dislike"), editable="user",
                             layout="bubble", placeholder=t["chat_placeholder"], autoscroll=True,
                             render_markdown=False, latex_delimiters=[], sanitize_html=True)
        # After 👎: an optional reason (the thumbs are kept already).
        with gr.Row(elem_id="pd-reason", visible=False) as reason_row:
            reason = gr.Textbox(placeholder=t["reason"], show_label=False, container=False, max_length=500, scale=8)
            reason_btn = gr.Button(t["rate_send"], elem_id="reason-send", scale=1, min_width=72, size="sm")
        rating_for = gr.State(None)  # the answer the reason is for
        thanks = gr.Markdown(t["rated"], visible=False, elem_id="pd-thanks")  # once a reason is kept
        with gr.Row(elem_id="pd-actions"):
            person_btn = gr.Button(t["person_button"], elem_id="person", size="sm", variant="secondary", scale=0,
                                   min_width=96)
        # While a person has the conversation the page asks for their replies every few seconds (and only then).
        person_timer = gr.Timer(PERSON_POLL_S, active=False)
        seen = gr.State(0)  # the last message id the page has shown, for the poll
        with gr.Row(elem_id="pd-composer", equal_height=True):
            box = gr.Textbox(placeholder=t["placeholder"], show_label=False, elem_id="message", scale=8, lines=1,
                             max_lines=6, max_length=20_000, autofocus=True, submit_btn=False, container=False)
            send_btn = gr.Button(t["send"], variant="primary", elem_id="send", scale=1, min_width=72)
            stop_btn = gr.Button(t["stop"], variant="stop", elem_id="stop", scale=1, min_width=72)
            retry_btn = gr.Button(t["retry"], variant="secondary", elem_id="retry", scale=1, min_width=72)
            # Shown by the page's script only under an answer cut off at its length (chat.css, chat.js).
            continue_btn = gr.Button(t["continue"], variant="secondary", elem_id="continue", scale=1, min_width=72)

        # Every event takes its inputs as the page sends them and returns outputs in the page's own format: Gradio's
        # pre- and postprocessing run each input and output on a thread of the process's 40 (the GPU profile: a
        # page load waited 6 s for one), and the handlers check every value themselves.
        private = {"api_visibility": "private", "show_progress": "hidden", "concurrency_limit": None,
                   "preprocess": False, "postprocess": False}
        # The streaming events: their messages are already in the chatbot's format (module docstring). The page
        # empties the message box itself as a question leaves, so the box is none of their outputs.
        streaming = private
        screen = [chatbot, shown, conversation_id, session_key, returned]
        asked = [box, template, conversation_id, session_key, shown]
        submit = box.submit(send, asked, screen, js=CLEAR_BOX_JS, **streaming)
        click = send_btn.click(send, asked, screen, js=CLEAR_BOX_JS, **streaming)
        again = retry_btn.click(retry, [conversation_id, session_key, shown], screen, **streaming)
        onwards = continue_btn.click(go_on, [conversation_id, session_key, shown], screen, **streaming)
        picked = chatbot.example_select(ask_suggested, [template, conversation_id, session_key, shown], screen,
                                        js=SUGGESTED_JS, **streaming)
        edited = chatbot.edit(edit, [conversation_id, session_key, shown], screen, **streaming)
        for answered in (submit, click, again, onwards, picked, edited):  # the sidebar, once the answer is stored: one short request
            answered.then(after_answer, [session_key, returned, conversation_id, shown],
                          [conversations, box, returned, person_timer, seen], queue=False,
                          **private)
        # The page runs a click's events one after another, each to its end: the cancel goes first, or the answer
        # would run on while after_stop waits for it to be stored as stopped.
        stop_btn.click(None, None, None, cancels=[submit, click, again, onwards, picked, edited], api_visibility="private")
        stop_btn.click(after_stop, [conversation_id, session_key, shown], [chatbot, shown, conversation_id, conversations],
                       **private)
        first_visible_btn.click(report_first_visible, [first_visible, conversation_id, session_key, shown],
                            [chatbot, shown], queue=False, **private)
        chatbot.like(rated, [shown, session_key], [reason_row, rating_for, reason, thanks], queue=False, **private)
        for asked_reason in (reason.submit, reason_btn.click):
            asked_reason(send_reason, [reason, rating_for, session_key], [reason_row, rating_for, reason, thanks],
                         queue=False, **private)
        person_btn.click(ask_person, [conversation_id, session_key, shown], [chatbot, shown, person_timer, seen],
                         queue=False, **private)
        person_timer.tick(poll, [conversation_id, session_key, shown, seen], [chatbot, shown, seen, person_timer],
                          queue=False, **private)
        # One short request when the page loads, outside the queue (no event stream to open and close for it).
        demo.load(on_load, [session_key, conversation_id],
                  [session_key, template, conversations, chatbot, shown, conversation_id, person_timer, seen],
                  queue=False, **private)
        conversations.input(open_conversation, [conversations, session_key],
                            [chatbot, shown, conversation_id, template, conversations, person_timer, seen],
                            **private)
        begin = {"fn": fresh, "inputs": [template], "outputs": [chatbot, shown, conversation_id, conversations,
                                                                 person_timer]}
        new_btn.click(**begin, **private)
        template.input(change_topic, [template, conversation_id, session_key], begin["outputs"], **private)
        rename_btn.click(rename, [new_title, conversation_id, session_key], [conversations, new_title], queue=False,
                         **private)
        delete_btn.click(delete, [conversation_id, session_key, template],
                         [chatbot, shown, conversation_id, conversations, person_timer], queue=False, **private)
        # The topics as published now, each time the customer opens the picker (a page opened before a publish).
        template.focus(lambda: gr.update(choices=topics()), None, template, queue=False, **private)
        chatbot.clear(**begin, **private)  # the chatbot's own trash icon starts a new conversation too

        # The scriptable endpoint, with no components of its own: each component is a page block that Gradio
        # configures again for every new browser session.
        gr.api(api_chat, api_name="chat", concurrency_limit=None)
    return demo


def own(shown: Any, key: str | None) -> list:
    """The session's shown conversation for a caller with a key this server issued (``key``, checked); for
    anyone else nothing of it: whoever runs an event in a session they took over without the page's key
    reads none of the state the page left on the server."""
    return list(shown) if key is not None and isinstance(shown, list) else []


def _calm(num_outputs: int):
    """A short handler that never shows Gradio's error: on an unexpected exception it logs it and leaves its
    ``num_outputs`` outputs as they are."""
    def wrap(fn):
        @functools.wraps(fn)
        async def run(*args, **kwargs):
            try:
                return await fn(*args, **kwargs)
            except Exception:
                log.exception("chat handler %s failed", fn.__name__)
                return tuple(gr.skip() for _ in range(num_outputs))
        return run
    return wrap


class _Ahead:
    """The desk's events with the first one already on its way: while Gradio sends the question to the
    page, the desk stores it and the engine starts answering (both off the path to the first glyph).
    ``aclose`` stops an answer whose first event nobody took (the page went away meanwhile), and waits for
    the first event's task to end before it closes the desk's generator: a Stop that lands while the first
    event is still coming cancels that task too, and closing a generator that task still runs would raise
    ("asynchronous generator is already running") in place of the quiet stop."""

    def __init__(self, events: AsyncIterator[Progress | Finished]):
        self._events = events
        self._first: asyncio.Future | None = asyncio.ensure_future(anext(events))
        self._pending: asyncio.Future | None = self._first

    def __aiter__(self):
        return self

    async def __anext__(self) -> Progress | Finished:
        if self._first is None:
            return await anext(self._events)
        first, self._first = self._first, None
        return await first

    async def aclose(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None and not pending.done():
            pending.cancel()
            await asyncio.wait({pending})  # the desk stores the answer as stopped
        if pending is not None and not pending.cancelled():
            pending.exception()  # retrieved: a refusal nobody will read is not an error
        await self._events.aclose()


def update_interval_s(answers_in_flight: int, updates_per_s: int) -> float:
    """Seconds between one answer's screen updates: UI_UPDATE_INTERVAL_S, or longer when the answers in flight
    would together send more than ``updates_per_s`` (each update costs Gradio the same, however much text it
    carries: bench/chat_updates.py)."""
    return max(UI_UPDATE_INTERVAL_S, answers_in_flight / updates_per_s)


async def _stream(events, base: list, conversation_id, session_key: str, t: dict, language: str, pace_s):
    """(chatbot, shown, conversation id, session key, returned) for each of the desk's events: the answer so
    far, then the conversation as stored.

    The first text goes out at once; after it, one update per ``pace_s()`` at most (UI_UPDATE_INTERVAL_S,
    longer under load): the next event is taken only then, and the engine's output gathers meanwhile,
    so each update carries all the text so far. While the answer streams, the history's messages are the same objects in every
    update (Gradio's diff sees them unchanged at once) and only the answer's message is new; the
    shown state keeps its value (skipping a state costs Gradio nothing).
    """
    loop = asyncio.get_running_loop()
    next_update_at = 0.0
    asked_in = conversation_id
    while True:
        if (wait_s := next_update_at - loop.time()) > 0:
            await asyncio.sleep(wait_s)
        try:
            event = await anext(events)
        except StopAsyncIteration:
            return
        if isinstance(event, Progress):
            next_update_at = loop.time() + pace_s()
            conversation_id = event.conversation_id  # a BrowserState: set from every update (a skip costs more)
            yield (base + [_message("assistant", whole_clusters(shown_answer(event.text)), streaming=True)], gr.skip(),
                   conversation_id,
                   session_key,
                   gr.skip())
        elif isinstance(event, Finished):
            # The conversation as stored, with no second read of the database: what was shown (stored messages,
            # and last the question as the desk stores it; a new conversation is the question alone) and the
            # answer's stored row, as the customer may see it (event.customer: app/core/cache_figures.py).
            shown = base if asked_in == event.message.conversation_id else base[-1:]
            if event.message.status == WITH_PERSON:  # a person has the conversation: the question waits for them
                answer = [_notice(t["waiting_person" if event.handoff == Handoff.WAITING else "with_person"], t)]
            else:
                answer = _answer_messages(event.customer, t, language)
            if event.person_refused:  # the answer asked for a person and the queue's caps refused
                answer = answer + [_notice(refusal_text(event.person_refused, {}, language), t)]
            messages = _one_person_notice(shown + answer, t)
            yield messages, messages, event.message.conversation_id, session_key, gr.skip()


def as_text(text: str) -> str:
    """``text`` as the chatbot must show it: as written, HTML escaped (no message draws markup)."""
    return html.escape(text, quote=False)


def _message(role: str, text: str, title: str | None = None, ref: int | None = None, *,
             markdown: bool | None = None, streaming: bool = False) -> dict:
    """A message as the chatbot's own format has it, exactly what Gradio's Chatbot.postprocess makes of
    ``{"role", "content", "metadata"}`` (it also tidies the text with inspect.cleandoc). An answer's text
    (``markdown``, by default an assistant's message with no caption title) is shown as safe Markdown
    (app/web/render.py), everything else as text. A caption carries its answer's id (``ref``): a 👍 or 👎 on
    the answer names it."""
    metadata = {"title": title, "status": "done", **({"id": str(ref)} if ref is not None else {})} if title else None
    if markdown is None:
        markdown = role == "assistant" and not title
    text = inspect.cleandoc(text)
    shown = (streaming_html(text) if streaming else markdown_html(text)) if markdown else as_text(text)
    return {"role": role, "metadata": metadata, "content": [{"text": shown, "type": "text"}], "options": None}


def _notice(text: str, t: dict) -> dict:
    """A notice is shown as it is, never folded under a title."""
    return _message("assistant", t["notice"] + text, markdown=False)


def _one_person_notice(messages: list[dict], t: dict) -> list[dict]:
    """``messages`` with one notice that a person has (or is coming to) the conversation where several followed each
    other with only the customer's messages between them — each message sent to a person is answered by one: the
    last stays, saying how it stands now, under the customer's last message."""
    person = (_notice(t["waiting_person"], t), _notice(t["with_person"], t))
    out: list[dict] = []
    for message in messages:
        if message in person:
            before = len(out) - 1
            while before >= 0 and isinstance(out[before], dict) and out[before].get("role") == "user":
                before -= 1
            if before >= 0 and out[before] in person:
                del out[before]
        out.append(message)
    return out


def _feedback(messages: list[dict], rows: list[MessageRow]) -> list[str | None]:
    """The thumbs the chatbot marks, one per answer group (Gradio's grouping: consecutive messages of one role),
    from the stored ratings of the answers the groups name."""
    thumbs = {m.id: {1: "Like", -1: "Dislike"}.get(m.rating) for m in rows if m.role == "assistant"}
    out: list[str | None] = []
    role = None
    for message in messages:
        if message.get("role") != role:
            role = message.get("role")
            if role == "assistant":
                out.append(None)
        if role == "assistant" and (ref := _answer_id(message)) is not None:
            out[-1] = thumbs.get(ref)
    return out


def _answer_id(message: dict) -> int | None:
    ref = (message.get("metadata") or {}).get("id") if isinstance(message, dict) else None
    return int(ref) if isinstance(ref, str) and ref.isdigit() and len(ref) < 19 else None


def shown_answer(text: str) -> str:
    """An answer as the customer reads it: without the marker that hands the conversation to a person (the
    notice under it says so in words)."""
    for marker in PERSON_MARKERS:
        text = text.replace(marker, "")
    return text


ZWJ = "\u200d"
# What may follow a character within its grapheme cluster: variation selectors, skin tones, emoji tags, combining marks.
_EXTEND = re.compile("[\ufe00-\ufe0f\U0001f3fb-\U0001f3ff\U000e0020-\U000e007f\u0300-\u036f\u20d0-\u20ff]")
_REGIONAL = re.compile("[\U0001f1e6-\U0001f1ff]+$")


def whole_clusters(text: str) -> str:
    """An answer still being written, up to its last whole grapheme cluster. The engine's text may end inside one
    whose rest comes with the next update: an emoji sequence a zero-width joiner goes on with (👩 ZWJ, then 💻 of
    👩‍💻), or one letter of a flag's pair (🇨 of 🇨🇳), drawn as pieces until then. Such an end is held back to the next
    update (the stored answer is shown whole)."""
    end = len(text)
    if end and text[end - 1] == ZWJ:  # the whole joined sequence waits: each "<cluster> ZWJ" back to its first
        while True:
            end -= 1  # the joiner
            while end and _EXTEND.fullmatch(text[end - 1]):
                end -= 1
            end = max(end - 1, 0)  # the cluster's first character
            if not (end and text[end - 1] == ZWJ):
                break
    flags = _REGIONAL.search(text[:end])
    if flags and len(flags.group()) % 2:
        end -= 1
    return text[:end]


def when(m: MessageRow) -> str:
    """When an answer began, as its caption says it: in UTC, which the page's script shows in the customer's
    own time zone (static/chat.js)."""
    return f"{m.created_at:%Y-%m-%d %H:%M} UTC"


def _answer_messages(m: MessageRow, t: dict, language: str) -> list[dict]:
    text = shown_answer(m.text).rstrip() if m.text else ""
    out = [_message("assistant", text)] if text else []
    if m.author:  # a person's reply, marked as a person's (``author`` is their console login: not said)
        out.append(_message("assistant", when(m), f"{t['person']} · {when(m)}", m.id))
    elif m.status == AnswerStatus.OK:
        title = caption_title(m, language) + (f" · {t['cut_off']}" if m.cut_off else "") + f" · {when(m)}"
        out.append(_message("assistant", caption_details(m, language), title, m.id))
    elif m.status == AnswerStatus.STOPPED:
        out.append(_message("assistant", caption_details(m, language) if m.prompt_tokens else t["stopped"],
                            f"{t['stopped']} · {when(m)}", m.id))
    elif m.status == WITH_PERSON:
        out.append(_notice(t["with_person"], t))
    else:
        out.append(_notice(refusal_text(m.error_code, {}, language), t))
    return out


def _history_messages(messages: list[MessageRow], t: dict, language: str) -> list[dict]:
    out: list[dict] = []
    for m in messages:
        if m.role == "user":
            out.append(_message("user", m.text))
        elif m.status != AnswerStatus.GENERATING:
            out.extend(_answer_messages(m, t, language))
    return _one_person_notice(out, t)


async def _conversation_choices(desk: Desk, session_key: str, t: dict, current: int | None = None):
    return _choices(await desk.list_conversations(session_key=session_key), t, current)


def _choices(rows: list[ConversationRow], t: dict, current: int | None = None):
    # In UTC, as captions: the page's script shows it in the customer's own time zone (static/chat.js).
    choices = [(f"{c.created_at:%Y-%m-%d %H:%M} UTC · {c.title or '…'}", c.id) for c in rows]
    value = current if any(c.id == current for c in rows) else None
    return gr.update(choices=choices, value=value, label=t["history"] if choices else t["no_conversations"])


def _conversation_id(value: Any) -> int | None:
    """A conversation id as the browser holds it: a positive integer, or None for anything else."""
    return value if type(value) is int and 0 < value < 2**63 else None


def _first_visible_ms(report: Any) -> int | None:
    """The page's report: whole milliseconds as digits, 1 to MAX_FIRST_VISIBLE_MS; None for anything else."""
    if not isinstance(report, str) or not report.isascii() or not report.isdigit() or len(report) > 6:
        return None
    ms = int(report)
    return ms if 0 < ms <= MAX_FIRST_VISIBLE_MS else None


class ApiArgumentError(ValueError):
    """An argument of /chat that is not what it must be; the message (API_TEXT) says which and how."""


def _api_args(message: Any, history: Any, template: Any, conversation_id: Any, tenant: Any,
              t: dict) -> tuple[str, list[Turn] | None, str, int | None]:
    """The /chat arguments, strictly typed; raises ApiArgumentError saying which one is wrong and how (``t``:
    API_TEXT in the UI language)."""
    if not isinstance(message, str):
        raise ApiArgumentError(t["api_message"])
    if not isinstance(template, str) or not template:
        raise ApiArgumentError(t["api_template"])
    if conversation_id is not None and (type(conversation_id) is not int or not 0 < conversation_id < 2**63):
        raise ApiArgumentError(t["api_conversation"])
    if tenant not in (None, ""):
        raise ApiArgumentError(t["api_tenant"])
    if history in (None, []):
        return message, [] if history == [] else None, template, conversation_id
    if not isinstance(history, list):
        raise ApiArgumentError(t["api_history"])
    turns = []
    for m in history:
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant") or not isinstance(m.get("content"), str):
            raise ApiArgumentError(t["api_history"])
        if not (m.get("metadata") or {}).get("title"):  # captions and notices are not context
            turns.append(Turn(m["role"], m["content"]))
    return message, turns, template, conversation_id


def _api_final(event: Finished, language: str) -> dict:
    m = event.customer
    return {
        "text": m.text, "done": True, "status": m.status, "error": m.error,
        "caption": caption_title(m, language) if m.status == AnswerStatus.OK else "",
        "conversation_id": m.conversation_id, "message_id": m.id, "prompt_tokens": m.prompt_tokens,
        "num_cached_tokens": m.num_cached_tokens, "ttft_ms": m.ttft_ms, "output_tokens": m.output_tokens,
        "decode_tokens_per_s": m.decode_tokens_per_s, "replica": m.replica, "dropped_turns": event.dropped_turns,
    }

