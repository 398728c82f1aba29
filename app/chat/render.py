"""The conversation as the chatbot shows it, made from the stored rows: Gradio's own message format, each text
as text except answers (the model's and a person's), which are safe Markdown made into HTML (app/chat/markdown.py).
Nothing here reads the database or a browser's values: rows and words in, messages out."""

from __future__ import annotations

import html
import inspect
import re

import gradio as gr

from app.chat.markdown import markdown_html, streaming_html
from app.chat.text import caption_details, caption_title, refusal_text
from app.core.desk import PERSON_MARKERS, WITH_PERSON
from app.db.rows import ConversationRow, MessageRow
from app.db.states import AnswerStatus


def as_text(text: str) -> str:
    """``text`` as the chatbot must show it: as written, HTML escaped (no message draws markup)."""
    return html.escape(text, quote=False)


def _message(role: str, text: str, title: str | None = None, ref: int | None = None, *,
             markdown: bool | None = None, streaming: bool = False) -> dict:
    """A message as the chatbot's own format has it, exactly what Gradio's Chatbot.postprocess makes of
    ``{"role", "content", "metadata"}`` (it also tidies the text with inspect.cleandoc). An answer's text
    (``markdown``, by default an assistant's message with no caption title) is shown as safe Markdown
    (app/chat/markdown.py), everything else as text. A caption carries its answer's id (``ref``): a 👍 or 👎 on
    the answer names it."""
    metadata = {"title": title, "status": "done", **({"id": str(ref)} if ref is not None else {})} if title else None
    if markdown is None:
        markdown = role == "assistant" and not title
    text = inspect.cleandoc(text)
    shown = (streaming_html(text) if streaming else markdown_html(text)) if markdown else as_text(text)
    return {"role": role, "metadata": metadata, "content": [{"text": shown, "type": "text"}], "options": None}


def answer_so_far(text: str) -> dict:
    """An answer still being written, as the page shows it while it streams (whole grapheme clusters only)."""
    return _message("assistant", whole_clusters(shown_answer(text)), streaming=True)


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


def _choices(rows: list[ConversationRow], t: dict, current: int | None = None):
    # In UTC, as captions: the page's script shows it in the customer's own time zone (static/chat.js).
    choices = [(f"{c.created_at:%Y-%m-%d %H:%M} UTC · {c.title or '…'}", c.id) for c in rows]
    value = current if any(c.id == current for c in rows) else None
    return gr.update(choices=choices, value=value, label=t["history"] if choices else t["no_conversations"])
