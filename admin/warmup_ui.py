"""The Warmup tab: warm one template or all published ones, and see how pinned templates are kept warm."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import gradio as gr

from admin import audit
from admin.cache_view import template_residency
from admin.console import Console
from admin.ui import refusals
from admin.warmup import warm
from app.models import utcnow

PINNED_HEADERS = ["template", "last touch here (UTC)", "cached at touch", "full-block prefix", "resident now"]


@dataclass(frozen=True)
class Touch:
    t: datetime
    num_cached_tokens: int  # what the touch found still cached
    full_block_tokens: int  # the whole prefix in full blocks: equal means it was resident


def build_warmup_tab(demo: gr.Blocks, console: Console, *, guard: Callable[[gr.Request | None], str]) -> None:
    store, meter = console.store, console.meter
    last_touch: dict[str, Touch] = {}  # touches from this console, by template

    def choices(request: gr.Request):
        guard(request)
        return gr.update(choices=[t.name for t in store.published_templates()])

    async def warm_some(name: str | None, request: gr.Request, progress=gr.Progress()):
        user = guard(request)
        with refusals():
            targets = [store.get_published(name)] if name else store.published_templates()
            results = []
            for i, template in enumerate(targets):
                progress((i, len(targets)), desc=f"warming {template.name}")
                results.append(await warm(engine=console.engine, meter=meter, template=template))
        for r in results:
            audit.log_action(store=store, user=user, action="warmup", target=r.template, after=r.num_cached_tokens)
        lines = [f"- **{r.template}**: {r.num_cached_tokens} of {r.num_prefix_tokens} prefix tokens cached "
                 f"(before: {r.was_cached_tokens}) in {r.elapsed_ms:.0f} ms" for r in results]
        return "\n".join(lines), [dataclasses.asdict(r) for r in results]

    def pinned_rows(request: gr.Request):
        guard(request)
        residency = {r.name: r for r in template_residency(desk=console.services.desk, engine=console.engine)}
        rows = []
        for t in store.published_templates():
            if not t.pinned:
                continue
            touch = last_touch.get(t.name)
            r = residency.get(t.name)
            rows.append([t.name, f"{touch.t:%H:%M:%S}" if touch else "", touch.num_cached_tokens if touch else "",
                         touch.full_block_tokens if touch else "",
                         f"{r.resident_blocks} / {r.num_blocks} blocks" if r else "KV events off"])
        return rows

    async def touch_now(request: gr.Request):
        user = guard(request)
        with refusals():
            for t in [t for t in store.published_templates() if t.pinned]:
                result = await warm(engine=console.engine, meter=meter, template=t)
                last_touch[t.name] = Touch(utcnow(), result.was_cached_tokens,
                                           result.num_prefix_tokens // meter.block_size * meter.block_size)
                audit.log_action(store=store, user=user, action="touch", target=t.name, after=result.was_cached_tokens)
        return pinned_rows(request)

    interval_s = console.services.settings.keep_warm_interval_s
    interval = f"every {interval_s:g} s" if interval_s > 0 else "never (PREFIXDESK_KEEP_WARM_INTERVAL_S=0)"
    gr.Markdown("Warming sends a template's exact prefix through the engine once, so the next customer's first "
                "answer starts from the cache. Publishing warms automatically.")
    with gr.Row():
        template = gr.Dropdown([], label="Template (empty: all published)", elem_id="warm-template",
                               allow_custom_value=True)
        warm_btn = gr.Button("Warm", variant="primary", elem_id="warm")
    summary = gr.Markdown(elem_id="warm-summary")
    results = gr.JSON(label="Results", elem_id="warm-results")
    gr.Markdown(f"### Pinned templates\nvLLM's prefix cache is LRU and cannot pin; a pinned template is re-touched "
                f"{interval} so traffic on other templates evicts something else first. *Resident* counts its "
                "full blocks in the cache now (from vLLM's KV events); a touch shows what it still found cached.")
    pinned = gr.Dataframe(headers=PINNED_HEADERS, interactive=False, elem_id="pinned-table")
    with gr.Row():
        pinned_btn = gr.Button("Refresh", size="sm")
        touch_btn = gr.Button("Touch pinned now", size="sm", elem_id="touch-pinned")

    warm_btn.click(warm_some, template, [summary, results], api_name="warm")
    pinned_btn.click(pinned_rows, None, pinned, api_name="pinned")
    touch_btn.click(touch_now, None, pinned, api_name="touch_pinned")
    demo.load(choices, None, template, api_visibility="private")
    demo.load(pinned_rows, None, pinned, api_visibility="private")
