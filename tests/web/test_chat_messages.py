"""The chat's streaming events skip Gradio's postprocessing and send messages they built themselves:
those must be exactly what Gradio's Chatbot would have made of them, or the page would show something else."""

import gradio as gr

from app.web.chat import _message

CASES = [
    ("user", "我刚买的手机屏幕碎了能退吗？", None),
    ("assistant", "  indented first line\n      and a deeper one\n    back\n\n", None),  # cleandoc'd by Gradio
    ("assistant", "\tTabbed\ttext\n\n\n", None),
    ("assistant", "", None),
    ("assistant", "缓存命中 1024 / 1065 个提示 token · 引擎首 token 12 ms", "⚡ 12 毫秒开始回答 · 客服手册已在缓存中"),
    ("assistant", "<script>alert(1)</script> **bold**", "⚠️ Notice"),
]


def test_each_message_is_what_gradios_chatbot_makes_of_it():
    as_chat_sends = [{"role": role, "content": text, **({"metadata": {"title": title, "status": "done"}} if title
                                                        else {})} for role, text, title in CASES]
    assert gr.Chatbot().postprocess(as_chat_sends).model_dump() == [_message(*case) for case in CASES]


def test_gradios_chatbot_leaves_the_chats_messages_unchanged():
    # The events that keep Gradio's postprocessing (stop, reopening a conversation) get the same messages.
    built = [_message(*case) for case in CASES]
    assert gr.Chatbot().postprocess(built).model_dump() == built
