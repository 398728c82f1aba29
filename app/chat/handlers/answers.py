"""A question and its answer: send, a suggested question, an edit of the last question, Retry and Continue stream
a Screen each (app/chat/stream.py); after the answer, the sidebar, a Stop's stored conversation and the page's
measure of the first glyph.

Nothing a browser sends is kept before the desk has taken it in: a refused message leaves the conversation state
as it was (and goes back to the message box).
"""

from __future__ import annotations

import logging
from typing import Any

import gradio as gr

from app.chat.context import ChatContext, _conversation_id, calm, own
from app.chat.outputs import Answered, Followed, Reported, Screen, Stopped, nothing
from app.chat.render import (_answer_id, _answer_messages, _choices, _feedback, _history_messages, _message,
                             answer_so_far)
from app.chat.stream import _stream
from app.core.callers import TenantRefused
from app.core.desk import MAX_FIRST_VISIBLE_MS, DeskInputError
from app.db.rows import MessageRow

log = logging.getLogger(__name__)


async def on_screen(chat: ChatContext, shown: list, base: list, conversation_id, session_key: str, events, *,
                    restore: Any = "", rows: list[MessageRow] | None = None):
    """A Screen for each step while the desk's ``events`` run: the
    question at once, then the answer as it streams, then the stored conversation. A refusal shows the
    conversation as it was (``shown``) with the desk's notice, and hands ``restore`` back to the box.
    ``rows``: the stored conversation, when the answer replaces the last one (Retry, an edit): the thumbs
    shown are set again from it, so the old answer's 👍 does not mark the new one.

    The answer runs to its end whoever reads it (app/core/answering.py): when Gradio closes this event (the page
    was reloaded or closed, or Stop cancelled it) the answer goes on and is stored; a Stop ends it (after_stop),
    and a page that opens the conversation meanwhile follows it (``follow``)."""
    answering = chat.desk.keep_answering(events, session_key=session_key, conversation_id=conversation_id)
    try:
        first = base if rows is None else gr.update(value=base, feedback_value=_feedback(base, rows))
        yield Screen(first, base, conversation_id, session_key, gr.skip())
        async for update in _stream(answering, base, conversation_id, session_key, chat.t, chat.language,
                                  chat.pace_s):
            yield update
    except DeskInputError as exc:
        yield _marked(chat.refused(shown, chat.say(exc), conversation_id, session_key, restore), rows)
    except Exception:  # never Gradio's red "Error" over the chat: the stored conversation stays as it was
        log.exception("the chat's answer failed")
        yield _marked(chat.refused(shown, chat.t["internal"], conversation_id, session_key, restore), rows)
    finally:
        answering.detach()


def _marked(screen: Screen, rows: list[MessageRow] | None) -> Screen:
    """A refusal's screen with the stored thumbs marked again, when the answer's first update had set them
    for the conversation without its last answer (Retry, an edit)."""
    if rows is None:
        return screen
    return screen._replace(chatbot=gr.update(value=screen.chatbot, feedback_value=_feedback(screen.chatbot, rows)))


async def send(chat: ChatContext, message: Any, template: str, conversation_id: Any, session_key: str, shown: list,
               request: gr.Request):
    async for update in ask(chat, message, template, conversation_id, session_key, shown, request):
        yield update


async def ask_suggested(chat: ChatContext, choice: gr.SelectData, template: Any, conversation_id: Any, session_key: str,
                        shown: list, request: gr.Request):
    """A suggested question the customer clicked, asked as if typed. The page names it by its place; the
    text is the topic's own (what the page sends as its text is not read)."""
    shown = own(shown, chat.keys.browser(session_key))
    questions = chat.suggested(template)
    index = choice.index if type(choice.index) is int else -1
    if not 0 <= index < len(questions):
        yield nothing(Screen)
        return
    clicked = choice.value.get("text") if isinstance(choice.value, dict) else None
    if clicked != questions[index]:  # the page showed other questions (changed since): it gets today's
        yield nothing(Screen)._replace(chatbot=chat.empty_chat(template, shown))
        return
    async for update in ask(chat, questions[index], template, conversation_id, session_key, shown, request):
        yield update


async def edit(chat: ChatContext, change: gr.EditData, conversation_id: Any, session_key: str, shown: list,
               request: gr.Request):
    """The customer edited their last question: it is asked again as edited, and the new question and answer
    replace the old ones on screen (the old ones stay in the record). An earlier question cannot be edited."""
    key = chat.keys.browser(session_key)
    shown = own(shown, key)
    conversation_id = _conversation_id(conversation_id)
    found = None if key is None or conversation_id is None else \
        await chat.desk.conversation(session_key=key, conversation_id=conversation_id)
    if conversation_id is not None and key is not None and found is None:  # not this browser's
        yield chat.refused(shown, chat.t["refusals"]["no_conversation"], conversation_id, session_key)
        return
    rows = found or []
    if not shown:  # a server that forgot this page: the screen from the store
        shown = _history_messages(rows, chat.t, chat.language)
    last_user = max((i for i, m in enumerate(shown) if isinstance(m, dict) and m.get("role") == "user"),
                    default=None)
    index = change.index if type(change.index) is int else None
    if conversation_id is None or key is None or last_user is None:
        yield chat.refused(shown, chat.t["refusals"]["nothing_to_edit"], conversation_id, session_key, key=key)
        return
    if index != last_user:
        yield chat.refused(shown, chat.t["refusals"]["edit_last_only"], conversation_id, session_key)
        return
    value = change.value
    if value is None or (isinstance(value, str) and not value.strip()):
        yield chat.refused(shown, chat.t["empty"], conversation_id, session_key)
        return
    try:
        caller = chat.caller_of(request)
        admitted = chat.desk.admit(client=caller.address, message=value, browser=key)
    except (TenantRefused, DeskInputError) as exc:
        yield chat.refused(shown, chat.say(exc), conversation_id, session_key)
        return
    edited = shown[last_user]
    events = chat.desk.edit_last(session_key=key, client=caller.address, conversation_id=conversation_id,
                            message=admitted, replaces=lambda text: _message("user", text) == edited,
                            tenant=caller.tenant)
    base = shown[:last_user] + [_message("user", admitted.text)]
    async for update in on_screen(chat, shown, base, conversation_id, key, events, rows=rows):
        yield update


async def ask(chat: ChatContext, message: Any, template: Any, conversation_id: Any, session_key: str, shown: list,
              request: gr.Request):
    key = chat.keys.browser(session_key)
    shown = own(shown, key)
    conversation_id = _conversation_id(conversation_id)
    if message is None or (isinstance(message, str) and not message.strip()):
        yield chat.refused(shown, chat.t["empty"], conversation_id, session_key, key=key)
        return
    try:  # type, rate and size, before anything keeps the message
        caller = chat.caller_of(request)
        admitted = chat.desk.admit(client=caller.address, message=message, browser=chat.keys.browser(session_key) or "")
    except (TenantRefused, DeskInputError) as exc:
        yield chat.refused(shown, chat.say(exc), conversation_id, session_key, message, key=key)
        return
    if key is None:  # not a key this server issued (a page from before its key changed, or forged): write nothing
        yield chat.refused([], chat.t["expired"], None, chat.keys.mint_browser(), message)
        return
    if conversation_id is not None and not shown:  # a server that forgot this page: the screen from the store
        found = await chat.stored(key, conversation_id)
        shown = found[0] if found else []
    events = chat.desk.answer(session_key=key, client=caller.address,
                         template_name=template if isinstance(template, str) else "", message=admitted,
                         conversation_id=conversation_id, tenant=caller.tenant)
    base = shown + [_message("user", admitted.text)]
    async for update in on_screen(chat, shown, base, conversation_id, key, events, restore=message):
        yield update


async def answer_again(chat: ChatContext, conversation_id: Any, session_key: str, shown: list, request: gr.Request, *,
                       go_on: bool):
    """Retry (a new answer to the last question) or Continue (``go_on``: the cut-off last answer goes on)."""
    key = chat.keys.browser(session_key)
    shown = own(shown, key)
    conversation_id = _conversation_id(conversation_id)
    if conversation_id is None or key is None:
        yield chat.refused(shown, chat.t["nothing_to_retry"], conversation_id, session_key, key=key)
        return
    try:
        caller = chat.caller_of(request)
    except TenantRefused as exc:
        yield chat.refused(shown, chat.say(exc), conversation_id, session_key)
        return
    rows = await chat.desk.conversation(session_key=key, conversation_id=conversation_id) or []
    if not shown:
        shown = _history_messages(rows, chat.t, chat.language)
    last_user = max((i for i, m in enumerate(rows) if m.role == "user"), default=None)
    base = _history_messages(rows[:last_user + 1] if last_user is not None else rows, chat.t, chat.language)
    run = chat.desk.continue_answer if go_on else chat.desk.retry
    events = run(session_key=key, client=caller.address, conversation_id=conversation_id, tenant=caller.tenant)
    async for update in on_screen(chat, shown, base, conversation_id, key, events, rows=rows):
        yield update


async def retry(chat: ChatContext, conversation_id: Any, session_key: str, shown: list, request: gr.Request):
    async for update in answer_again(chat, conversation_id, session_key, shown, request, go_on=False):
        yield update


async def go_on(chat: ChatContext, conversation_id: Any, session_key: str, shown: list, request: gr.Request):
    async for update in answer_again(chat, conversation_id, session_key, shown, request, go_on=True):
        yield update


@calm(Answered)
async def after_answer(chat: ChatContext, session_key: str, returned: str, open_id: Any, shown: list):
    """The sidebar's list once an answer is stored (the open conversation marked), a refused message back
    in the box, and the poll for a person's replies started when the answer handed the conversation to one."""
    key = chat.keys.browser(session_key)
    open_id = _conversation_id(open_id)
    if not key:
        return nothing(Answered)._replace(conversations=gr.update(choices=[], value=None,
                                                                  label=chat.t["no_conversations"]))
    listed = await chat.desk.list_conversations(session_key=key)
    now = next((c for c in listed if c.id == open_id), None)
    timer, seen = gr.skip(), gr.skip()
    if now is not None and now.handoff:  # polled from the last answer shown: a reply stored meanwhile comes too
        timer, seen = gr.Timer(active=True), max((_answer_id(m) or 0 for m in shown or []), default=0)
    if not returned:
        return Answered(_choices(listed, chat.t, open_id), gr.skip(), gr.skip(), timer, seen)
    return Answered(_choices(listed, chat.t, open_id), returned, "", timer, seen)


@calm(Stopped)
async def after_stop(chat: ChatContext, conversation_id: Any, session_key: str, shown: list):
    """The stored conversation once the cancelled answer has stored itself as stopped (awaited on its own
    end, no deadline: Desk.settled_conversation, app/core/desk.py), and the sidebar's list with it. A Stop that
    landed before the answer's first text finds the conversation it started (the page did not learn its id
    yet): the browser's newest, if the desk began it for this browser's last new question."""
    key = chat.keys.browser(session_key)
    conversation_id = _conversation_id(conversation_id)
    if key is None:
        return nothing(Stopped)
    await chat.desk.turns_written(session_key=key)  # a question the Stop caught on its way is stored first
    listed = await chat.desk.list_conversations(session_key=key)
    if conversation_id is None:  # the newest, if this browser's last question on this desk began it
        newest = listed[0] if listed else None
        started = await chat.desk.last_started(session_key=key)
        if newest is None or newest.id != started or newest.num_messages > 2:
            await chat.desk.stop_answers(session_key=key, conversation_id=None)  # one the desk had not begun
            return nothing(Stopped)._replace(conversations=_choices(listed, chat.t))
        conversation_id = newest.id
    # The cancelled event left its answer running (on_screen): the Stop ends it here.
    await chat.desk.stop_answers(session_key=key, conversation_id=conversation_id)
    rows = await chat.desk.settled_conversation(session_key=key, conversation_id=conversation_id) or []
    messages = _history_messages(rows, chat.t, chat.language)
    return Stopped(messages, messages, conversation_id, _choices(listed, chat.t, conversation_id))


@calm(Followed)
async def follow(chat: ChatContext, conversation_id: Any, session_key: str, shown: list):
    """While the open conversation's answer is written for a page that went away (this page is its reload): the
    answer so far under the stored conversation, then, once it has ended, the conversation as stored (and the
    timer stopped)."""
    key = chat.keys.browser(session_key)
    conversation_id = _conversation_id(conversation_id)
    if key is None or conversation_id is None:
        return nothing(Followed)._replace(answer_timer=gr.Timer(active=False))
    answering = chat.desk.answering(session_key=key, conversation_id=conversation_id)
    if answering is not None:
        return nothing(Followed)._replace(chatbot=following(own(shown, key), answering.text))
    found = await chat.stored(key, conversation_id)
    if found is None:
        return nothing(Followed)._replace(answer_timer=gr.Timer(active=False))
    return Followed(found[0], found[0], gr.Timer(active=False))


def following(base: list, text: str) -> list:
    """The stored conversation with an answer still being written under it (none yet: the conversation alone)."""
    return base + [answer_so_far(text)] if text else base


@calm(Reported)
async def report_first_visible(chat: ChatContext, report: Any, conversation_id: Any, session_key: str, shown: list,
                               request: gr.Request):
    """The page's own measure of its last answer's first text (chat.js): stored with the answer, and the shown
    conversation's caption says it (the page wrote it into the caption on screen itself). Anything but a whole
    number of milliseconds in range is ignored."""
    key = chat.keys.browser(session_key)
    ms = _first_visible_ms(report)
    conversation_id = _conversation_id(conversation_id)
    if key is None or ms is None or conversation_id is None:
        return nothing(Reported)
    try:
        client = chat.caller_of(request).address
    except TenantRefused:
        return nothing(Reported)
    row = await chat.desk.first_visible(session_key=key, conversation_id=conversation_id, ms=ms, client=client)
    shown = list(shown or [])
    last = next((i for i in range(len(shown) - 1, -1, -1) if (shown[i].get("metadata") or {}).get("title")), None)
    if row is None or last is None:
        return nothing(Reported)
    shown[last:] = _answer_messages(row, chat.t, chat.language)[-1:] + shown[last + 1:]
    return Reported(shown, "")


def _first_visible_ms(report: Any) -> int | None:
    """The page's report: whole milliseconds as digits, 1 to MAX_FIRST_VISIBLE_MS; None for anything else."""
    if not isinstance(report, str) or not report.isascii() or not report.isdigit() or len(report) > 6:
        return None
    ms = int(report)
    return ms if 0 < ms <= MAX_FIRST_VISIBLE_MS else None
