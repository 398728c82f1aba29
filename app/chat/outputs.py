"""Each event's outputs, in the order the page wires them: the handler returns one of these, its guard (``calm``)
skips as many, and page.py lists the components by the same field names. Every field names a component of the
page (page.py's ``parts``)."""

from __future__ import annotations

from typing import Any, NamedTuple, TypeVar

import gradio as gr

T = TypeVar("T", bound=tuple)


class Screen(NamedTuple):
    """A question and its answer as they stream (send, a suggested question, an edit, Retry, Continue)."""
    chatbot: Any
    shown: Any
    conversation_id: Any
    session_key: Any
    returned: Any  # a refused message, handed back to the box by after_answer


class Answered(NamedTuple):
    """The sidebar once an answer is stored, a refused message back in the box, and the poll for a person."""
    conversations: Any
    box: Any
    returned: Any
    person_timer: Any
    seen: Any


class Stopped(NamedTuple):
    """The stored conversation once a stopped answer has stored itself, and the sidebar with it."""
    chatbot: Any
    shown: Any
    conversation_id: Any
    conversations: Any


class Followed(NamedTuple):
    """An answer written for a page that went away, followed by its reload: the answer so far, then the stored
    conversation and the timer stopped."""
    chatbot: Any
    shown: Any
    answer_timer: Any


class Reported(NamedTuple):
    """The shown conversation with the last answer's caption saying the first glyph's time the page measured. The
    chatbot is not drawn again: the page has written the time into the caption itself (static/chat.js), and a
    redraw would have unmarked a 👍 given meanwhile. (Two fields: Gradio would take a one-field tuple for the value.)"""
    shown: Any
    first_visible: Any  # the page's report box, emptied: the report is taken


class Loaded(NamedTuple):
    """The page as it was left, when it loads."""
    session_key: Any
    template: Any
    conversations: Any
    chatbot: Any
    shown: Any
    conversation_id: Any
    person_timer: Any
    seen: Any
    answer_timer: Any  # on while the open conversation's answer is still written for the page before a reload


class Opened(NamedTuple):
    """A conversation picked in the sidebar."""
    chatbot: Any
    shown: Any
    conversation_id: Any
    template: Any
    conversations: Any
    person_timer: Any
    seen: Any


class Begun(NamedTuple):
    """A new conversation: New, another topic, the chatbot's trash icon, Delete."""
    chatbot: Any
    shown: Any
    conversation_id: Any
    conversations: Any
    person_timer: Any


class Renamed(NamedTuple):
    conversations: Any
    new_title: Any


class PersonAsked(NamedTuple):
    """The conversation handed to a person, and the page polling for their replies."""
    chatbot: Any
    shown: Any
    person_timer: Any
    seen: Any


class Polled(NamedTuple):
    """A person's new replies, and the poll stopped once the conversation is handed back."""
    chatbot: Any
    shown: Any
    seen: Any
    person_timer: Any


class Rated(NamedTuple):
    """A 👍 or 👎 kept, and a 👎's optional reason asked for (or kept, and the customer thanked)."""
    reason_row: Any
    rating_for: Any
    reason: Any
    thanks: Any


def nothing(outputs: type[T]) -> T:
    """``outputs`` all left as they are."""
    return outputs(*(gr.skip() for _ in outputs._fields))
