"""The Cache tab: the live cache view, template residency as a tree, history plots, and a reset.

Handlers stay thin: the numbers come from admin/cache_view.py and admin/cache_tree.py, which import
no gradio. A timer refreshes the tab every REFRESH_S seconds; every handler checks the operator.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import gradio as gr
import pandas as pd

from admin.cache_tree import cache_tree, render_tree_html
from admin.cache_view import (CacheView, SampleRow, load_samples, read_cache_view, template_residency,
                              template_stats)
from app.models import utcnow

REFRESH_S = 2.0
HISTORY = timedelta(hours=1)  # what the plots show
PLOT = dict(x="minutes", y="value", color="series", x_title="minutes from now", y_title="", height=220)
TEMPLATE_HEADERS = ["template", "parent", "pinned", "resident blocks", "prefix blocks", "answers",
                    "prompt tokens", "tokens saved", "hit rate"]


def build_cache_tab(services, *, require_operator: Callable[[gr.Request | None], str]) -> None:
    """Render the cache view inside the console's Blocks; every handler calls ``require_operator``."""
    engine, store, desk = services.engine, services.store, services.desk

    numbers = gr.Markdown(elem_id="cache-numbers")
    templates = gr.Dataframe(headers=TEMPLATE_HEADERS, interactive=False, elem_id="cache-templates",
                             label="Templates: prefix blocks in the cache now, and reuse over every stored answer")
    gr.Markdown("**Cached prefixes**: the prefix cache as a tree — a shared parent once, its children "
                "branching off it — in KV blocks")
    tree = gr.HTML(elem_id="cache-tree")
    with gr.Row():
        hit_plot = gr.LinePlot(title="Prefix-cache hit rate (last minute)", y_lim=[0, 1], y_axis_format=".0%",
                               elem_id="plot-hit-rate", **PLOT)
        kv_plot = gr.LinePlot(title="KV-cache blocks", y_axis_format="d", elem_id="plot-kv", **PLOT)
    with gr.Row():
        ttft_plot = gr.LinePlot(title="TTFT p50, ms: cache hits vs misses", elem_id="plot-ttft", **PLOT)
        requests_plot = gr.LinePlot(title="Requests", y_axis_format="d", elem_id="plot-requests", **PLOT)
    with gr.Row():
        reset_btn = gr.Button("Reset prefix cache…", variant="stop", size="sm", elem_id="reset-cache")
    with gr.Row(visible=False) as confirm_row:
        gr.Markdown("Drop every cached block? Each template's next request computes its prefix again.")
        confirm_btn = gr.Button("Yes, reset", variant="stop", size="sm", elem_id="reset-cache-confirm")
        cancel_btn = gr.Button("Cancel", size="sm", elem_id="reset-cache-cancel")
    reset_status = gr.Markdown(elem_id="reset-status")
    timer = gr.Timer(REFRESH_S)

    outputs = [numbers, templates, tree, hit_plot, kv_plot, ttft_plot, requests_plot]

    def refresh(request: gr.Request):
        require_operator(request)
        view = read_cache_view(engine=engine, store=store)
        samples = load_samples(store=store, since=view.t - HISTORY)
        return (
            _numbers_markdown(view),
            _template_rows(desk, engine, store),
            render_tree_html(cache_tree(desk=desk, engine=engine), block_size=view.block_size),
            *_plots(samples),
        )

    def ask_confirm(request: gr.Request):
        require_operator(request)
        return gr.update(visible=True)

    def cancel(request: gr.Request):
        require_operator(request)
        return gr.update(visible=False), ""

    async def reset(request: gr.Request):
        require_operator(request)
        done = await engine.reset_prefix_cache()
        message = ("Prefix cache reset: every cached block was dropped." if done else
                   "vLLM refused the reset because requests are running; try again when they finish.")
        return gr.update(visible=False), message

    timer.tick(refresh, None, outputs, api_visibility="private")
    reset_btn.click(ask_confirm, None, confirm_row, api_visibility="private")
    cancel_btn.click(cancel, None, [confirm_row, reset_status], api_visibility="private")
    confirm_btn.click(reset, None, [confirm_row, reset_status], api_name="reset_prefix_cache").then(
        refresh, None, outputs, api_visibility="private")


def _numbers_markdown(view: CacheView) -> str:
    usable = view.num_blocks - 1
    mem = view.memory
    if mem.gpu_total_bytes is not None:
        memory = f"GPU {_gib(mem.gpu_used_bytes)} used of {_gib(mem.gpu_total_bytes)} · KV cache {_gib(mem.kv_cache_bytes)}"
    else:
        memory = f"KV cache {_mib(mem.kv_cache_bytes)} · RSS (app + engine core) {_mib(mem.rss_bytes)}"
    ttft = f"hits {_ms(view.ttft_hit_p50_ms)} · misses {_ms(view.ttft_miss_p50_ms)}"
    events = view.kv_events
    residency = ("off (PREFIXDESK_KV_EVENTS=false)" if events is None else
                 f"{events.batches} event batches mirrored, {events.missed_batches} missed")
    return "\n".join([
        "| KV cache | | Prefix cache | | Engine | |",
        "|---|---|---|---|---|---|",
        f"| total blocks | **{view.num_blocks}** ({usable} usable) × {view.block_size} tokens "
        f"| hit rate, last minute | **{view.recent_hit_rate:.1%}** | running | **{view.running}** |",
        f"| held by running requests | **{view.blocks_used}** | hit rate since start | **{view.hit_rate:.1%}** "
        f"({view.hits:,} of {view.queries:,} tokens) | waiting | **{view.waiting}** |",
        f"| cached (reusable) | **{view.blocks_cached}** | TTFT p50, last 5 min | {ttft} | memory | {memory} |",
        f"| free (empty or evictable) | **{view.blocks_free}** | KV usage | **{view.kv_cache_usage:.1%}** | residency | {residency} |",
    ])


def _template_rows(desk, engine, store) -> list[list]:
    stats = {s.name: s for s in template_stats(store=store)}
    rows = []
    for r in template_residency(desk=desk, engine=engine):
        s = stats.get(r.name)
        rows.append([r.name, r.parent, "yes" if r.pinned else "", f"{r.resident_blocks} / {r.num_blocks}",
                     r.num_blocks, s.requests if s else 0, s.prompt_tokens if s else 0,
                     s.num_cached_tokens if s else 0, f"{s.hit_rate:.1%}" if s else "–"])
    return rows


def _plots(samples: list[SampleRow]) -> tuple[pd.DataFrame, ...]:
    now = utcnow()

    def frame(series: dict[str, Callable[[SampleRow], float | None]]) -> pd.DataFrame:
        points = [{"minutes": round((s.t - now).total_seconds() / 60, 3), "value": value, "series": name}
                  for name, get in series.items() for s in samples if (value := get(s)) is not None]
        return pd.DataFrame(points, columns=["minutes", "value", "series"])

    return (
        frame({"hit rate": lambda s: s.hit_rate}),
        frame({"held by requests": lambda s: s.blocks_used, "cached": lambda s: s.blocks_cached}),
        frame({"hits": lambda s: s.ttft_hit_ms, "misses": lambda s: s.ttft_miss_ms}),
        frame({"running": lambda s: s.running, "waiting": lambda s: s.waiting}),
    )


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f} ms"


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.0f} MiB"


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / (1 << 30):,.1f} GiB"
