"""The Warmup tab: warm one template or all published ones, and see how pinned templates are kept warm."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime

import gradio as gr

from admin.context import AdminContext
from admin.i18n import headers
from app.core.cache_tree import plural, template_label
from app.core.cache_view import template_residency
from app.core.routing import family_keys
from app.core.warmup import touch, warm_all
from app.db import audit as db_audit
from app.db.models import utcnow


@dataclass(frozen=True)
class Touch:
    t: datetime
    cached_blocks: int  # what the touch found still cached, in full blocks
    prefix_blocks: int  # the whole prefix in full blocks: equal means it was resident


def build_warmup_tab(console: AdminContext):
    """The tab's components and events; returns its refresh handler and outputs for the page load."""
    t, access, catalog = console.text, console.access, console.catalog
    last_touch: dict[str, Touch] = {}  # touches from this console, by template

    async def choices(request: gr.Request):
        await access.require(request)
        return gr.update(choices=[x.name for x in catalog.all()])

    async def warm_some(name: str | None, request: gr.Request):
        user = await access.require(request)
        n = len([e for e in catalog.entries() if not name or e.template.name == name])
        rows: list[list] = []
        started = time.perf_counter()
        yield t["warm_progress"].format(i=1, n=n), rows
        async for r in warm_all(console.engine, catalog, probe_id=console.probe_id,
                                shards=console.settings.family_shards, name=name or None):
            await console.db.write(db_audit.record, user=user, action="warmup", target=r.template,
                                   field="cached prefix tokens", before=r.was_cached_tokens, after=r.num_cached_tokens)
            label = template_label(r.template, r.version, r.candidate, t)
            rows = rows + [[label, r.num_prefix_tokens, r.was_cached_tokens, r.num_cached_tokens, r.elapsed_ms]]
            if len(rows) < n:
                yield t["warm_progress"].format(i=len(rows) + 1, n=n), rows
        ms = f"{(time.perf_counter() - started) * 1000:.0f}"
        yield plural(t, "warm_done", len(rows), ms=ms), rows

    async def pinned_rows(request: gr.Request):
        await access.require(request)
        residency = {r.name: r for r in template_residency(catalog=catalog, engine=console.engine) if not r.candidate}
        rows = []
        for x in catalog.all():
            if not x.pinned:
                continue
            touched = last_touch.get(x.name)
            r = residency.get(x.name)
            rows.append([x.name, f"{touched.t:%H:%M:%S}" if touched else "",
                         touched.cached_blocks if touched else "", touched.prefix_blocks if touched else "",
                         r.resident_blocks if r else t["kv_off"]])
        return rows

    async def touch_now(request: gr.Request):
        user = await access.require(request)
        size = console.meter.block_size
        for x in [x for x in catalog.all() if x.pinned]:
            prefix = catalog.prefix_ids(x.name)
            for key in family_keys(x.family, shards=console.settings.family_shards):
                stats = await touch(console.engine, prefix, probe_id=console.probe_id, key=key)
            last_touch[x.name] = Touch(utcnow(), stats.num_cached_tokens // size, len(prefix) // size)
            await console.db.write(db_audit.record, user=user, action="touch", target=x.name,
                                   field="cached prefix tokens", before=stats.num_cached_tokens,
                                   after=len(prefix) // size * size)
        return await pinned_rows(request)

    interval_s = console.settings.keep_warm_interval_s
    interval = t["pinned_interval"].format(s=f"{interval_s:g}") if interval_s > 0 else t["pinned_never"]
    gr.Markdown(t["warm_help"])
    with gr.Row():
        template = gr.Dropdown([], allow_custom_value=True, label=t["warm_template"], elem_id="warm-template")
        warm_btn = gr.Button(t["warm_button"], variant="primary", elem_id="warm")
    summary = gr.Markdown(elem_id="warm-summary")
    results = gr.Dataframe(headers=headers(console.language, "warm_headers"), interactive=False,
                           elem_id="warm-results")
    gr.Markdown(t["pinned_title"].format(interval=interval))
    pinned = gr.Dataframe(headers=headers(console.language, "pinned_headers"), interactive=False,
                          elem_id="pinned-table")
    with gr.Row():
        pinned_btn = gr.Button(t["refresh"], size="sm")
        touch_btn = gr.Button(t["touch"], size="sm", elem_id="touch-pinned")

    warm_btn.click(warm_some, template, [summary, results], api_name="warm", show_progress="hidden")
    pinned_btn.click(pinned_rows, None, pinned, api_name="pinned", show_progress="minimal")
    touch_btn.click(touch_now, None, pinned, api_name="touch_pinned", show_progress="minimal")

    async def on_load(request: gr.Request):
        return await choices(request), await pinned_rows(request)

    return on_load, [template, pinned]
