"""The Versions tab: each version of a template judged by what customers felt, and a live split.

Per version — answers, the 👍/👎 share of rated answers, stopped and error shares, the customers'
first-visible-text median, the engine's first token and the cached share of prompt tokens — for the
published version and every earlier one (app/db/review.py). A split offers a candidate version to a
share of new conversations (each stays on its version); the arms are compared over conversations
since the split began, and one click promotes the candidate or rolls the split back, audited.
"""

from __future__ import annotations

import gradio as gr

from admin.context import AdminContext
from admin.i18n import headers
from admin.markup import literal
from app.core.warmup import warm
from app.db.rows import SplitView, VersionStats
from app.db.templates import TemplateAdminError

REFUSED = (TemplateAdminError, LookupError, ValueError)


def build_versions_tab(console: AdminContext):
    """The tab's components and events; returns its refresh handler and outputs for the page load, and what to
    draw again when the tab is opened (handler, inputs, outputs)."""
    t, access, templates, catalog = console.text, console.access, console.templates, console.catalog

    async def show(name: str | None, request: gr.Request):
        await access.require(request)
        if not name:
            return "", [], [], gr.update(choices=[]), t["ver_pick"]
        try:
            view = await templates.split_view(name)
        except REFUSED as exc:
            return "", [], [], gr.skip(), t["refused"].format(message=exc)
        others = [v.number for v in view.versions if v.number != view.published]
        picked = view.candidate or (others[0] if others else None)
        return (split_line(view, t), version_rows(view.versions, t), version_rows(view.arms, t),
                gr.update(choices=others, value=picked), "")

    async def choices(request: gr.Request):
        await access.require(request)
        names = await templates.names()
        return gr.update(choices=names, value=names[0] if names else None)

    async def start(name: str, version, share, request: gr.Request):
        user = await access.require(request)
        try:
            if version is None or share is None:
                raise ValueError(t["ver_pick_candidate"])
            change = await templates.start_split(name=name, version=int(version), share=float(share) / 100, user=user)
            for entry in catalog.entries():  # warmed like a publish: the candidate's first customer hits the cache
                if entry.candidate and entry.template.name == name:
                    await warm(console.engine, entry.template, entry.prefix_ids, probe_id=console.probe_id,
                               shards=console.settings.family_shards)
        except REFUSED as exc:
            return (t["refused"].format(message=exc), *[gr.skip()] * 4)
        done = t["ver_split_started"].format(name=literal(name), version=change.after_version,
                                            share=f"{float(share):.0f}")
        return (done, *(await show(name, request))[:4])

    async def settle(name: str, request: gr.Request, act, said: str, before: str, after: str):
        """Promote or end a split (``act``): the status line ``said`` names the versions before and after, and the
        tab shows the template again; a refusal changes nothing on screen but the status."""
        user = await access.require(request)
        try:
            change = await act(name=name, user=user)
        except REFUSED as exc:
            return (t["refused"].format(message=exc), *[gr.skip()] * 4)
        done = t[said].format(name=literal(name), **{before: _v(change.before_version), after: _v(change.after_version)})
        return (done, *(await show(name, request))[:4])

    async def promote(name: str, request: gr.Request):
        return await settle(name, request, templates.promote, "ver_promoted", "before", "after")

    async def end(name: str, request: gr.Request):
        return await settle(name, request, templates.end_split, "ver_rolled_back", "candidate", "published")

    gr.Markdown(t["ver_help"])
    with gr.Row():
        template = gr.Dropdown([], allow_custom_value=True, label=t["ver_template"], elem_id="ver-template",
                               scale=3)
        refresh_btn = gr.Button(t["refresh"], size="sm", elem_id="ver-refresh", scale=1)
    split = gr.Markdown(elem_id="ver-split")
    versions = gr.Dataframe(headers=headers(console.language, "ver_headers"), interactive=False, wrap=True,
                            elem_id="ver-table", label=t["ver_all"])
    gr.Markdown(t["ver_split_title"])
    with gr.Row():
        candidate = gr.Dropdown([], allow_custom_value=True, label=t["ver_candidate"], elem_id="ver-candidate",
                                scale=2)
        share = gr.Slider(1, 99, value=10, step=1, label=t["ver_share"], elem_id="ver-share", scale=3)
        start_btn = gr.Button(t["ver_start"], variant="primary", size="sm", elem_id="ver-start", scale=1)
    arms = gr.Dataframe(headers=headers(console.language, "ver_headers"), interactive=False, wrap=True,
                        elem_id="ver-arms", label=t["ver_arms"])
    with gr.Row():
        promote_btn = gr.Button(t["ver_promote"], size="sm", elem_id="ver-promote")
        end_btn = gr.Button(t["ver_end"], variant="stop", size="sm", elem_id="ver-end")
    status = gr.Markdown(elem_id="ver-status")

    shown = [split, versions, arms, candidate]
    quiet = {"show_progress": "minimal"}
    template.change(show, template, [*shown, status], api_name="versions", **quiet)
    refresh_btn.click(show, template, [*shown, status], api_visibility="private", **quiet)
    start_btn.click(start, [template, candidate, share], [status, *shown], api_name="start_split", **quiet)
    promote_btn.click(promote, template, [status, *shown], api_name="promote_candidate", **quiet)
    end_btn.click(end, template, [status, *shown], api_name="end_split", **quiet)
    return choices, [template], (show, template, [*shown, status])


# -- formatting (no gradio) ---------------------------------------------------------------------------------


def version_rows(stats: tuple[VersionStats, ...], t: dict) -> list[list]:
    def share(part: int, whole: int) -> str:
        return f"{part / whole:.0%}" if whole else "–"

    rows = []
    for v in stats:
        state = t["ver_published"] if v.published else t["ver_candidate_state"] if v.candidate else ""
        rows.append([f"v{v.number}", state, v.num_conversations, v.num_answers,
                     share(v.ups, v.num_rated), share(v.downs, v.num_rated), v.num_rated,
                     share(v.stopped, v.num_answers), share(v.errors, v.num_answers),
                     _ms(v.first_visible_p50_ms), _ms(v.ttft_p50_ms),
                     "–" if v.cached_share is None else f"{v.cached_share:.0%}"])
    return rows


def split_line(view: SplitView, t: dict) -> str:
    if view.candidate is None:
        return t["ver_no_split"].format(name=view.template, published=_v(view.published))
    return t["ver_split_line"].format(name=view.template, published=_v(view.published), candidate=_v(view.candidate),
                                      share=f"{view.share:.0%}", since=f"{view.since:%Y-%m-%d %H:%M:%S}")


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f}"


def _v(number: int | None) -> str:
    return "—" if number is None else f"v{number}"
