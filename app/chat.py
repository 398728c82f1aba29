"""The chat tab: a Gradio ChatInterface over the Desk, plus the scriptable ``/chat`` endpoint.

Handlers stay thin: they translate between Gradio's values and the Desk's events.
"""

from __future__ import annotations

import uuid
from typing import Any

import gradio as gr

from app.desk import Desk, DeskInputError, Finished, Progress, caption
from app.engine import EngineInfo
from app.prompts import Turn
from app.store import MessageRow

TEXT = {
    "zh": {
        "title": "优选商城 · 在线客服",
        "subtitle": "同一份系统提示词只计算一次：每个回答下方显示命中缓存的提示 token 数。",
        "demo": "⚠️ 当前使用内置演示模型（随机权重）：回答是占位文字，但 token 数、缓存命中和流式输出都是真实的。",
        "template": "客服模板",
        "new": "＋ 新对话",
        "history": "历史对话",
        "placeholder": "请输入您的问题，例如：我刚买的手机屏幕碎了能退吗？",
        "notice": "⚠️ 提示",
        "stopped": "已停止",
        "no_conversations": "还没有历史对话",
    },
    "en": {
        "title": "Northwind Help Desk",
        "subtitle": "The system prompt is computed once and reused: each answer shows how many prompt tokens came from the cache.",
        "demo": "⚠️ Demo model in use (random weights): replies are placeholder text, but token counts, cache hits and streaming are real.",
        "template": "Template",
        "new": "＋ New conversation",
        "history": "Earlier conversations",
        "placeholder": "Type your question, e.g. Can I return shoes I wore once?",
        "notice": "⚠️ Notice",
        "stopped": "stopped",
        "no_conversations": "No conversations yet",
    },
}

CSS = """
.pd-sidebar { min-width: 220px; }
footer { display: none !important; }
"""


def build_chat(desk: Desk, info: EngineInfo, *, language: str, browser_secret: str, tenant_header: str = "") -> gr.Blocks:
    """The chat page. ``browser_secret`` encrypts the browser's session key; it must outlive restarts."""
    t = TEXT[language]
    names = [tpl.name for tpl in desk.templates()]
    default = next((tpl.name for tpl in desk.templates() if tpl.language == language), names[0] if names else None)

    def tenant_of(request: gr.Request | None) -> str:
        return (request.headers.get(tenant_header, "") if request and tenant_header else "")[:100]

    async def respond(message: str, history: list[dict], template: str, conversation_id: int | None, session_key: str,
                      request: gr.Request):
        session_key = session_key or _new_session_key()
        try:
            async for event in desk.answer(session_key=session_key, template_name=template,
                                           history=_turns(history), message=message,
                                           conversation_id=conversation_id, tenant=tenant_of(request)):
                if isinstance(event, Progress):
                    conversation_id = event.conversation_id
                    yield event.text, conversation_id, session_key, gr.skip()
                elif isinstance(event, Finished):
                    yield (_answer_messages(event.message, t, language), event.message.conversation_id,
                           session_key, _conversation_choices(desk, session_key, t))
        except DeskInputError as exc:
            yield _notice(str(exc), t), conversation_id, session_key, gr.skip()

    def start(session_key: str):
        session_key = session_key or _new_session_key()
        return session_key, _conversation_choices(desk, session_key, t)

    def open_conversation(conversation_id: int | None, session_key: str):
        if conversation_id is None or desk.store.conversation_owner(conversation_id) != session_key:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip()
        messages = desk.store.messages(conversation_id=conversation_id)
        chat = _history_messages(messages, t, language)
        template = next((c.template for c in desk.store.list_conversations(session_key=session_key)
                         if c.id == conversation_id), gr.skip())
        return chat, chat, conversation_id, template

    async def api_chat(message: str, history: list | None, template: str, conversation_id: float | None,
                       tenant: str, request: gr.Request):
        """Scriptable chat: streams {"text", "done", ...}; the last one carries the stored stats.

        ``tenant`` (optional) keeps this caller's cached prefixes apart from every other tenant's;
        a tenant header set by a proxy, when configured, takes precedence.
        """
        session_key = f"api-{request.session_hash}"
        conversation_id = int(conversation_id) if conversation_id else None
        try:
            async for event in desk.answer(session_key=session_key, template_name=template,
                                           history=_turns(history or []), message=message,
                                           conversation_id=conversation_id,
                                           tenant=tenant_of(request) or (tenant or "")[:100]):
                if isinstance(event, Progress):
                    yield {"text": event.text, "done": False, "conversation_id": event.conversation_id}
                else:
                    yield _api_final(event, language)
        except DeskInputError as exc:
            yield {"text": "", "done": True, "status": "rejected", "error": str(exc)}

    with gr.Blocks(title=t["title"], analytics_enabled=False, fill_height=True) as demo:
        session_key = gr.BrowserState("", storage_key="prefixdesk-session", secret=browser_secret)
        conversation_id = gr.State(None)
        gr.Markdown(f"## {t['title']}\n{t['subtitle']}")
        if info.is_demo_model:
            gr.Markdown(t["demo"], elem_id="demo-notice")
        with gr.Row(equal_height=False):
            with gr.Column(scale=1, elem_classes="pd-sidebar"):
                template = gr.Dropdown(names, value=default, label=t["template"], elem_id="template")
                new_btn = gr.Button(t["new"], variant="secondary", elem_id="new-conversation")
                conversations = gr.Radio([], label=t["history"], elem_id="conversations")
            with gr.Column(scale=4):
                chatbot = gr.Chatbot(elem_id="chatbot", height=560, show_label=False)
                chat = gr.ChatInterface(
                    respond,
                    chatbot=chatbot,
                    textbox=gr.Textbox(placeholder=t["placeholder"], show_label=False, elem_id="message"),
                    additional_inputs=[template, conversation_id, session_key],
                    additional_outputs=[conversation_id, session_key, conversations],
                    concurrency_limit=None,
                    api_name="chat_ui",
                    api_visibility="private",
                    fill_height=True,
                )
        demo.load(start, [session_key], [session_key, conversations], api_visibility="private")
        conversations.input(open_conversation, [conversations, session_key],
                            [chat.chatbot, chat.chatbot_state, conversation_id, template], api_visibility="private")
        new_btn.click(lambda: ([], [], None, None), None,
                      [chat.chatbot, chat.chatbot_state, conversation_id, conversations], api_visibility="private")
        chatbot.clear(lambda: None, None, conversation_id, api_visibility="private")
        template.input(lambda: ([], [], None), None, [chat.chatbot, chat.chatbot_state, conversation_id],
                       api_visibility="private")

        with gr.Row(visible=False):
            api_message = gr.Textbox()
            api_history = gr.JSON()
            api_template = gr.Textbox()
            api_conversation = gr.Number(value=None)
            api_tenant = gr.Textbox(value="")
            api_out = gr.JSON()
            api_btn = gr.Button()
        api_btn.click(api_chat, [api_message, api_history, api_template, api_conversation, api_tenant], api_out,
                      api_name="chat", concurrency_limit=None)
    demo.css = CSS
    return demo


def _new_session_key() -> str:
    return uuid.uuid4().hex


def _turns(history: list[Any]) -> list[Turn]:
    """Gradio/OpenAI-style history → Turns; notices and captions (messages with a title) are not context."""
    turns = []
    for m in history:
        if not isinstance(m, dict) or (m.get("metadata") or {}).get("title"):
            continue
        text = _text_of(m.get("content"))
        if text and m.get("role") in ("user", "assistant"):
            turns.append(Turn(m["role"], text))
    return turns


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        return content.get("text", "") if content.get("type", "text") == "text" else ""
    if isinstance(content, list):
        return "".join(_text_of(c) for c in content)
    return ""


def _notice(text: str, t: dict) -> dict:
    return {"role": "assistant", "content": text, "metadata": {"title": t["notice"]}}


def _answer_messages(m: MessageRow, t: dict, language: str) -> list[dict]:
    out = [{"role": "assistant", "content": m.text}] if m.text else []
    if m.status == "ok":
        out.append({"role": "assistant", "content": "", "metadata": {"title": caption(m, language), "status": "done"}})
    elif m.status == "stopped":
        out.append({"role": "assistant", "content": "", "metadata": {"title": t["stopped"], "status": "done"}})
    else:
        out.append(_notice(m.error or "", t))
    return out


def _history_messages(messages: list[MessageRow], t: dict, language: str) -> list[dict]:
    out: list[dict] = []
    for m in messages:
        if m.role == "user":
            out.append({"role": "user", "content": m.text})
        elif m.status != "generating":
            out.extend(_answer_messages(m, t, language))
    return out


def _conversation_choices(desk: Desk, session_key: str, t: dict):
    rows = desk.store.list_conversations(session_key=session_key)
    choices = [(f"{c.created_at:%m-%d %H:%M} · {c.title or '…'}", c.id) for c in rows]
    return gr.update(choices=choices, value=None, label=t["history"] if choices else t["no_conversations"])


def _api_final(event: Finished, language: str) -> dict:
    m = event.message
    return {
        "text": m.text,
        "done": True,
        "status": m.status,
        "error": m.error,
        "caption": caption(m, language) if m.status == "ok" else "",
        "conversation_id": m.conversation_id,
        "message_id": m.id,
        "prompt_tokens": m.prompt_tokens,
        "num_cached_tokens": m.num_cached_tokens,
        "ttft_ms": m.ttft_ms,
        "output_tokens": m.output_tokens,
        "decode_tokens_per_s": m.decode_tokens_per_s,
        "dropped_turns": event.dropped_turns,
    }
