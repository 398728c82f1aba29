"""What the chat page says, in Chinese and English — every text a customer can read, and the caption under
each answer.

One table per language, with the same keys (a test holds them equal), in plain words: no text here speaks
of tokens, prompts or caches. Why the desk did not answer arrives as a code (app/core/refusals.py) and is
said from the language's ``refusals`` table. The caption's title is when the answer's first text reached
the customer's screen, as their browser measured it; the server's own figures are one click away, in its
details. API_TEXT is what the scriptable /chat tells developers.
"""

from __future__ import annotations

from pathlib import Path

from app.core.cache_figures import reused_percent
from app.db.rows import MessageRow

TEXT = {
    "zh": {
        "title": "优选商城 · 在线客服",
        "subtitle": "有问题随时问：客服会立即回复，也可以随时转人工。",
        "model": "回答模型：{model}",
        "demo": "提示：当前使用内置演示模型（随机权重），回答是占位文字，只用来演示页面和回复速度。",
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
        "notice": "提示：",
        "stopped": "已停止",
        "empty": "请输入问题后再发送。",
        "internal": "抱歉，这次没能回答。请稍后再发送一次。",
        "nothing_to_retry": "还没有可以重试的回答。",
        "expired": "页面已过期，这条消息没有发送。再发送一次即可开始新的对话。",
        "session_not_yours": "这个会话属于另一个浏览器窗口：请刷新页面。",
        "session_hash_invalid": "session_hash 必须是 1 到 64 个字母、数字、“-”或“_”。",
        "session_claims": "这个浏览器一分钟内打开的页面太多了：请等一分钟再刷新页面。",
        "offline": "暂时连不上客服，您输入的内容已保留。请稍后再发送。",
        "offline_title": "连接中断",
        "answered_in": "{s} 秒内开始回复",
        "answered": "已回复",
        "first_text": "首字显示 {ms} 毫秒",
        "server_start": "服务器开始回复 {ms} 毫秒",
        "reused": "已读资料复用 {percent}%",
        "speed": "每秒 {rate} 字",
        "cut_off": "回答较长，已截断",
        "continue": "继续",
        "with_person": "人工客服正在处理这段对话，回复会显示在这里。",
        "waiting_person": "已为您转接人工客服，请稍候，回复会显示在这里。",
        "person": "人工客服",  # never the operator's login name: an account is no name for customers
        "person_button": "转人工",
        "person_asked": "已转接人工客服",
        "person_first": "请先描述您的问题，再转人工客服。",
        "released": "人工客服已结束接待，之后由智能客服继续回答。",
        "good": "有帮助",
        "bad": "没帮助",
        "reason": "哪里不满意？（可选）",
        "rate_send": "提交",
        "rated": "谢谢您的反馈！",
        "liked": "已标为有帮助",
        "disliked": "已标为没帮助",
        "scroll_down": "滚动到底部",
        "copy": "复制",
        "copied": "已复制",
        "cancel": "取消",
        "undo": "撤销",
        "clear_chat": "清空对话",
        "loading": "加载中",
        "rename": "重命名",
        "rename_placeholder": "新的标题",
        "delete": "删除对话",
        "delete_confirm": "确定删除这段对话吗？删除后无法恢复。",
        "edit": "修改上一个问题",
        "examples": "您可以这样问：",
        "pasted_cut": "粘贴的内容超过 {limit} 字的上限，只保留了前 {limit} 字。请缩短或分成几条发送。",
        "refusals": {
            "not_text": "这条消息无法读取，请重新输入后发送。",
            "empty": "请输入问题后再发送。",
            "rate": "您发送得有点快，请等 {wait_s} 秒后再发送。",
            "streams": "上一个回答还在进行中，请等它结束后再发送。",
            "address_rate": "您所在的网络此刻发来的消息较多，请等 {wait_s} 秒后再发送。",
            "address_streams": "您所在的网络此刻有很多回答正在进行，请稍等片刻后再发送。",
            "message_chars": "这条消息太长了（{chars} 字，最多 {limit} 字），请缩短或分成几条发送。",
            "session": "页面已过期，请刷新页面后再发送。",
            "no_conversation": "找不到这段对话了，请开始新的对话。",
            "nothing_to_retry": "还没有可以重试的回答。",
            "nothing_to_edit": "还没有可以修改的问题。",
            "edit_with_person": "人工客服正在处理这段对话，问题不能再修改了。请直接发送新消息。",
            "edit_stale": "这段对话在别处有了新内容，请刷新页面后再修改。",
            "answering": "上一个问题还在回答中，请等回答结束（或点“停止”）后再试。",
            "edit_last_only": "只能修改最后一个问题。要改前面的内容，请开始新的对话。",
            "no_template": "这个咨询类别已不再提供，请选择其他类别。",
            "not_saved": "消息没能保存，所以没有发送。请稍后再发送一次。",
            "not_retried": "这次没能重试，请稍后再试。",
            "unreadable": "暂时打不开这段对话，请稍后再试。",
            "history_messages": "这段对话太长了，请开始新的对话。",
            "history_chars": "这段对话太长了，请开始新的对话。",
            "message_too_long": "这条消息太长了，请缩短后再发送。",
            "conversation_too_long": "这段对话已经很长了，请开始新的对话继续咨询。",
            "prefix_unstable": "这个咨询类别暂时无法回答，请选择其他类别或稍后再试。",
            "not_continuable": "这个回答无法继续，请重新提问。",
            "nothing_to_continue": "上一个回答已经完整，没有需要继续的内容。",
            "person_queue_full": "人工客服现在都在忙，暂时无法转接。请过几分钟再点“转人工”，也可以继续在这里提问。",
            "person_queue_own": "您已有对话在等待人工客服，客服会先回复那些对话，请稍候。",
            "busy": "客服现在很忙，请稍等片刻再发送。",
            "rejected": "这个问题暂时无法回答，请换个说法再试。",
            "broke_off": "回答中途中断了，请点“重试”。",
            "internal": "抱歉，这次没能回答。请稍后再发送一次。",
        },
    },
    "en": {
        "title": "Northwind Help Desk",
        "subtitle": "Ask anything: answers start at once, and a person can take over whenever you like.",
        "model": "Answers by: {model}",
        "demo": "Note: the built-in demo model is in use (random weights): replies are placeholder text, shown to "
                "demonstrate the page and its speed.",
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
        "notice": "Note: ",
        "stopped": "Stopped",
        "empty": "Please type a question before sending.",
        "internal": "Sorry, this could not be answered. Please send it again in a moment.",
        "nothing_to_retry": "There is no answer to retry yet.",
        "expired": "This page had expired, so your message was not sent. Send it again to start a new conversation.",
        "session_not_yours": "This session belongs to another browser: reload the page to start your own.",
        "session_hash_invalid": "session_hash must be 1 to 64 letters, digits, '-' or '_'.",
        "session_claims": "This browser has opened too many pages in the last minute: wait a minute, then reload the page.",
        "offline": "The help desk cannot be reached right now; what you typed is kept. Please send it again shortly.",
        "offline_title": "Connection lost",
        "answered_in": "Reply began within {s} s",
        "answered": "Answered",
        "first_text": "first text on screen {ms} ms",
        "server_start": "server began replying {ms} ms",
        "reused": "reading reused {percent}%",
        "speed": "{rate} characters per second",
        "cut_off": "Long answer, cut short",
        "continue": "Continue",
        "with_person": "A person is answering this conversation; their reply will appear here.",
        "waiting_person": "We are finding a person to help you; their reply will appear here.",
        "person": "Support agent",
        "person_button": "Talk to a person",
        "person_asked": "A person has been asked to help",
        "person_first": "Please describe your question first, then ask for a person.",
        "released": "The person has finished; the automatic assistant answers again.",
        "good": "Helpful",
        "bad": "Not helpful",
        "reason": "What was wrong? (optional)",
        "rate_send": "Send",
        "rated": "Thank you for your feedback!",
        "liked": "Marked helpful",
        "disliked": "Marked not helpful",
        "scroll_down": "Scroll to the end",
        "copy": "Copy",
        "copied": "Copied",
        "cancel": "Cancel",
        "undo": "Undo",
        "clear_chat": "Clear conversation",
        "loading": "Loading",
        "rename": "Rename",
        "rename_placeholder": "New title",
        "delete": "Delete conversation",
        "delete_confirm": "Delete this conversation? It cannot be brought back.",
        "edit": "Edit last question",
        "examples": "You could ask:",
        "pasted_cut": "The pasted text was longer than the {limit}-character limit; only the first {limit} characters "
                      "were kept. Please shorten it or send it in parts.",
        "refusals": {
            "not_text": "This message could not be read. Please type it again and send.",
            "empty": "Please type a question before sending.",
            "rate": "You are sending messages a little fast. Please wait {wait_s} seconds, then send again.",
            "streams": "An answer is still on its way. Please wait for it to finish, then send again.",
            "address_rate": "Many messages are coming from your network just now. Please wait {wait_s} seconds, "
                            "then send again.",
            "address_streams": "Many answers are on their way to your network just now. Please wait a moment, "
                               "then send again.",
            "message_chars": "This message is too long ({chars} characters; at most {limit}). Please shorten it "
                             "or send it in parts.",
            "session": "This page has expired. Please reload it and send again.",
            "no_conversation": "This conversation cannot be found any more. Please start a new one.",
            "nothing_to_retry": "There is no answer to retry yet.",
            "nothing_to_edit": "There is no question to edit yet.",
            "edit_with_person": "A person is answering this conversation, so the question can no longer be edited. "
                                "Please send a new message instead.",
            "edit_stale": "This conversation has changed elsewhere. Please reload the page, then edit.",
            "answering": "The last question is still being answered. Wait for it to finish (or press Stop), then "
                         "try again.",
            "edit_last_only": "Only the last question can be edited. To change an earlier one, start a new "
                              "conversation.",
            "no_template": "This topic is no longer offered. Please choose another topic.",
            "not_saved": "Your message could not be saved, so it was not sent. Please send it again shortly.",
            "not_retried": "This could not be retried. Please try again shortly.",
            "unreadable": "This conversation cannot be opened right now. Please try again shortly.",
            "history_messages": "This conversation is too long. Please start a new one.",
            "history_chars": "This conversation is too long. Please start a new one.",
            "message_too_long": "This message is too long. Please shorten it and send again.",
            "conversation_too_long": "This conversation has grown long. Please start a new conversation to go on.",
            "prefix_unstable": "This topic cannot be answered right now. Please choose another topic or try later.",
            "not_continuable": "This answer cannot be continued. Please ask again.",
            "nothing_to_continue": "The last answer is complete; there is nothing to continue.",
            "person_queue_full": "Everyone on our team is busy right now, so we cannot bring in a person yet. Please "
                                 "ask for a person again in a few minutes, or keep asking here.",
            "person_queue_own": "You already have a conversation waiting for a person. They will answer that one "
                                "first; please wait for them.",
            "busy": "The help desk is very busy. Please wait a moment, then send again.",
            "rejected": "This question cannot be answered right now. Please try putting it another way.",
            "broke_off": "The answer broke off. Please press Retry.",
            "internal": "Sorry, this could not be answered. Please send it again in a moment.",
        },
    },
}

# What the scriptable /chat tells developers, in the UI language: precise, with the names of its arguments.
API_TEXT = {
    "zh": {
        "api_message": "message 必须是字符串。",
        "api_template": "template 必须是已发布模板的名称（字符串）。",
        "api_conversation": "conversation_id 必须是正整数或 null。",
        "api_history": "history 必须是由 {role: user|assistant, content: 字符串} 组成的列表，或 null。",
        "api_tenant": "租户只能由反向代理通过 PREFIXDESK_TENANT_HEADER 指定；请去掉 tenant 参数。",
    },
    "en": {
        "api_message": "message must be a string.",
        "api_template": "template must be the name of a published template (a string).",
        "api_conversation": "conversation_id must be a positive integer or null.",
        "api_history": "history must be a list of {role: user|assistant, content: string}, or null.",
        "api_tenant": "Only the reverse proxy may name a tenant (PREFIXDESK_TENANT_HEADER); remove the tenant "
                      "argument.",
    },
}

# Gradio draws some words of its own on the page (its chatbot's buttons, its loading text) and picks their language
# from the browser's, not the page's: a Chinese page in an English browser said "Copy message", and Gradio's own
# Chinese lacks that one. The page's words stand in for Gradio's under these keys (Gradio's), in every language
# Gradio knows (GRADIO_LOCALES), so the page speaks one language whatever the browser's (app/chat/page.py).
GRADIO_KEYS = {
    "chatbot.copy_message": "copy", "chatbot.copied_message": "copied", "chatbot.like": "good",
    "chatbot.dislike": "bad", "chatbot.edit": "edit", "chatbot.submit": "send", "chatbot.cancel": "cancel",
    "chatbot.retry": "retry", "chatbot.undo": "undo", "chatbot.clear": "clear_chat", "common.loading": "loading",
}
# The languages Gradio's page may pick (the lang files of its frontend; a test holds this list to them).
GRADIO_LOCALES = ("ar", "ca", "ckb", "de", "en", "es", "et", "eu", "fa", "fi", "fr", "he", "hi", "id", "ja", "ko", "lt",
                  "nb", "nl", "pl", "pt", "pt-BR", "ro", "ru", "sv", "ta", "th", "tr", "uk", "ur", "uz", "zh-CN",
                  "zh-TW")


def gradio_words(language: str) -> dict[str, dict[str, str]]:
    """Gradio's own words in the page's ``language``, for each language Gradio may pick (gr.I18n's translations)."""
    t = TEXT[language]
    words = {key: t[ours] for key, ours in GRADIO_KEYS.items()}
    return {locale: dict(words) for locale in GRADIO_LOCALES}


MODEL_NAMES = {"qwen2.5-0.5b-demo": "Qwen2.5-Coder-0.5B-Instruct"}


def model_label(model_setting: str, language: str) -> str:
    """The model's name for the page: the demo model, a built-in alias, or the folder / hub id."""
    if not model_setting:
        return "内置演示模型（随机权重）" if language == "zh" else "built-in demo model (random weights)"
    return MODEL_NAMES.get(model_setting, Path(model_setting).name or model_setting)


def refusal_text(code: str, params: dict, language: str) -> str:
    """Why the desk did not answer, in the customer's words (an unknown code: the general apology)."""
    table = TEXT[language]["refusals"]
    try:
        return table[code].format(**params)
    except (KeyError, IndexError, ValueError):
        return table["internal"]


def seconds(ms: float) -> str:
    """``ms`` as a customer reads it: seconds with one decimal, rounded up (within 0.1 s)."""
    tenths = max(1, -(-int(round(ms)) // 100))
    return f"{tenths // 10}.{tenths % 10}"


def caption_title(m: MessageRow, language: str) -> str:
    """One line a customer understands: when the reply began on their screen, e.g. ``1.2 秒内开始回复`` — the
    browser's measure (``first_visible_ms``); before the browser reported it, plainly "answered"."""
    t = TEXT[language]
    if m.first_visible_ms is None:
        return t["answered"]
    return t["answered_in"].format(s=seconds(m.first_visible_ms))


def caption_details(m: MessageRow, language: str) -> str:
    """The figures behind the caption: the screen's first text, the server's start, what was read before, the
    speed; the page writes the first text it measured itself into the caption on screen (static/chat.js)."""
    t = TEXT[language]
    shown = f"{m.first_visible_ms:.0f}" if m.first_visible_ms is not None else "—"
    parts = [t["first_text"].format(ms=shown)]
    if m.ttft_ms is not None:
        parts.append(t["server_start"].format(ms=f"{m.ttft_ms:.0f}"))
    if m.prompt_tokens and (percent := reused_percent(m.num_cached_tokens, m.shared_tokens)) is not None:
        parts.append(t["reused"].format(percent=percent))  # a share of the shared prefix: the same in every arm
    if (rate := chars_per_s(m)) is not None:
        parts.append(t["speed"].format(rate=f"{rate:.0f}"))
    if m.replica:
        parts.append(m.replica)
    return " · ".join(parts)


def chars_per_s(m: MessageRow) -> float | None:
    """How fast the answer's text came, in characters a second (what "每秒 N 字" promises), or None when not measured.

    The engine measures tokens a second while it writes (``decode_tokens_per_s``); a token is a piece of a word or
    several characters, so the same speed reads 4 字 in Chinese and 12 in English. The answer's characters per
    token turn it into characters: its text over its tokens, times their rate."""
    if not m.decode_tokens_per_s or not m.output_tokens or not m.text:
        return None
    return m.decode_tokens_per_s * len(m.text) / m.output_tokens
