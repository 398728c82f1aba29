"""The Cache tab: the live cache view, per replica when there are several, template residency as a
tree, history plots, and a reset. The numbers come from app/core/cache_view.py and app/core/cache_tree.py,
which import no gradio; a timer refreshes the tab every REFRESH_S seconds.

The blocks add up: total = held + evictable + empty, with vLLM's own "free" (empty + evictable)
beside them. Tokens and blocks never share a cell; every header names its unit. The customers' hit
rate comes from their stored answers; vLLM's, which counts warmups and the demo too, is shown beside
it and named as such. The table's per-template numbers are the tree's (``template_counts``)."""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from datetime import timedelta

import gradio as gr
import pandas as pd

from admin.confirm import confirm_dialog
from admin.context import AdminContext
from admin.i18n import headers
from app.core.cache_tree import cache_tree, plural, render_tree_html, template_counts, template_label
from app.core.cache_view import CacheView, read_cache_view, template_residency
from app.db import audit as db_audit
from app.db import metrics as db_metrics
from app.db.rows import SampleRow

REFRESH_S = 2.0
HISTORY = timedelta(hours=1)  # what the plots show


def _plot_columns(t: dict) -> tuple[str, str, str]:
    """The plots' x, y and series column names: the axis and legend titles, in the console's language."""
    return t["plot_minutes"], t["plot_value"], t["plot_series"]

CSS = """
.pd-cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(220px, 1fr)); gap: 10px; }
.pd-card { border: 1px solid var(--border-color-primary); border-radius: 10px; padding: 10px 14px; }
.pd-card h4 { margin: 0 0 6px; font-size: 13px; color: var(--body-text-color-subdued); font-weight: 600; }
.pd-card .pd-row { display: flex; flex-wrap: wrap; justify-content: space-between; column-gap: 8px; font-size: 14px; }
.pd-card .pd-row b { font-variant-numeric: tabular-nums; margin-left: auto; text-align: right;
                     overflow-wrap: anywhere; min-width: 0; }
.cache-tree ul { padding-left: 18px; margin: 2px 0; }
.cache-tree code { letter-spacing: -1px; color: #f97316; word-break: break-all; }
.pd-detail { color: var(--body-text-color-subdued); }
"""


def build_cache_tab(console: AdminContext):
    """The tab's components and events; returns its refresh handler and outputs for the page load."""
    t, access, engine = console.text, console.access, console.engine
    x, y, series = _plot_columns(t)
    PLOT = dict(x=x, y=y, color=series, y_title="", height=220)

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
    confirm = confirm_dialog(t, question=t["reset_confirm"], elem_id="reset-cache", status_id="reset-status")
    timer = gr.Timer(REFRESH_S)

    outputs = [cards, replicas, templates, tree, hit_plot, kv_plot, ttft_plot, requests_plot]

    async def refresh(request: gr.Request):
        await access.require(request)
        view = await read_cache_view(engine=engine, db=console.db)
        samples = await console.db.read(db_metrics.samples_since, since=view.t - HISTORY)
        usage = await console.db.read(db_metrics.template_usage)
        trees, counts = _trees(console, t)
        return (_cards(view, t, console.settings.kv_cache_metrics), _replica_rows(engine, t),
                _template_rows(console, usage, counts), trees, *_plots(samples, view, t))

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
    confirm.wire(access, reset_btn)
    confirm.yes.click(reset, None, [confirm.row, confirm.status], api_name="reset_prefix_cache").then(
        refresh, None, outputs, api_visibility="private", show_progress="hidden")
    return refresh, outputs


def _cards(view: CacheView, t: dict, kv_cache_metrics: bool) -> str:
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
    b = view.blocks
    usable = max(view.num_blocks - 1, 0)
    if b is not None:
        blocks = [(t["cache_total"], f"{b.usable:,}", "blocks-total"),
                  (t["cache_held"], f"{b.held:,}", "blocks-held"),
                  (t["cache_evictable"], f"{b.evictable:,}", "blocks-evictable"),
                  (t["cache_empty"], f"{b.empty:,}", "blocks-empty"),
                  (t["cache_sum"], t["cache_sum_value"].format(held=f"{b.held:,}", evictable=f"{b.evictable:,}",
                                                               empty=f"{b.empty:,}"), "blocks-sum"),
                  (t["cache_free_vllm"], f"{b.free:,}", "blocks-free"),
                  (t["cache_cached"], f"{b.cached:,}", "blocks-cached")]
    else:
        blocks = [(t["cache_total"], f"{usable:,}", "blocks-total"),
                  (t["cache_held"], f"{view.blocks_used:,}", "blocks-held"),
                  (t["cache_free_vllm"], f"{usable - view.blocks_used:,}", "blocks-free"),
                  (t["cache_cached"], t["cache_events_off"], "blocks-cached")]
    blocks.append((t["cache_block_size"], t["cache_block_size_value"].format(n=view.block_size), "block-size"))
    groups = [
        (t["cache_blocks"], blocks),
        (t["cache_hit"], [
            (t["cache_customers_recent"], _rate(view.customers_recent, t), "hit-customers-recent"),
            (t["cache_customers_hour"], _rate(view.customers_hour, t), "hit-customers-hour"),
            (t["cache_vllm_recent"], f"{view.recent_hit_rate:.1%}", "hit-vllm-recent"),
            (t["cache_vllm_since"].format(hits=view.hits, queries=view.queries), f"{view.hit_rate:.1%}",
             "hit-vllm-since"),
            (t["cache_usage"], f"{view.kv_cache_usage:.1%}", "kv-usage")]),
        (t["cache_engine"], [
            (t["cache_running"], str(view.running), "running"),
            (t["cache_waiting"], _waiting(view, t), "waiting"),
            (t["cache_preemptions"], t["cache_not_reported"] if view.preemptions is None else f"{view.preemptions:,}",
             "preemptions"),
            (t["cache_ttft"], ttft, "ttft")]),
        (t["cache_sources"], _sources(view, t)),
        (t["cache_evictions"], _evictions(view, t, kv_cache_metrics)),
        (t["cache_memory"], [(t["cache_memory_use"], memory, "memory"), (t["cache_events"], residency, "events")]),
    ]
    out = []
    for title, rows in groups:
        body = "".join(f"<div class='pd-row' data-key='{key}'><span>{html.escape(k)}</span><b>{html.escape(v)}</b></div>"
                       for k, v, key in rows)
        out.append(f"<div class='pd-card'><h4>{html.escape(title)}</h4>{body}</div>")
    return f"<div class='pd-cards'>{''.join(out)}</div>"


def _rate(rate, t: dict) -> str:
    if rate.hit_rate is None:
        return t["cache_no_answers"]
    return plural(t, "cache_rate_of", rate.num_answers, rate=f"{rate.hit_rate:.1%}")


def _waiting(view: CacheView, t: dict) -> str:
    w = view.waiting_by_reason
    if w is None:
        return str(view.waiting)
    return t["cache_waiting_value"].format(n=view.waiting, capacity=w.capacity, deferred=w.deferred)


def _sources(view: CacheView, t: dict) -> list[tuple[str, str, str]]:
    p = view.prompt_tokens
    if p is None:
        return [(t["cache_sources_total"], t["cache_not_reported"], "sources-total")]
    return [(t["cache_sources_computed"], f"{p.computed:,}", "sources-computed"),
            (t["cache_sources_local"], f"{p.local_cache_hit:,}", "sources-local"),
            (t["cache_sources_external"], f"{p.external_kv_transfer:,}", "sources-external"),
            (t["cache_sources_total"], f"{p.total:,}", "sources-total")]


def _evictions(view: CacheView, t: dict, enabled: bool) -> list[tuple[str, str, str]]:
    e = view.evictions
    if e is None:
        return [(t["cache_evictions_state"], t["cache_evictions_not_reported"] if enabled
                 else t["cache_evictions_off"], "evictions")]
    return [(t["cache_evictions_sampled"], f"{e.num_blocks:,}", "evictions"),
            (t["cache_evictions_lifetime"], _seconds(e.mean_lifetime_s, e.num_blocks), "evictions-lifetime"),
            (t["cache_evictions_idle"], _seconds(e.mean_idle_s, e.num_blocks), "evictions-idle")]


def _seconds(value: float, n: int) -> str:
    return "–" if not n else f"{value:,.1f} s"


def _replica_rows(engine, t: dict) -> list[list]:
    rows = []
    for r in engine.replicas():
        state = t["replica_up"] if r.up else t["replica_down"].format(reason=r.reason)
        hit = f"{r.hits / r.queries:.1%}" if r.queries else "–"
        b = r.blocks
        split = [b.held, b.evictable, b.empty] if b else ["–", "–", "–"]
        rows.append([r.url, state, r.running, r.waiting, f"{r.kv_cache_usage:.1%}", *split, hit, r.requests,
                     "–" if r.preemptions is None else r.preemptions])
    return rows


def _template_rows(console: AdminContext, usage: dict[str, tuple[int, int, int]],
                   counts: dict[tuple[str, bool], tuple[int, int, int]]) -> list[list]:
    """One row per published template and split candidate; resident blocks and cached conversations are the
    tree's numbers (summed over replicas), the answers, tokens and hit rate the stored customers' answers'."""
    rows, t = [], console.text
    for r in template_residency(catalog=console.catalog, engine=console.engine):
        resident, _, conversations = counts.get((r.name, r.candidate), (r.resident_blocks, r.num_blocks, 0))
        n, prompt, cached = (0, 0, 0) if r.candidate else usage.get(r.name, (0, 0, 0))
        rows.append([template_label(r.name, r.version, r.candidate, t), r.parent, t["yes"] if r.pinned else "",
                     resident, r.num_blocks, conversations, n, prompt, cached,
                     f"{cached / prompt:.1%}" if prompt else "–"])
    return rows


def _trees(console: AdminContext, t: dict) -> tuple[str, dict[tuple[str, bool], tuple[int, int, int]]]:
    """The tree(s) as HTML and, per template, the numbers they show (resident, prefix blocks, conversations),
    summed over replicas: the table shows exactly these."""
    mirrors = [(r.url, r.mirror) for r in console.engine.replicas() if r.mirror is not None]
    if not mirrors and console.engine.residency is None:
        return f"<p>{html.escape(t['cache_events_off'])}</p>", {}
    if not mirrors:
        mirrors = [("", console.engine.residency)]
    parts, counts = [], {}
    for url, mirror in mirrors:
        tree = cache_tree(catalog=console.catalog, mirror=mirror, probe_id=console.probe_id)
        parts.append(render_tree_html(tree, t=t, replica=url))
        for key, c in template_counts(tree).items():
            before = counts.get(key, (0, c.num_blocks, 0))
            # Across replicas: the replica holding most of the prefix, and every replica's conversations.
            counts[key] = (max(before[0], c.resident_blocks), c.num_blocks, before[2] + c.conversations)
    return "".join(parts), counts


def _plots(samples: list[SampleRow], view: CacheView, t: dict) -> tuple:
    now = view.t
    x, y, column = _plot_columns(t)

    def frame(lines: dict[str, Callable[[SampleRow], float | None]]) -> pd.DataFrame:
        points = [{x: round((s.t - now).total_seconds() / 60, 3), y: value, column: name}
                  for name, get in lines.items() for s in samples if (value := get(s)) is not None]
        return pd.DataFrame(points, columns=[x, y, column])

    def counts(df: pd.DataFrame):
        # Whole-number axes: without a range, a plot of 0s and 1s labels its ticks "0, 1, 1".
        top = max(2, math.ceil(df[y].max() * 1.1)) if len(df) else 2
        return gr.update(value=df, y_lim=[0, top])

    return (
        frame({t["series_hit_customers"]: lambda s: s.customer_hit_rate, t["series_hit"]: lambda s: s.recent_hit_rate}),
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
