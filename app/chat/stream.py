"""The paced pieces: an answer streams to the page at most UI_UPDATE_INTERVAL_S apart (longer under load), each
update carrying all the text so far, and the conversation as stored comes last.

Streaming is where the page spends its server's time, so its updates do the least Gradio lets them
(docs/benchmarks.md, "The chat path"): while an answer streams, the history's messages are the same objects in
every update and only the answer's message is new, and the server-side states are skipped.
"""

from __future__ import annotations

import asyncio

import gradio as gr

from app.chat.outputs import Screen
from app.chat.render import _answer_messages, _notice, _one_person_notice, answer_so_far
from app.chat.text import refusal_text
from app.core.desk import WITH_PERSON, Finished, Progress
from app.db.states import Handoff

# Ten updates a second read as smooth streaming; each one makes the page render the whole answer again,
# and at the desk's fifty a second a slow or busy device falls seconds behind and stops answering clicks.
# Under load the interval grows (update_interval_s): the server's cost is per update, not per token.
UI_UPDATE_INTERVAL_S = 0.1


def update_interval_s(answers_in_flight: int, updates_per_s: int) -> float:
    """Seconds between one answer's screen updates: UI_UPDATE_INTERVAL_S, or longer when the answers in flight
    would together send more than ``updates_per_s`` (each update costs Gradio the same, however much text it
    carries: bench/chat_updates.py)."""
    return max(UI_UPDATE_INTERVAL_S, answers_in_flight / updates_per_s)


async def _stream(events, base: list, conversation_id, session_key: str, t: dict, language: str, pace_s):
    """A Screen for each of the desk's events: the answer so far, then the conversation as stored.

    The first text goes out at once; after it, one update per ``pace_s()`` at most (UI_UPDATE_INTERVAL_S,
    longer under load): the next event is taken only then, and the engine's output gathers meanwhile,
    so each update carries all the text so far. While the answer streams, the history's messages are the same objects in every
    update (Gradio's diff sees them unchanged at once) and only the answer's message is new; the
    shown state keeps its value (skipping a state costs Gradio nothing).
    """
    loop = asyncio.get_running_loop()
    next_update_at = 0.0
    asked_in = conversation_id
    while True:
        if (wait_s := next_update_at - loop.time()) > 0:
            await asyncio.sleep(wait_s)
        try:
            event = await anext(events)
        except StopAsyncIteration:
            return
        if isinstance(event, Progress):
            next_update_at = loop.time() + pace_s()
            conversation_id = event.conversation_id  # a BrowserState: set from every update (a skip costs more)
            yield Screen(base + [answer_so_far(event.text)], gr.skip(), conversation_id, session_key, gr.skip())
        elif isinstance(event, Finished):
            # The conversation as stored, with no second read of the database: what was shown (stored messages,
            # and last the question as the desk stores it; a new conversation is the question alone) and the
            # answer's stored row, as the customer may see it (event.customer: app/core/cache_figures.py).
            shown = base if asked_in == event.message.conversation_id else base[-1:]
            if event.message.status == WITH_PERSON:  # a person has the conversation: the question waits for them
                answer = [_notice(t["waiting_person" if event.handoff == Handoff.WAITING else "with_person"], t)]
            else:
                answer = _answer_messages(event.customer, t, language)
            if event.person_refused:  # the answer asked for a person and the queue's caps refused
                answer = answer + [_notice(refusal_text(event.person_refused, {}, language), t)]
            messages = _one_person_notice(shown + answer, t)
            yield Screen(messages, messages, event.message.conversation_id, session_key, gr.skip())
