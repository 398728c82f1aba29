"""The chat's events skip Gradio's postprocessing and send messages they built themselves: those must be
exactly what Gradio's Chatbot would have made of the text as the chat shows it (HTML escaped: as_text; an
answer's Markdown as HTML: app/chat/markdown.py), or the page would show something else."""

import inspect

import gradio as gr

from app.chat.context import calm
from app.chat.markdown import markdown_html, streaming_html
from app.chat.outputs import Loaded
from app.chat.render import _message, as_text, whole_clusters
from app.chat.stream import _stream
from app.chat.text import TEXT
from app.core.desk import Progress
from tests.helpers.asgi import run_apart

CASES = [
    ("user", "我刚买的手机屏幕碎了能退吗？", None),
    ("assistant", "  indented first line\n      and a deeper one\n    back\n\n", None),  # cleandoc'd by Gradio
    ("assistant", "\tTabbed\ttext\n\n\n", None),
    ("assistant", "", None),
    ("assistant", "首字显示 951 毫秒 · 服务器开始回复 12 毫秒 · 已读资料复用 100%", "1.0 秒内开始回复"),
    ("assistant", "提示：<script>alert(1)</script> **bold**", None),
]


def test_each_message_is_what_gradios_chatbot_makes_of_it():
    # What Gradio makes of the text as the chat shows it: an answer's Markdown as HTML (of the text Gradio would
    # tidy with cleandoc), anything else HTML escaped (app/chat/render.py as_text).
    def shown(role: str, text: str, title: str | None) -> str:
        return markdown_html(inspect.cleandoc(text)) if role == "assistant" and not title else as_text(text)

    as_chat_sends = [{"role": role, "content": shown(role, text, title),
                      **({"metadata": {"title": title, "status": "done"}} if title else {})}
                     for role, text, title in CASES]
    assert gr.Chatbot().postprocess(as_chat_sends).model_dump() == [_message(*case) for case in CASES]


def test_gradios_chatbot_leaves_the_chats_messages_unchanged():
    # Postprocessing what the chat built changes nothing (a message is never escaped twice).
    built = [_message(*case) for case in CASES]
    assert gr.Chatbot().postprocess(built).model_dump() == built


def test_an_answers_updates_slow_down_only_when_the_answers_in_flight_would_exceed_the_budget():
    from app.chat.stream import UI_UPDATE_INTERVAL_S, update_interval_s

    assert UI_UPDATE_INTERVAL_S == 0.1
    assert [update_interval_s(n, 2000) for n in (0, 1, 200, 400, 1000)] == [0.1, 0.1, 0.1, 0.2, 0.5]
    assert update_interval_s(64, 100) == 0.64  # a server told it affords a hundred updates a second


def test_a_streaming_answer_never_ends_inside_a_grapheme_cluster():
    # The engine's text can end between 👩 + ZWJ and the 💻 of 👩‍💻 (or between a flag's two letters): the page
    # drew the pieces until the next update. Each update shows whole clusters; the rest waits for the next.
    assert whole_clusters("您好👩\u200d") == "您好"
    assert whole_clusters("您好👩\u200d💻") == "您好👩\u200d💻"
    assert whole_clusters("一家 👨\u200d👩\u200d👧\u200d") == "一家 "
    assert whole_clusters("👋🏽\u200d") == ""
    assert whole_clusters("中国 🇨🇳🇨") == "中国 🇨🇳"
    assert whole_clusters("中国 🇨🇳") == "中国 🇨🇳"
    assert whole_clusters("plain text") == "plain text"

    async def updates(texts):
        async def events():
            for text in texts:
                yield Progress(text, 7)
        return [update[0][-1]["content"][0]["text"] async for update in
                _stream(events(), [], None, "key", TEXT["zh"], "zh", lambda: 0.0)]

    shown = run_apart(updates(["写代码的人👩\u200d", "写代码的人👩\u200d💻"]))
    assert shown == [streaming_html("写代码的人"), streaming_html("写代码的人👩\u200d💻")]


def test_a_handler_that_fails_leaves_every_output_of_its_event_as_it_is():
    @calm(Loaded)
    async def broken(session_key, open_id):
        raise RuntimeError("a fault the page must not show")

    outputs = run_apart(broken("", None))
    assert type(outputs) is Loaded and len(outputs) == len(Loaded._fields) == 9
    assert list(outputs) == [gr.skip()] * 9
