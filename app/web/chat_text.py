"""What the chat page says, in Chinese and English — and the caption under each answer.

The caption speaks to a customer ("answered in 12 ms: the help-desk rules were already loaded");
the numbers behind it (cached / prompt tokens, the engine's first token, the browser's first
glyph, tokens per second) are one click away in its details.
"""

from __future__ import annotations

from pathlib import Path

from app.db.rows import MessageRow

TEXT = {
    "zh": {
        "title": "优选商城 · 在线客服",
        "subtitle": "客服手册只读一遍：之后每个问题都直接从缓存开始回答。",
        "model": "回答模型：{model}",
        "demo": "⚠️ 当前使用内置演示模型（随机权重）：回答是占位文字，但 token 数、缓存命中和流式输出都是真实的。",
        "sidebar": "对话",
        "template": "咨询类别",
        "new": "＋ 新对话",
        "history": "历史对话",
        "no_conversations": "还没有历史对话",
        "placeholder": "请输入您的问题，例如：我刚买的手机屏幕碎了能退吗？",
        "chat_placeholder": "您好！请问有什么可以帮您？",
        "send": "发送",
        "stop": "停止",
        "retry": "重试",
        "notice": "⚠️ 提示",
        "stopped": "已停止",
        "empty": "请输入问题后再发送。",
        "internal": "抱歉，这次没能回答。请稍后再发送一次。",
        "nothing_to_retry": "还没有可以重试的回答。",
        "expired": "页面已过期，这条消息没有发送。再发送一次即可开始新的对话。",
        "session_not_yours": "这个会话属于另一个浏览器窗口：请刷新页面。",
        "session_hash_invalid": "session_hash 必须是 1 到 64 个字母、数字、“-”或“_”。",
        "api_message": "message 必须是字符串。",
        "api_template": "template 必须是已发布模板的名称（字符串）。",
        "api_conversation": "conversation_id 必须是正整数或 null。",
        "api_history": "history 必须是由 {role: user|assistant, content: 字符串} 组成的列表，或 null。",
        "api_tenant": "租户只能由反向代理通过 PREFIXDESK_TENANT_HEADER 指定；请去掉 tenant 参数。",
    },
    "en": {
        "title": "Northwind Help Desk",
        "subtitle": "The help-desk rules are read once: every question after that starts from the cache.",
        "model": "Answers by: {model}",
        "demo": "⚠️ Demo model in use (random weights): replies are placeholder text, but token counts, cache hits "
                "and streaming are real.",
        "sidebar": "Conversations",
        "template": "Topic",
        "new": "＋ New conversation",
        "history": "Earlier conversations",
        "no_conversations": "No conversations yet",
        "placeholder": "Type your question, e.g. Can I return shoes I wore once?",
        "chat_placeholder": "Hello! How can we help?",
        "send": "Send",
        "stop": "Stop",
        "retry": "Retry",
        "notice": "⚠️ Notice",
        "stopped": "Stopped",
        "empty": "Please type a question before sending.",
        "internal": "Sorry, this could not be answered. Please send it again in a moment.",
        "nothing_to_retry": "There is no answer to retry yet.",
        "expired": "This page had expired, so your message was not sent. Send it again to start a new conversation.",
        "session_not_yours": "This session belongs to another browser: reload the page to start your own.",
        "session_hash_invalid": "session_hash must be 1 to 64 letters, digits, '-' or '_'.",
        "api_message": "message must be a string.",
        "api_template": "template must be the name of a published template (a string).",
        "api_conversation": "conversation_id must be a positive integer or null.",
        "api_history": "history must be a list of {role: user|assistant, content: string}, or null.",
        "api_tenant": "Only the reverse proxy may name a tenant (PREFIXDESK_TENANT_HEADER); remove the tenant argument.",
    },
}

MODEL_NAMES = {"qwen2.5-0.5b-demo": "Qwen2.5-Coder-0.5B-Instruct"}


def model_label(model_setting: str, language: str) -> str:
    """The model's name for the page: the demo model, a built-in alias, or the folder / hub id."""
    if not model_setting:
        return "内置演示模型（随机权重）" if language == "zh" else "built-in demo model (random weights)"
    return MODEL_NAMES.get(model_setting, Path(model_setting).name or model_setting)


def caption_title(m: MessageRow, language: str) -> str:
    """One line a customer understands, e.g. ``⚡ answered in 12 ms — the help-desk rules were already loaded``."""
    ttft = f"{m.ttft_ms or 0:.0f}"
    if m.num_cached_tokens:
        return (f"⚡ {ttft} 毫秒开始回答 · 客服手册已在缓存中" if language == "zh"
                else f"⚡ answered in {ttft} ms — the help-desk rules were already loaded")
    return (f"{ttft} 毫秒开始回答 · 首次读取客服手册" if language == "zh"
            else f"answered in {ttft} ms — the help-desk rules were read first")


def caption_details(m: MessageRow, language: str) -> str:
    """The numbers behind the caption; the browser fills in its own first-glyph time (the pd-glyph span)."""
    glyph = '<span class="pd-glyph">—</span>'
    replica = f" · {m.replica}" if m.replica else ""
    if language == "zh":
        return (f"缓存命中 {m.num_cached_tokens} / {m.prompt_tokens} 个提示 token · 引擎首 token {m.ttft_ms:.0f} ms · "
                f"浏览器首字 {glyph} ms · {m.decode_tokens_per_s:.0f} token/s{replica}")
    return (f"cached {m.num_cached_tokens} / {m.prompt_tokens} prompt tokens · engine first token {m.ttft_ms:.0f} ms · "
            f"browser first glyph {glyph} ms · {m.decode_tokens_per_s:.0f} tok/s{replica}")
