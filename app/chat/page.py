"""The chat page: template picker, conversations, send / stop / retry — its components and the wiring of their
events to the handlers (app/chat/handlers/), and the scriptable ``/chat`` (app/chat/api.py).

The conversation a customer sees is rebuilt from the database after every answer and kept in
server-side state; the chatbot is only ever an output, so no value a browser sends is echoed back
as a component value (Gradio would serve a file named in such a value). Every text in it is shown
as text, except answers (the model's and a person's), which are safe Markdown made into HTML
(app/chat/markdown.py): HTML written in any message is escaped, an image stays text and a link goes only to
http(s) or mailto, so no message can draw a form or fetch an image.

Streaming is where the page spends its server's time, so its events do the least Gradio lets them
(docs/benchmarks.md, "The chat path"): their outputs are the chatbot, the server-side states and the
session key, with no ``gr.skip()`` of a component (Gradio 6 rebuilds a component for each skip: 1.1
of the 1.7 ms an update cost; and the page sets every output again from every update, so an output
cannot simply repeat its value either); Gradio's postprocessing is off for them, because the messages
are built in the chatbot's own format (app/chat/render.py), each once (the history when the answer starts, then
only the answer); the page empties the message box itself; and the sidebar's list is refreshed once,
after the answer, by a short event of its own (which also hands a refused message back to the box).

Each event's outputs are one NamedTuple of app/chat/outputs.py: its handler returns it, its guard skips as many,
and the wiring lists the components by its field names (``parts``).
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import gradio as gr

from app.chat import api, outputs
from app.chat.context import ChatContext
from app.chat.handlers import answers, conversations, feedback, person
from app.chat.text import TEXT
from app.core.callers import ProxyTrust
from app.core.desk import Desk
from app.core.session_keys import SessionKeys
from app.engine import EngineInfo

PERSON_POLL_S = 3.0  # how often a page whose conversation a person has asks for their replies
FOLLOW_S = 0.5  # how often a reloaded page asks for the answer its page before the reload had asked for
STATIC = Path(__file__).with_name("static")
CSS = (STATIC / "chat.css").read_text(encoding="utf-8")
# The page's script: the browser's first-glyph clock, and the sidebar closed on a phone.
JS = (STATIC / "chat.js").read_text(encoding="utf-8")
# Runs in the page when a question is sent, after its inputs were read (Gradio runs an event's js between reading
# its inputs and calling the server, and not at all when the event is skipped because an answer still streams).
# The question is kept in the browser until the page shows it (static/chat.js: a lost connection gives it back).
# A question sent right after New (or another topic, or Delete) starts a new conversation even when it leaves before
# the server has emptied the page's conversation (static/chat.js sets the mark): its conversation id is dropped.
CLEAR_BOX_JS = (STATIC / "clear_box.js").read_text(encoding="utf-8").rstrip()
# The same for a suggested question (its inputs: the topic, then the conversation id).
SUGGESTED_JS = (STATIC / "suggested.js").read_text(encoding="utf-8").rstrip()


def page_js(language: str) -> str:
    """The page's script with the texts it shows itself, in the UI language."""
    t = TEXT[language]
    shown = ("offline", "offline_title", "cut_off", "notice", "waiting_person", "with_person", "released", "pasted_cut",
             "delete_confirm", "liked", "disliked", "scroll_down", "answered", "answered_in", "first_text")
    return JS.replace("/*PD_TEXT*/{}", json.dumps({k: t[k] for k in shown}))


def build_chat(desk: Desk, info: EngineInfo, *, language: str, browser_secret: str, keys: SessionKeys,
               trust: ProxyTrust, model_name: str, updates_per_s: int = 2000) -> gr.Blocks:
    """The chat page. ``browser_secret`` encrypts the browser's copy of its session key (every page
    carries it: it is no secret from the browser); ``keys`` issues and checks the session keys. Both
    must outlive restarts. ``updates_per_s``: the screen updates all streaming answers share
    (PREFIXDESK_CHAT_UPDATES_PER_S)."""
    chat = ChatContext(desk, info, language, keys, trust, updates_per_s)
    t = chat.t

    def on(handler):
        """``handler`` bound to this page's context, as Gradio calls it (its signature without the context)."""
        return types.MethodType(handler, chat)

    with gr.Blocks(title=t["title"], analytics_enabled=False, fill_height=True) as demo:
        session_key = gr.BrowserState("", storage_key="prefixdesk-session", secret=browser_secret)
        # The open conversation, kept in the browser: a reload or a server restart opens it again. Its value is
        # the browser's, so every handler checks it (_conversation_id) and the desk checks who owns it.
        conversation_id = gr.BrowserState(None, storage_key="prefixdesk-open", secret=browser_secret)
        shown = gr.State([])  # the conversation as displayed, kept on the server
        with gr.Sidebar(label=t["sidebar"], open=True, elem_id="pd-sidebar"):
            new_btn = gr.Button(t["new"], variant="secondary", elem_id="new-conversation", size="sm")
            conversations_radio = gr.Radio([], label=t["history"], elem_id="conversations")
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
        # Messages come as HTML made here (app/chat/render.py, and answers' Markdown by app/chat/markdown.py): Gradio
        # renders no Markdown or LaTeX of its own, and its sanitizer (which keeps images and forms) is only the
        # second line.
        # The default topic's questions are the page's own: a page loading on it needs no update (loaded_chat).
        chatbot = gr.Chatbot(elem_id="chatbot", height="58vh", show_label=False, buttons=["copy"],
                             examples=[{"text": q} for q in chat.default_questions] or None,
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
        # While an answer asked for before a reload is still written, the reloaded page follows it (and only then).
        answer_timer = gr.Timer(FOLLOW_S, active=False)
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
        # The components an event's outputs name (app/chat/outputs.py), by the fields' names.
        parts = {"session_key": session_key, "template": template, "conversations": conversations_radio,
                 "chatbot": chatbot, "shown": shown, "conversation_id": conversation_id, "returned": returned,
                 "box": box, "new_title": new_title, "person_timer": person_timer, "seen": seen,
                 "reason_row": reason_row, "rating_for": rating_for, "reason": reason, "thanks": thanks,
                 "answer_timer": answer_timer, "first_visible": first_visible}

        def out(fields: type[tuple]) -> list:
            return [parts[name] for name in fields._fields]

        # The streaming events: their messages are already in the chatbot's format (module docstring). The page
        # empties the message box itself as a question leaves, so the box is none of their outputs.
        streaming = private
        screen = out(outputs.Screen)
        asked = [box, template, conversation_id, session_key, shown]
        submit = box.submit(on(answers.send), asked, screen, js=CLEAR_BOX_JS, **streaming)
        click = send_btn.click(on(answers.send), asked, screen, js=CLEAR_BOX_JS, **streaming)
        again = retry_btn.click(on(answers.retry), [conversation_id, session_key, shown], screen, **streaming)
        onwards = continue_btn.click(on(answers.go_on), [conversation_id, session_key, shown], screen, **streaming)
        picked = chatbot.example_select(on(answers.ask_suggested), [template, conversation_id, session_key, shown],
                                        screen, js=SUGGESTED_JS, **streaming)
        edited = chatbot.edit(on(answers.edit), [conversation_id, session_key, shown], screen, **streaming)
        for answered in (submit, click, again, onwards, picked, edited):  # the sidebar, once the answer is stored
            answered.then(on(answers.after_answer), [session_key, returned, conversation_id, shown],
                          out(outputs.Answered), queue=False, **private)  # one short request
        # The page runs a click's events one after another, each to its end: the cancel goes first, or the answer
        # would run on while after_stop waits for it to be stored as stopped.
        stop_btn.click(None, None, None, cancels=[submit, click, again, onwards, picked, edited],
                       api_visibility="private")
        stop_btn.click(on(answers.after_stop), [conversation_id, session_key, shown], out(outputs.Stopped),
                       **private)
        first_visible_btn.click(on(answers.report_first_visible), [first_visible, conversation_id, session_key, shown],
                                out(outputs.Reported), queue=False, **private)
        chatbot.like(on(feedback.rated), [shown, session_key], out(outputs.Rated), queue=False, **private)
        for asked_reason in (reason.submit, reason_btn.click):
            asked_reason(on(feedback.send_reason), [reason, rating_for, session_key], out(outputs.Rated),
                         queue=False, **private)
        person_btn.click(on(person.ask_person), [conversation_id, session_key, shown], out(outputs.PersonAsked),
                         queue=False, **private)
        person_timer.tick(on(person.poll), [conversation_id, session_key, shown, seen], out(outputs.Polled),
                          queue=False, **private)
        answer_timer.tick(on(answers.follow), [conversation_id, session_key, shown], out(outputs.Followed),
                          queue=False, **private)
        # One short request when the page loads, outside the queue (no event stream to open and close for it).
        demo.load(on(conversations.on_load), [session_key, conversation_id], out(outputs.Loaded), queue=False,
                  **private)
        conversations_radio.input(on(conversations.open_conversation), [conversations_radio, session_key],
                                  out(outputs.Opened), **private)
        begin = {"fn": on(conversations.fresh), "inputs": [template], "outputs": out(outputs.Begun)}
        new_btn.click(**begin, **private)
        template.input(on(conversations.change_topic), [template, conversation_id, session_key], begin["outputs"],
                       **private)
        rename_btn.click(on(conversations.rename), [new_title, conversation_id, session_key], out(outputs.Renamed),
                         queue=False, **private)
        delete_btn.click(on(conversations.delete), [conversation_id, session_key, template], out(outputs.Begun),
                         queue=False, **private)
        # The topics as published now, each time the customer opens the picker (a page opened before a publish).
        template.focus(lambda: gr.update(choices=chat.topics()), None, template, queue=False, **private)
        chatbot.clear(**begin, **private)  # the chatbot's own trash icon starts a new conversation too

        # The scriptable endpoint, with no components of its own: each component is a page block that Gradio
        # configures again for every new browser session.
        gr.api(on(api.api_chat), api_name="chat", concurrency_limit=None)
    return demo
