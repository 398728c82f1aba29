"""The Conversations tab: what customers asked, how each answer went, and the ones waiting for a person.

The list is a page of app/db/review.py's search (waiting for a person first, with how long); a row
opens its transcript with every answer's numbers; an operator takes a waiting conversation, replies
as a person and hands it back to the model (app/db/conversations.py audits each step). The selection
exports as CSV or JSONL, streamed to a file that is kept ten minutes (admin/exports.py). With transcripts hidden (an audited option) the list
keeps its metadata, the transcript shows no text and exports leave it out.
"""

from __future__ import annotations

import asyncio
import html
from datetime import datetime

import gradio as gr

from admin.context import AdminContext
from admin.i18n import headers
from admin.markup import literal
from app.core.cache_tree import plural
from app.core.desk import MAX_MESSAGE_CHARS, clean_text
from app.db import conversations as db_conversations
from app.db import person_queue
from app.db import review as db_review
from app.db.models import utcnow
from app.db.person_queue import Cap, QueueState
from app.db.review import MAX_SEARCH_CHARS, ReviewInputError
from app.db.rows import MessageRow, ReviewFilter, ReviewPage, ReviewRow, Transcript
from app.db.states import Handoff

PAGE_SIZE = 20
HIDE = "hide_transcripts"
REFUSED = (ReviewInputError, db_conversations.HandoffError, LookupError, ValueError)

CSS = """
.pd-transcript { display: flex; flex-direction: column; gap: 8px; }
.pd-msg { border: 1px solid var(--border-color-primary); border-radius: 10px; padding: 8px 12px; }
.pd-msg.user { background: var(--background-fill-secondary); }
.pd-msg .pd-who { font-size: 12px; color: var(--body-text-color-subdued); font-weight: 600; }
.pd-msg .pd-text { white-space: pre-wrap; word-break: break-word; }
.pd-msg .pd-stats { font-size: 12px; color: var(--body-text-color-subdued); font-variant-numeric: tabular-nums; }
.pd-msg.hidden .pd-text { font-style: italic; color: var(--body-text-color-subdued); }
/* The list is read, not edited: a click opens the row's conversation, so the cell it lands on shows none of
   Gradio's editing marks (the selected cell's frame, its select-row and -column arrows, its menu). A header keeps to
   one line (on a phone the table scrolls sideways; "编号" broke into 编 / 号). */
#conv-table .cell-selected { box-shadow: none !important; }
#conv-table .selection-button, #conv-table .body-cell .cell-menu-button { display: none !important; }
#conv-table th .header { white-space: nowrap; word-break: keep-all; }
"""


def build_conversations_tab(console: AdminContext):
    """The tab's components and events; returns its refresh handler and outputs for the page load."""
    t, access, db = console.text, console.access, console.db

    async def hidden() -> bool:
        return await db.read(db_review.get_option, name=HIDE) == "yes"

    async def search(text, template, version, rating, status, tenant, page, request: gr.Request):
        await access.require(request)
        try:
            f = _filter(text, template, version, rating, status, tenant)
            result = await db.read(db_review.search, filter=f, page=_page(page), page_size=PAGE_SIZE)
        except REFUSED as exc:
            return t["refused"].format(message=exc), gr.skip(), gr.skip(), gr.skip(), gr.skip()
        if result.rows == () and result.total and result.page > 1:  # the filter shrank the list below this page
            result = await db.read(db_review.search, filter=f, page=result.num_pages, page_size=PAGE_SIZE)
        queue = await db.read(person_queue.queue_state, total_cap=console.settings.person_waiting_max)
        return (_summary(result, t), list_rows(result, t, hide=await hidden(), now=utcnow()), result.page,
                [r.id for r in result.rows], queue_line(queue, t))

    async def choices(request: gr.Request):
        await access.require(request)
        names = await console.templates.names()
        tenants = await db.read(db_review.tenants)
        return (gr.update(choices=[("—", "")] + [(n, n) for n in names]),
                gr.update(choices=[(t["conv_all_tenants"], "*")] + [(x or t["conv_no_tenant"], x) for x in tenants],
                          visible=any(tenants)),
                await hidden())

    async def open_conversation(conversation_id, request: gr.Request):
        await access.require(request)
        try:
            cid = _id(conversation_id)
            found = await db.read(db_review.transcript, conversation_id=cid)
        except REFUSED as exc:
            return t["refused"].format(message=exc), "", gr.skip()
        if found is None:
            return t["conv_not_found"].format(id=cid), "", gr.skip()
        return _headline(found.conversation, t, utcnow()), render_transcript(found, t, hide=await hidden()), cid

    async def pick_row(ids: list[int], event: gr.SelectData, request: gr.Request):
        row = event.index[0] if isinstance(event.index, (list, tuple)) else event.index
        if not isinstance(row, int) or not 0 <= row < len(ids or []):
            return gr.skip(), gr.skip(), gr.skip()
        return await open_conversation(ids[row], request)

    async def person_step(step: str, conversation_id, reply: str, request: gr.Request):
        user = await access.require(request)
        try:
            cid = _id(conversation_id)
            if step == "take":
                await db.write(db_conversations.take, conversation_id=cid, operator=user)
                done = t["conv_taken"].format(id=cid)
            elif step == "release":
                await db.write(db_conversations.release, conversation_id=cid, operator=user)
                done = t["conv_released"].format(id=cid)
            else:
                text = clean_text(reply if isinstance(reply, str) else "").strip()
                if not text:
                    raise ValueError(t["conv_reply_empty"])
                if len(text) > MAX_MESSAGE_CHARS:
                    raise ValueError(t["conv_reply_long"].format(n=MAX_MESSAGE_CHARS))
                await db.write(db_conversations.person_reply, conversation_id=cid, operator=user, text=text)
                done = t["conv_replied"].format(id=cid)
        except REFUSED as exc:
            return t["refused"].format(message=exc), gr.skip(), gr.skip(), gr.skip()
        headline, transcript, _ = await open_conversation(cid, request)
        return done, headline, transcript, "" if step == "reply" else gr.skip()

    async def take(conversation_id, request: gr.Request):
        return await person_step("take", conversation_id, "", request)

    async def reply(conversation_id, text, request: gr.Request):
        return await person_step("reply", conversation_id, text, request)

    async def release(conversation_id, request: gr.Request):
        return await person_step("release", conversation_id, "", request)

    async def set_hidden(value: bool, request: gr.Request):
        user = await access.require(request)
        if not isinstance(value, bool):
            return gr.skip(), t["refused"].format(message=t["conv_hide_bool"])
        await db.write(db_review.set_option, name=HIDE, value="yes" if value else "no", user=user)
        return value, t["conv_hidden_on" if value else "conv_hidden_off"]

    async def export(text, template, version, rating, status, tenant, fmt, request: gr.Request):
        await access.require(request)
        try:
            f = _filter(text, template, version, rating, status, tenant)
            if fmt not in db_review.EXPORT_FORMATS:
                raise ReviewInputError(t["conv_export_format"])
            await asyncio.to_thread(console.exports.prune)  # the exports past their time go first
            path = console.exports.new_path(f"conversations-{utcnow():%Y%m%d-%H%M%S}.{fmt}")
            console.exports.expire_later()
            include_text = not await hidden()
            with path.open("w", encoding="utf-8", newline="") as out:
                n = await db.read(db_review.export, filter=f, fmt=fmt, out=out, include_text=include_text)
        except REFUSED as exc:
            return t["refused"].format(message=exc), gr.skip()
        note = plural(t, "conv_exported", n) + ("" if include_text else " " + t["conv_exported_hidden"])
        note += " " + t["conv_export_kept"].format(minutes=round(console.exports.ttl_s / 60))
        return note, gr.update(value=str(path), visible=True)

    gr.Markdown(t["conv_help"])
    with gr.Row():
        text = gr.Textbox(label=t["conv_search"], max_length=MAX_SEARCH_CHARS, elem_id="conv-search", scale=3)
        template = gr.Dropdown([("—", "")], value="", allow_custom_value=True, label=t["conv_template"],
                               elem_id="conv-template", scale=2)
        version = gr.Textbox(label=t["conv_version"], max_length=12, elem_id="conv-version", scale=1)
        rating = gr.Dropdown([(t["conv_any"], ""), (t["conv_up"], "up"), (t["conv_down"], "down"),
                              (t["conv_unrated"], "unrated")],
                             value="", label=t["conv_rating"], elem_id="conv-rating", scale=1)
        status = gr.Dropdown([(t["conv_any"], "")] + [(t[f"status_{s}"], s) for s in db_review.STATUSES if s],
                             value="", label=t["conv_status"], elem_id="conv-status", scale=1)
        tenant = gr.Dropdown([(t["conv_all_tenants"], "*")], value="*", allow_custom_value=True,
                             label=t["conv_tenant"], elem_id="conv-tenant", visible=False, scale=1)
    with gr.Row():
        search_btn = gr.Button(t["conv_search_button"], variant="primary", elem_id="conv-search-button", size="sm")
        prev_btn = gr.Button(t["conv_prev"], size="sm", elem_id="conv-prev")
        next_btn = gr.Button(t["conv_next"], size="sm", elem_id="conv-next")
        page = gr.Number(value=1, precision=0, visible=False)
        hide = gr.Checkbox(label=t["conv_hide"], elem_id="conv-hide")
    summary = gr.Markdown(elem_id="conv-summary")
    queue = gr.Markdown(elem_id="conv-queue")  # the person queue: how many wait, and what its caps refused
    table = gr.Dataframe(headers=headers(console.language, "conv_headers"), interactive=False, wrap=True,
                         elem_id="conv-table", max_height=420)
    ids = gr.State([])
    with gr.Row():
        open_id = gr.Number(label=t["conv_id"], precision=0, elem_id="conv-open-id", scale=1)
        open_btn = gr.Button(t["conv_open"], size="sm", elem_id="conv-open", scale=1)
    headline = gr.Markdown(elem_id="conv-headline")
    transcript = gr.HTML(elem_id="conv-transcript")
    with gr.Row():
        take_btn = gr.Button(t["conv_take"], size="sm", elem_id="conv-take")
        release_btn = gr.Button(t["conv_release"], size="sm", elem_id="conv-release")
    reply_box = gr.Textbox(label=t["conv_reply"], lines=3, max_length=MAX_MESSAGE_CHARS, elem_id="conv-reply")
    reply_btn = gr.Button(t["conv_send_reply"], variant="primary", size="sm", elem_id="conv-send-reply")
    step_status = gr.Markdown(elem_id="conv-status-line")
    with gr.Row():
        fmt = gr.Radio([("CSV", "csv"), ("JSONL", "jsonl")], value="csv", label=t["conv_export_as"],
                       elem_id="conv-export-format")
        export_btn = gr.Button(t["conv_export"], size="sm", elem_id="conv-export")
    # Shown once there is a file: an empty File box shows Gradio's own untranslated status text.
    exported = gr.File(label=t["conv_exported_file"], elem_id="conv-exported", interactive=False, height=90,
                       visible=False)
    api_search = gr.Button(visible=False)  # the list with its page number, for scripts

    filters = [text, template, version, rating, status, tenant]
    listing = [summary, table, page, ids, queue]
    quiet = {"show_progress": "minimal"}

    async def first(text, template, version, rating, status, tenant, request: gr.Request):
        return await search(text, template, version, rating, status, tenant, 1, request)

    async def previous(text, template, version, rating, status, tenant, current, request: gr.Request):
        return await search(text, template, version, rating, status, tenant, _page(current) - 1, request)

    async def following(text, template, version, rating, status, tenant, current, request: gr.Request):
        return await search(text, template, version, rating, status, tenant, _page(current) + 1, request)

    api_search.click(search, [*filters, page], listing, api_name="conversations", **quiet)
    search_btn.click(first, filters, listing, api_visibility="private", **quiet)
    text.submit(first, filters, listing, api_visibility="private", **quiet)
    prev_btn.click(previous, [*filters, page], listing, api_visibility="private", **quiet)
    next_btn.click(following, [*filters, page], listing, api_visibility="private", **quiet)
    table.select(pick_row, ids, [headline, transcript, open_id], api_visibility="private", **quiet)
    open_btn.click(open_conversation, open_id, [headline, transcript, open_id], api_name="transcript", **quiet)
    take_btn.click(take, open_id, [step_status, headline, transcript, reply_box], api_name="take", **quiet)
    release_btn.click(release, open_id, [step_status, headline, transcript, reply_box], api_name="release", **quiet)
    reply_btn.click(reply, [open_id, reply_box], [step_status, headline, transcript, reply_box], api_name="reply",
                    **quiet)
    hide.input(set_hidden, hide, [hide, step_status], api_name="hide_transcripts", **quiet)
    export_btn.click(export, [*filters, fmt], [step_status, exported], api_name="export_conversations", **quiet)

    async def on_load(request: gr.Request):
        template_choices, tenant_choices, hidden_now = await choices(request)
        return (template_choices, tenant_choices, hidden_now,
                *await search("", "", None, "", "", "*", 1, request))

    return on_load, [template, tenant, hide, *listing]


# -- formatting (no gradio) ---------------------------------------------------------------------------------


def list_rows(page: ReviewPage, t: dict, *, hide: bool, now: datetime) -> list[list]:
    return [[r.id, who_answers(r, t, now), r.template, f"v{r.version}" if r.version else "—",
             f"{r.created_at:%Y-%m-%d %H:%M}", f"{r.last_at:%H:%M:%S}", t[f"status_{r.status}"] if r.status else "",
             r.ups or "", r.downs or "", r.num_messages, r.tenant, t["conv_hidden_text"] if hide else r.title]
            for r in page.rows]


def queue_line(q: QueueState, t: dict) -> str:
    """The person queue in a line or two: how many wait (of the cap), a full queue said as such, and how many
    requests the caps refused since the previous hour began (a flood shows as a number here)."""
    lines = [t["conv_queue_cap" if q.total_cap else "conv_queue"].format(waiting=q.waiting, cap=q.total_cap)]
    if q.full:
        lines.append(t["conv_queue_full"].format(cap=q.total_cap))
    if refused := sum(q.refused.values()):
        lines.append(t["conv_queue_refused"].format(
            n=refused, since=f"{q.since:%H:%M}", client=q.refused[Cap.CLIENT], session=q.refused[Cap.SESSION],
            total=q.refused[Cap.TOTAL]))
    return "  \n".join(lines)


def who_answers(r: ReviewRow, t: dict, now: datetime) -> str:
    """How long a customer has waited for a person, or the operator who has the conversation."""
    if r.handoff == Handoff.WAITING and r.handoff_requested_at is not None:
        return t["conv_waiting_for"].format(wait=waited(now - r.handoff_requested_at, t))
    if r.handoff == Handoff.PERSON:
        return t["conv_with"].format(operator=r.handoff_operator)
    return ""


def waited(delta, t: dict) -> str:
    seconds = max(0, int(delta.total_seconds()))
    if seconds < 60:
        return t["wait_s"].format(s=seconds)
    if seconds < 3600:
        return t["wait_min"].format(m=seconds // 60, s=seconds % 60)
    return t["wait_h"].format(h=seconds // 3600, m=seconds % 3600 // 60)


def render_transcript(found: Transcript, t: dict, *, hide: bool) -> str:
    """The conversation as HTML: each message's text (escaped) and, under each answer, its numbers."""
    parts = []
    for m in found.messages:
        who = t["conv_customer"] if m.role == "user" else (
            t["conv_person"].format(operator=m.author) if m.author else t["conv_model"])
        text = t["conv_hidden_text"] if hide else (m.text or "")
        stats = "" if m.role == "user" else f"<div class='pd-stats'>{html.escape(answer_stats(m, t, hide=hide))}</div>"
        css = "user" if m.role == "user" else "answer"
        parts.append(f"<div class='pd-msg {css}{' hidden' if hide else ''}' data-message-id='{m.id}'>"
                     f"<div class='pd-who'>#{m.id} · {html.escape(who)} · {m.created_at:%Y-%m-%d %H:%M:%S}</div>"
                     f"<div class='pd-text'>{html.escape(text)}</div>{stats}</div>")
    return f"<div class='pd-transcript'>{''.join(parts)}</div>"


def answer_stats(m: MessageRow, t: dict, *, hide: bool) -> str:
    """One line of an answer's numbers: cached/prompt tokens, first token, first visible text, speed, replica,
    how it ended and the customer's rating (the reason is the customer's text: hidden with transcripts)."""
    items = [t[f"status_{m.status}"] if f"status_{m.status}" in t else m.status]
    if m.prompt_tokens is not None:
        items.append(t["stat_cached"].format(cached=m.num_cached_tokens or 0, prompt=m.prompt_tokens))
    if m.ttft_ms is not None:
        items.append(t["stat_ttft"].format(ms=f"{m.ttft_ms:.0f}"))
    items.append(t["stat_visible"].format(ms=f"{m.first_visible_ms:.0f}") if m.first_visible_ms is not None
                 else t["stat_visible_unknown"])
    if m.decode_tokens_per_s:
        items.append(t["stat_speed"].format(v=f"{m.decode_tokens_per_s:.0f}"))
    if m.replica:
        items.append(t["stat_replica"].format(replica=m.replica))
    if m.finish_reason:
        items.append(t["stat_finish"].format(reason=t.get(f"finish_{m.finish_reason}", m.finish_reason)))
    if m.error and not hide:
        items.append(t["stat_error"].format(error=m.error))
    if m.rating is not None:
        rating = t["stat_up"] if m.rating > 0 else t["stat_down"]
        items.append(t["stat_reason"].format(rating=rating, reason=m.rating_reason)
                     if m.rating_reason and not hide else rating)
    return " · ".join(items)


def _headline(r: ReviewRow, t: dict, now: datetime) -> str:
    state = who_answers(r, t, now) or t["conv_with_model"]
    version = f"v{r.version}" if r.version else "—"
    return t["conv_headline"].format(id=r.id, template=literal(r.template), version=version, state=state,
                                     messages=plural(t, "conv_messages", r.num_messages),
                                     started=f"{r.created_at:%Y-%m-%d %H:%M}")


def _summary(page: ReviewPage, t: dict) -> str:
    return t["conv_page"].format(page=page.page, pages=page.num_pages,
                                 conversations=plural(t, "tree_conversations", page.total))


def _filter(text, template, version, rating, status, tenant) -> ReviewFilter:
    """The filter fields as typed: a version as "2" or "v2" (empty: every version), the tenant "*" for all."""
    if isinstance(version, str):
        digits = version.strip().removeprefix("v").removeprefix("V")
        if digits and not (digits.isascii() and digits.isdigit()):
            raise ReviewInputError("The version filter is a version number such as 2, or empty.")
        version = int(digits) if digits else None
    return ReviewFilter(text=text if text is not None else "", template=template or "", version=version,
                        rating=rating or "", status=status or "", tenant=None if tenant in (None, "*") else tenant)


def _page(page) -> int:
    if isinstance(page, bool) or not isinstance(page, (int, float)) or page != page or not 1 <= page < 2**31:
        return 1
    return int(page)


def _id(value) -> int:
    """A conversation id as typed; raises ReviewInputError for anything but a positive whole number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value != int(value) \
            or not 0 < value < 2**63:
        raise ReviewInputError("Enter a conversation number (the first column of the list).")
    return int(value)
