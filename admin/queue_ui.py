"""The queue that calls: customers waiting for a person, seen from every tab of the console.

A timer asks the database every QUEUE_POLL_S how many wait (one indexed count, off the event loop) and shows
the longest waiting in the header, each wait in minutes. The page's script (static/queue.js) puts the count
in the browser tab's title — "(3) prefixdesk · operator console" — and, when a customer starts waiting and
the operator has "Notify me" on, plays a short sound (made with the Web Audio API) and shows a browser
notification if the browser allows them.

"Notify me" is kept in the browser's localStorage under the operator's name, not in the database: the
browser's own permission for notifications and its sound are per device, so an operator who turns it on
at one desk has to allow notifications at another anyway, and two operators who share a browser each keep
their own choice. Nothing an operator chooses here changes what the server does.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import gradio as gr

from admin.context import AdminContext
from admin.i18n import TEXT
from app.core.cache_tree import plural
from app.db import review as db_review
from app.db.models import utcnow
from app.db.rows import PersonQueue

QUEUE_POLL_S = 5.0  # how often an open console asks how many wait (one indexed count)
QUEUE_SHOWN = 8  # the longest waiting, named in the header
STATIC = Path(__file__).with_name("static")
JS = (STATIC / "queue.js").read_text(encoding="utf-8")


def admin_js(language: str) -> str:
    """The console page's script, with the texts it shows itself in ``language``."""
    t = TEXT[language]
    shown = ("queue_notice_title", "queue_notice_body")
    return JS.replace("/*PD_TEXT*/{}", json.dumps({k: t[k] for k in shown}, ensure_ascii=False))


def build_queue(console: AdminContext):
    """The header's queue line and "Notify me" toggle, with their timer; returns the page-load handler and its
    outputs (the load tells the page which operator it is and which customers already wait: none of those
    calls)."""
    t, access, db = console.text, console.access, console.db

    async def check(request: gr.Request):
        try:
            operator = await access.require(request)
        except gr.Error:  # a session that ended: the page says so at the operator's next action
            return gr.skip(), gr.skip()
        queue = await db.read(db_review.person_queue, oldest=QUEUE_SHOWN)
        return queue_line(queue, t, utcnow()), queue_payload(queue, operator)

    line = gr.Markdown(elem_id="pd-queue")
    notify = gr.Checkbox(False, label=t["queue_notify"], info=t["queue_notify_info"], elem_id="pd-notify",
                         container=False, scale=0, min_width=160)
    # What the page's script reads: the count, the newest ids and the operator, as JSON.
    data = gr.Textbox(visible=False, elem_id="pd-queue-data")
    timer = gr.Timer(QUEUE_POLL_S)
    quiet = {"api_visibility": "private", "show_progress": "hidden", "concurrency_limit": None}
    seen = {"fn": None, "inputs": data, "outputs": notify, "js": "(data) => window.pdQueue.update(data)",
            "show_progress": "hidden"}
    timer.tick(check, None, [line, data], **quiet).then(**seen)
    notify.input(None, notify, None, js="(on) => { window.pdQueue.setNotify(on); }")

    def after_load(event) -> None:
        event.then(**seen)

    return check, [line, data], after_load


def queue_line(queue: PersonQueue, t: dict[str, str], now: datetime) -> str:
    """The header's line: how many wait and the longest waiting, each wait in whole minutes; "" when none."""
    if not queue.total:
        return ""
    items = [t["queue_item"].format(id=cid, wait=minutes(now - at, t)) for cid, at in queue.oldest]
    if queue.total > len(items):
        items.append(t["queue_more"].format(n=queue.total - len(items)))
    return plural(t, "queue_line", queue.total, items=" · ".join(items))


def minutes(delta, t: dict[str, str]) -> str:
    whole = max(0, int(delta.total_seconds())) // 60
    return t["queue_minutes"].format(m=whole) if whole else t["queue_under_minute"]


def queue_payload(queue: PersonQueue, operator: str) -> str:
    return json.dumps({"count": queue.total, "ids": list(queue.newest_ids), "operator": operator})
