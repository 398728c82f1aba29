"""The scriptable ``/chat``: the same desk as the page, with its arguments strictly typed and its answer streamed as
plain dicts (no components of its own: each component is a page block that Gradio configures again for every new
browser session)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import gradio as gr

from app.chat.context import ChatContext
from app.chat.text import API_TEXT, caption_title
from app.core.callers import TenantRefused
from app.core.desk import DeskInputError, Finished, Progress
from app.core.prompts import Turn
from app.db.states import AnswerStatus


async def api_chat(chat: ChatContext, message: Any, history: Any, template: Any, conversation_id: Any, tenant: Any,
                   request: gr.Request) -> AsyncIterator[dict]:
    """Scriptable chat: streams {"text", "done", ...}; the last one carries the stored stats."""
    try:
        args = _api_args(message, history, template, conversation_id, tenant, API_TEXT[chat.language])
        caller = chat.caller_of(request)
        async for event in chat.desk.answer(session_key=chat.keys.api(request.session_hash), client=caller.address,
                                            template_name=args[2], message=args[0], history=args[1],
                                            conversation_id=args[3], tenant=caller.tenant):
            if isinstance(event, Progress):
                yield {"text": event.text, "done": False, "conversation_id": event.conversation_id}
            else:
                yield _api_final(event, chat.language)
    except (DeskInputError, TenantRefused, ApiArgumentError) as exc:
        yield {"text": "", "done": True, "status": "rejected", "error": str(exc)}




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

