"""The Demo tab, for meetings: cold vs warm on the live engine, and an A/B that reports a median of rounds.

Cold vs warm asks one question in a cache namespace of its own (a fresh cache_salt: a reset for
these two requests only, so customers keep their cache), then asks it again: the two first-token
times side by side. The A/B runs several rounds of warm-prefix against unique-salt requests, one
at a time, and reports the median round with the spread, so the headline holds from run to run.
"""

from __future__ import annotations

import statistics

import gradio as gr
import pandas as pd

from app.console.context import Console
from app.console.i18n import headers
from app.console.markup import literal
from app.core.demo import ABRounds, cold_vs_warm, customer_questions, run_ab_rounds

AB_MAX_TOKENS = 16
DEMO_MAX_TOKENS = 64


def build_demo_tab(console: Console):
    """The tab's components and events; returns its refresh handler and outputs for the page load."""
    t, access, catalog = console.text, console.access, console.catalog

    async def choices(request: gr.Request):
        await access.require(request)
        names = [x.name for x in catalog.customer_facing()]
        preferred = [x.name for x in catalog.customer_facing(console.language)]
        return gr.update(choices=names, value=(preferred or names or [None])[0])

    async def run_cold_warm(template: str, question: str, request: gr.Request):
        await access.require(request)
        chain = catalog.get(template).chain
        r = await cold_vs_warm(console.engine, console.desk.prompts, chain, question.strip() or customer_questions(1)[0],
                               max_tokens=DEMO_MAX_TOKENS)
        cold = t["demo_ttft"].format(ms=f"{r.cold.ttft_ms:.0f}", cached=r.cold.num_cached_tokens,
                                     prompt=r.cold.prompt_tokens)
        warm = t["demo_ttft"].format(ms=f"{r.warm.ttft_ms:.0f}", cached=r.warm.num_cached_tokens,
                                     prompt=r.warm.prompt_tokens)
        headline = t["demo_speedup"].format(x=f"{r.speedup:.1f}", cold=f"{r.cold.ttft_ms:.0f}",
                                            warm=f"{r.warm.ttft_ms:.0f}")
        return (headline, f"#### {t['demo_cold']}\n{cold}\n\n{literal(r.cold_text)}",
                f"#### {t['demo_warm']}\n{warm}\n\n{literal(r.warm_text)}")

    async def run_ab(template: str, rounds: float, per_round: float, request: gr.Request):
        await access.require(request)
        chain = catalog.get(template).chain
        result = await run_ab_rounds(console.engine, console.desk.prompts, chain, rounds=int(rounds),
                                     per_round=int(per_round), max_tokens=AB_MAX_TOKENS)
        return _summary(result, t), _table(result, t), _points(result, t)

    gr.Markdown(t["demo_help"])
    with gr.Row():
        template = gr.Dropdown([], allow_custom_value=True, label=t["demo_template"], elem_id="demo-template")
        question = gr.Textbox(label=t["demo_question"], value=customer_questions(1)[0], elem_id="demo-question", max_length=2000)
        run_btn = gr.Button(t["demo_run"], variant="primary", elem_id="demo-run")
    headline = gr.Markdown(elem_id="demo-headline")
    with gr.Row(equal_height=True):
        cold = gr.Markdown(elem_id="demo-cold", container=True)
        warm = gr.Markdown(elem_id="demo-warm", container=True)
    gr.Markdown(t["ab_title"])
    with gr.Row():
        rounds = gr.Slider(3, 9, value=5, step=1, label=t["ab_rounds"], elem_id="ab-rounds")
        per_round = gr.Slider(2, 8, value=4, step=1, label=t["ab_per_round"], elem_id="ab-per-round")
        ab_btn = gr.Button(t["ab_run"], elem_id="ab-run")
    summary = gr.Markdown(elem_id="ab-summary")
    table = gr.Dataframe(headers=headers(console.language, "ab_headers"), interactive=False, elem_id="ab-table")
    plot = gr.ScatterPlot(x="request", y="ttft_ms", color="arm", title=t["ab_plot"], x_title=t["ab_request"],
                          y_title="TTFT (ms)", elem_id="ab-plot", height=320)

    run_btn.click(run_cold_warm, [template, question], [headline, cold, warm], api_name="cold_vs_warm")
    ab_btn.click(run_ab, [template, rounds, per_round], [summary, table, plot], api_name="bench_ab")
    return choices, [template]


def _summary(r: ABRounds, t: dict) -> str:
    lo, hi = r.spread
    return "\n\n".join([
        t["ab_headline"].format(x=f"{r.median_speedup:.1f}", n=len(r.rounds), lo=f"{lo:.1f}", hi=f"{hi:.1f}"),
        t["ab_note"].format(t=AB_MAX_TOKENS, p=r.rounds[0].prefix_tokens),
    ])


def _table(r: ABRounds, t: dict) -> list[list]:
    def row(name: str, ms: tuple[float, ...], cached: list[int], prompt: list[int]) -> list:
        q = statistics.quantiles(ms, n=10) if len(ms) > 1 else [ms[0]] * 9
        return [name, f"{statistics.median(ms):.0f}", f"{q[0]:.0f}–{q[-1]:.0f}",
                f"{statistics.median(cached):.0f} / {statistics.median(prompt):.0f}"]

    warm_cached = [c for x in r.rounds for c in x.warm.num_cached_tokens]
    cold_cached = [c for x in r.rounds for c in x.cold.num_cached_tokens]
    prompt = [p for x in r.rounds for p in x.warm.prompt_tokens]
    return [row(t["ab_warm"], r.warm_ttft_ms, warm_cached, prompt), row(t["ab_cold"], r.cold_ttft_ms, cold_cached, prompt)]


def _points(r: ABRounds, t: dict):
    rows = [{"request": i + 1, "ttft_ms": ms, "arm": t["ab_warm"]} for i, ms in enumerate(r.warm_ttft_ms)]
    rows += [{"request": i + 1, "ttft_ms": ms, "arm": t["ab_cold"]} for i, ms in enumerate(r.cold_ttft_ms)]
    top = max(x["ttft_ms"] for x in rows)
    # Room around the points: a plot whose axes end on the extreme points clips them in half.
    return gr.update(value=pd.DataFrame(rows), x_lim=[0, len(r.warm_ttft_ms) + 1], y_lim=[0, top * 1.15])
