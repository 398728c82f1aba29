"""The Cache tab: the live cache view, per replica when there are several, template residency as a
tree, history plots, and a reset. The numbers come from app/core/cache_view.py and app/core/cache_tree.py,
which import no gradio; a timer refreshes the tab every REFRESH_S seconds."""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from datetime import timedelta

import gradio as gr
import pandas as pd

from app.console.context import Console
from app.console.i18n import headers
from app.core.cache_tree import cache_tree, render_tree_html
from app.core.cache_view import CacheView, read_cache_view, template_residency
from app.db import audit as db_audit
from app.db import metrics as db_metrics
from app.db.rows import SampleRow

REFRESH_S = 2.0
HISTORY = timedelta(hours=1)  # what the plots show
PLOT = dict(x="minutes", y="value", color="series", y_title="", height=220)

CSS = """
.pd-cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(220px, 1fr)); gap: 10px; }
.pd-card { border: 1px solid var(--border-color-primary); border-radius: 10px; padding: 10px 14px; }
.pd-card h4 { margin: 0 0 6px; font-size: 13px; color: var(--body-text-color-subdued); font-weight: 600; }
.pd-card .pd-row { display: flex; flex-wrap: wrap; justify-content: space-between; column-gap: 8px; font-size: 14px; }
.pd-card .pd-row b { font-variant-numeric: tabular-nums; margin-left: auto; text-align: right; }
.cache-tree ul { padding-left: 18px; margin: 2px 0; }
.cache-tree code { letter-spacing: -1px; color: #f97316; word-break: break-all; }
.pd-detail { color: var(--body-text-color-subdued); }
"""


def build_cache_tab(console: Console):
    """The tab's components and events; returns its refresh handler and outputs for the page load."""
    t, access, engine = console.text, console.access, console.engine

    cards = gr.HTML(elem_id="cache-numbers")
    replicas = gr.Dataframe(headers=headers(console.language, "replica_headers"), interactive=False,
                            elem_id="cache-replicas", label=t["replicas"], visible=engine.info.backend == "remote")
    templates = gr.Dataframe(headers=headers(console.language, "cache_tpl_headers"), interactive=False,
                             elem_id="cache-templates", label=t["cache_templates"], wrap=True)
    gr.Markdown(t["cache_tree"])
    tree = gr.HTML(elem_id="cache-tree")
    with gr.Row():
        hit_plot = gr.LinePlot(title=t["plot_hit"], y_lim=[0, 1], y_axis_format=".0%", x_title=t["plot_minutes"],
                               elem_id="plot-hit-rate", **PLOT)
        kv_plot = gr.LinePlot(title=t["plot_kv"], y_axis_format="d", x_title=t["plot_minutes"], elem_id="plot-kv",
                              **PLOT)
    with gr.Row():
        ttft_plot = gr.LinePlot(title=t["plot_ttft"], x_title=t["plot_minutes"], elem_id="plot-ttft", **PLOT)
        requests_plot = gr.LinePlot(title=t["plot_requests"], y_axis_format="d", x_title=t["plot_minutes"],
                                    elem_id="plot-requests", **PLOT)
    reset_btn = gr.Button(t["reset"], variant="stop", size="sm", elem_id="reset-cache")
    with gr.Row(visible=False) as confirm_row:
        gr.Markdown(t["reset_confirm"])
        confirm_btn = gr.Button(t["reset_yes"], variant="stop", size="sm", elem_id="reset-cache-confirm")
        cancel_btn = gr.Button(t["cancel"], size="sm", elem_id="reset-cache-cancel")
    reset_status = gr.Markdown(elem_id="reset-status")
    timer = gr.Timer(REFRESH_S)

    outputs = [cards, replicas, templates, tree, hit_plot, kv_plot, ttft_plot, requests_plot]

    async def refresh(request: gr.Request):
        await access.require(request)
        view = await read_cache_view(engine=engine, db=console.db)
        samples = await console.db.read(db_metrics.samples_since, since=view.t - HISTORY)
        usage = await console.db.read(db_metrics.template_usage)
        return (_cards(view, t), _replica_rows(engine, t), _template_rows(console, usage), _trees(console, t),
                *_plots(samples, view, t))

    async def ask_confirm(request: gr.Request):
        await access.require(request)
        return gr.update(visible=True)

    async def cancel(request: gr.Request):
        await access.require(request)
        return gr.update(visible=False), ""

    async def reset(request: gr.Request):
        user = await access.require(request)
        before = engine.residency.num_cached_blocks() if engine.residency else None
        done = await engine.reset_prefix_cache()
        if not done:
            return gr.update(visible=False), t["reset_refused"]
        await console.db.write(db_audit.record, user=user, action="reset prefix cache", target="all templates",
                               field="cached blocks", before=before, after=0)
        return gr.update(visible=False), t["reset_done"].format(blocks=before if before is not None else "?")

    timer.tick(refresh, None, outputs, api_visibility="private", show_progress="hidden")
    reset_btn.click(ask_confirm, None, confirm_row, api_visibility="private")
    cancel_btn.click(cancel, None, [confirm_row, reset_status], api_visibility="private")
    confirm_btn.click(reset, None, [confirm_row, reset_status], api_name="reset_prefix_cache").then(
        refresh, None, outputs, api_visibility="private", show_progress="hidden")
    return refresh, outputs


def _cards(view: CacheView, t: dict) -> str:
    mem = view.memory
    if mem.gpu_total_bytes is not None:
        memory = t["cache_mem_gpu"].format(used=_gib(mem.gpu_used_bytes), total=_gib(mem.gpu_total_bytes),
                                           kv=_gib(mem.kv_cache_bytes))
    else:
        memory = t["cache_mem_cpu"].format(kv=_mib(mem.kv_cache_bytes), rss=_mib(mem.rss_bytes))
    events = view.kv_events
    residency = (t["cache_events_off"] if events is None else
                 t["cache_events_on"].format(batches=events.batches, missed=events.missed_batches))
    ttft = t["cache_ttft_value"].format(hit=_ms(view.ttft.hit_p50_ms), miss=_ms(view.ttft.miss_p50_ms))
    groups = [
        (t["cache_blocks"], [(t["cache_total"], f"{view.num_blocks:,} × {view.block_size}"),
                             (t["cache_used"], f"{view.blocks_used:,}"), (t["cache_cached"], f"{view.blocks_cached:,}"),
                             (t["cache_free"], f"{view.blocks_free:,}")]),
        (t["cache_hit"], [(t["cache_recent"], f"{view.recent_hit_rate:.1%}"),
                          (t["cache_since"].format(hits=view.hits, queries=view.queries), f"{view.hit_rate:.1%}"),
                          (t["cache_usage"], f"{view.kv_cache_usage:.1%}")]),
        (t["cache_engine"], [(t["cache_running"], str(view.running)), (t["cache_waiting"], str(view.waiting)),
                             (t["cache_ttft"], ttft)]),
        (t["cache_memory"], [("", memory), (t["cache_events"], residency)]),
    ]
    out = []
    for title, rows in groups:
        body = "".join(f"<div class='pd-row'><span>{html.escape(k)}</span><b>{html.escape(v)}</b></div>"
                       for k, v in rows)
        out.append(f"<div class='pd-card'><h4>{html.escape(title)}</h4>{body}</div>")
    return f"<div class='pd-cards'>{''.join(out)}</div>"


def _replica_rows(engine, t: dict) -> list[list]:
    rows = []
    for r in engine.replicas():
        state = t["replica_up"] if r.up else t["replica_down"].format(reason=r.reason)
        hit = f"{r.hits / r.queries:.1%}" if r.queries else "–"
        rows.append([r.url, state, r.running, r.waiting, f"{r.kv_cache_usage:.1%}", hit, r.requests])
    return rows


def _template_rows(console: Console, usage: dict[str, tuple[int, int, int]]) -> list[list]:
    rows = []
    for r in template_residency(catalog=console.catalog, engine=console.engine):
        n, prompt, cached = usage.get(r.name, (0, 0, 0))
        rows.append([r.name, r.parent, console.text["yes"] if r.pinned else "",
                     f"{r.resident_blocks} / {r.num_blocks}", r.num_blocks, n, prompt, cached,
                     f"{cached / prompt:.1%}" if prompt else "–"])
    return rows


def _trees(console: Console, t: dict) -> str:
    parts = [render_tree_html(cache_tree(catalog=console.catalog, mirror=r.mirror), t=t, replica=r.url)
             for r in console.engine.replicas() if r.mirror is not None]
    if parts:
        return "".join(parts)
    mirror = console.engine.residency
    if mirror is None:
        return f"<p>{html.escape(t['cache_events_off'])}</p>"
    return render_tree_html(cache_tree(catalog=console.catalog, mirror=mirror), t=t)


def _plots(samples: list[SampleRow], view: CacheView, t: dict) -> tuple:
    now = view.t

    def frame(series: dict[str, Callable[[SampleRow], float | None]]) -> pd.DataFrame:
        points = [{"minutes": round((s.t - now).total_seconds() / 60, 3), "value": value, "series": name}
                  for name, get in series.items() for s in samples if (value := get(s)) is not None]
        return pd.DataFrame(points, columns=["minutes", "value", "series"])

    def counts(df: pd.DataFrame):
        # Whole-number axes: without a range, a plot of 0s and 1s labels its ticks "0, 1, 1".
        top = max(2, math.ceil(df["value"].max() * 1.1)) if len(df) else 2
        return gr.update(value=df, y_lim=[0, top])

    return (
        frame({t["series_hit"]: lambda s: s.recent_hit_rate}),
        counts(frame({t["series_used"]: lambda s: s.blocks_used, t["series_cached"]: lambda s: s.blocks_cached})),
        frame({t["series_hits"]: lambda s: s.ttft_hit_ms, t["series_misses"]: lambda s: s.ttft_miss_ms}),
        counts(frame({t["series_running"]: lambda s: s.running, t["series_waiting"]: lambda s: s.waiting})),
    )


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f} ms"


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.0f} MiB"


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / (1 << 30):,.1f} GiB"
