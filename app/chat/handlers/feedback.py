"""A 👍 or 👎 on an answer, kept at once, and a 👎's optional reason."""

from __future__ import annotations

import contextlib
from typing import Any

import gradio as gr

from app.chat.context import ChatContext, calm
from app.chat.outputs import Rated, nothing
from app.chat.render import _answer_id
from app.core.callers import TenantRefused


@calm(Rated)
async def rated(chat: ChatContext, data: gr.LikeData, shown: list, session_key: str, request: gr.Request):
    """👍 or 👎 on an answer, kept at once; 👎 asks for an optional
    reason (and an earlier reason's thanks goes)."""
    key = chat.keys.browser(session_key)
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
        return nothing(Rated)
    thumbs = 1 if data.liked else -1
    try:
        client = chat.caller_of(request).address
    except TenantRefused:
        return nothing(Rated)
    if not await chat.desk.rate(session_key=key, message_id=message_id, thumbs=thumbs, client=client):
        return nothing(Rated)
    return Rated(gr.Row(visible=thumbs < 0), message_id if thumbs < 0 else None, "", gr.Markdown(visible=False))


@calm(Rated)
async def send_reason(chat: ChatContext, reason: Any, rating_for: Any, session_key: str, request: gr.Request):
    """The 👎's reason kept, and the customer thanked for it."""
    key = chat.keys.browser(session_key)
    kept = False
    if key is not None and type(rating_for) is int and isinstance(reason, str) and len(reason) <= 500:
        with contextlib.suppress(TenantRefused):
            kept = await chat.desk.rate(session_key=key, message_id=rating_for, thumbs=-1, reason=reason,
                                        client=chat.caller_of(request).address)
    return Rated(gr.Row(visible=False), None, "", gr.Markdown(visible=bool(kept)))
