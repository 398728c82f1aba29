"""The Warmup tab: warm one template or all published ones, and see how pinned templates are kept warm."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime

import gradio as gr

from app.console.context import Console
from app.console.i18n import headers
from app.console.markup import literal
from app.core.cache_view import template_residency
from app.core.routing import family_keys
from app.core.warmup import touch, warm
from app.db import audit as db_audit
from app.db.models import utcnow


@dataclass(frozen=True)
class Touch:
    t: datetime
    num_cached_tokens: int  # what the touch found still cached
    full_block_tokens: int  # the whole prefix in full blocks: equal means it was resident


def build_warmup_tab(console: Console):
    """The tab's components and events; returns its refresh handler and outputs for the page load."""
    t, access, catalog = console.text, console.access, console.catalog
    last_touch: dict[str, Touch] = {}  # touches from this console, by template

    async def choices(request: gr.Request):
        await access.require(request)
        return gr.update(choices=[x.name for x in catalog.all()])

    async def warm_some(name: str | None, request: gr.Request):
        user = await access.require(request)
        targets = [x for x in catalog.all() if not name or x.name == name]
        rows: list[list] = []
        started = time.perf_counter()
        for i, template in enumerate(targets, 1):
            yield t["warm_progress"].format(name=literal(template.name), i=i, n=len(targets)), rows
            r = await warm(console.engine, template, catalog.prefix_ids(template.name), probe_id=console.probe_id,
                           shards=console.settings.family_shards)
            await console.db.write(db_audit.record, user=user, action="warmup", target=r.template,
                                   field="cached prefix tokens", before=r.was_cached_tokens, after=r.num_cached_tokens)
            rows = rows + [[r.template, r.num_prefix_tokens, r.was_cached_tokens, r.num_cached_tokens, r.elapsed_ms]]
        ms = f"{(time.perf_counter() - started) * 1000:.0f}"
        yield t["warm_done"].format(n=len(targets), ms=ms), rows

    async def pinned_rows(request: gr.Request):
        await access.require(request)
        residency = {r.name: r for r in template_residency(catalog=catalog, engine=console.engine)}
        rows = []
        for x in catalog.all():
            if not x.pinned:
                continue
            touched = last_touch.get(x.name)
            r = residency.get(x.name)
            rows.append([x.name, f"{touched.t:%H:%M:%S}" if touched else "",
                         touched.num_cached_tokens if touched else "", touched.full_block_tokens if touched else "",
                         t["blocks_of"].format(resident=r.resident_blocks, total=r.num_blocks) if r else t["kv_off"]])
        return rows

    async def touch_now(request: gr.Request):
        user = await access.require(request)
        size = console.meter.block_size
        for x in [x for x in catalog.all() if x.pinned]:
            prefix = catalog.prefix_ids(x.name)
            for key in family_keys(x.family, shards=console.settings.family_shards):
                stats = await touch(console.engine, prefix, probe_id=console.probe_id, key=key)
            last_touch[x.name] = Touch(utcnow(), stats.num_cached_tokens, len(prefix) // size * size)
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
