"""The Demo tab, for meetings: cold vs warm on the live engine, an A/B that reports a median of rounds,
and a reset that warms every template again.

Cold vs warm asks a question in a cache namespace of its own (a fresh cache_salt: a reset for these
requests only, so customers keep their cache), then a different question there: the second shares
only the template with the first, so its cached tokens are exactly the template's full blocks. Each
answer appears as it arrives. The A/B runs rounds of warm-prefix against unique-salt requests, one
at a time, showing each round as it ends, and reports the median round with the spread. The demo's
requests are never stored and run in namespaces of their own (app/core/demo.py), so the cache page
counts them apart from the customers'.
"""

from __future__ import annotations

import statistics
import time

import gradio as gr
import pandas as pd

from admin.confirm import confirm_dialog
from admin.context import AdminContext
from admin.i18n import duration, headers
from admin.markup import literal
from app.core.demo import ABRounds, ColdWarm, SameQuestion, ab_rounds, cold_then_warm, demo_questions
from app.core.warmup import warm_all
from app.db import audit as db_audit

AB_MAX_TOKENS = 16
DEMO_MAX_TOKENS = 64
MAX_QUESTION_CHARS = 2000


def build_demo_tab(console: AdminContext):
    """The tab's components and events; returns its refresh handler and outputs for the page load."""
    t, access, catalog = console.text, console.access, console.catalog

    async def choices(request: gr.Request):
        await access.require(request)
        names = [x.name for x in catalog.customer_facing()]
        preferred = [x.name for x in catalog.customer_facing(console.language)]
        name = (preferred or names or [None])[0]
        cold_q, warm_q = _questions(name)
        return gr.update(choices=names, value=name), cold_q, warm_q

    def _questions(name: str | None) -> tuple[str, str]:
        try:
            language = catalog.get(name).language if name else console.language
        except LookupError:
            language = console.language
        return demo_questions(language)

    async def on_template(name: str, request: gr.Request):
        await access.require(request)
        return _questions(name)

    async def run_cold_warm(template: str, cold_question: str, warm_question: str, request: gr.Request):
        await access.require(request)
        try:
            chain = catalog.get(template).chain
            questions = [q.strip() if isinstance(q, str) else "" for q in (cold_question, warm_question)]
            if not all(questions) or max(map(len, questions)) > MAX_QUESTION_CHARS:
                raise ValueError(t["demo_questions_needed"].format(n=MAX_QUESTION_CHARS))
            yield t["demo_asking_cold"], t["demo_waiting"], t["demo_waiting"]
            async for r in cold_then_warm(console.engine, console.desk.prompts, chain, *questions,
                                          max_tokens=DEMO_MAX_TOKENS):
                yield _cold_warm(r, t)
        except SameQuestion:
            yield t["refused"].format(message=t["demo_same_question"]), gr.skip(), gr.skip()
        except (LookupError, ValueError) as exc:
            yield t["refused"].format(message=exc), gr.skip(), gr.skip()

    async def run_ab(template: str, rounds: float, per_round: float, request: gr.Request):
        await access.require(request)
        try:
            info = catalog.get(template)
            n_rounds, n_per_round = _whole(rounds, 3, 9), _whole(per_round, 2, 8)
        except (LookupError, ValueError) as exc:
            yield t["refused"].format(message=exc), gr.skip(), gr.skip()
            return
        started = time.perf_counter()
        yield t["ab_progress"].format(k=1, n=n_rounds, s="0"), [], gr.skip()
        async for result in ab_rounds(console.engine, console.desk.prompts, info.chain, rounds=n_rounds,
                                      per_round=n_per_round, max_tokens=AB_MAX_TOKENS, language=info.language):
            k = len(result.rounds)
            elapsed = f"{time.perf_counter() - started:.0f}"
            if k < n_rounds:
                progress = t["ab_progress"].format(k=k + 1, n=n_rounds, s=elapsed)
                yield f"{progress}\n\n{_summary(result, t)}", _table(result, t), _points(result, t)
            else:
                yield _summary(result, t), _table(result, t), _points(result, t)

    async def reset_and_warm(request: gr.Request):
        user = await access.require(request)
        engine = console.engine
        before = engine.residency.num_cached_blocks() if engine.residency else None
        if not await engine.reset_prefix_cache():
            yield gr.update(visible=False), t["reset_refused"]
            return
        await console.db.write(db_audit.record, user=user, action="reset prefix cache", target="all templates",
                               field="cached blocks", before=before, after=0)
        yield gr.update(visible=False), t["rewarm_progress"].format(n=0)
        done = []
        async for r in warm_all(engine, catalog, probe_id=console.probe_id, shards=console.settings.family_shards):
            await console.db.write(db_audit.record, user=user, action="warmup", target=r.template,
                                   field="cached prefix tokens", before=r.was_cached_tokens, after=r.num_cached_tokens)
            done.append(r)
            yield gr.skip(), t["rewarm_progress"].format(n=len(done))
        yield gr.skip(), t["rewarm_done"].format(blocks=before if before is not None else "?", n=len(done),
                                                 time=duration(t, sum(r.elapsed_ms for r in done)))

    gr.Markdown(t["demo_help"])
    with gr.Row():
        template = gr.Dropdown([], allow_custom_value=True, label=t["demo_template"], elem_id="demo-template",
                               scale=2)
        cold_question = gr.Textbox(label=t["demo_question_cold"], elem_id="demo-question",
                                   max_length=MAX_QUESTION_CHARS, scale=3)
        warm_question = gr.Textbox(label=t["demo_question_warm"], elem_id="demo-question-warm",
                                   max_length=MAX_QUESTION_CHARS, scale=3)
    run_btn = gr.Button(t["demo_run"], variant="primary", elem_id="demo-run")
    headline = gr.Markdown(t["demo_before"], elem_id="demo-headline")
    with gr.Row(equal_height=True):
        cold = gr.Markdown(f"#### {t['demo_cold']}\n{t['demo_empty']}", elem_id="demo-cold", container=True)
        warm = gr.Markdown(f"#### {t['demo_warm']}\n{t['demo_empty']}", elem_id="demo-warm", container=True)
    gr.Markdown(t["ab_title"])
    with gr.Row():
        rounds = gr.Slider(3, 9, value=5, step=1, label=t["ab_rounds"], elem_id="ab-rounds")
        per_round = gr.Slider(2, 8, value=4, step=1, label=t["ab_per_round"], elem_id="ab-per-round")
        ab_btn = gr.Button(t["ab_run"], elem_id="ab-run")
    summary = gr.Markdown(t["ab_before"], elem_id="ab-summary")
    table = gr.Dataframe(headers=headers(console.language, "ab_headers"), interactive=False, elem_id="ab-table")
    plot = gr.ScatterPlot(x=t["ab_request"], y=t["ab_ttft"], color=t["ab_arm"], title=t["ab_plot"],
                          x_title=t["ab_request"], y_title=t["ab_ttft"], elem_id="ab-plot", height=320)
    gr.Markdown(t["rewarm_title"])
    reset_btn = gr.Button(t["rewarm"], variant="stop", size="sm", elem_id="demo-rewarm")
    confirm = confirm_dialog(t, question=t["rewarm_confirm"], elem_id="demo-rewarm", status_id="demo-rewarm-status")

    template.input(on_template, template, [cold_question, warm_question], api_visibility="private")
    run_btn.click(run_cold_warm, [template, cold_question, warm_question], [headline, cold, warm],
                  api_name="cold_vs_warm", show_progress="hidden")
    ab_btn.click(run_ab, [template, rounds, per_round], [summary, table, plot], api_name="bench_ab",
                 show_progress="hidden")
    confirm.wire(access, reset_btn)
    confirm.yes.click(reset_and_warm, None, [confirm.row, confirm.status], api_name="reset_and_rewarm",
                      show_progress="hidden")
    return choices, [template, cold_question, warm_question]


def _cold_warm(r: ColdWarm, t: dict) -> tuple[str, str, str]:
    def result(asked, reused: str) -> str:
        s = asked.stats
        line = t["demo_ttft"].format(time=duration(t, s.ttft_ms), cached=s.num_cached_tokens, prompt=s.prompt_tokens)
        return f"{line}\n\n{reused}\n\n> {literal(asked.question)}\n\n{literal(asked.text)}"

    cold = f"#### {t['demo_cold']}\n{result(r.cold, t['demo_cold_note'])}"
    if r.warm is None:
        return t["demo_asking_warm"], cold, f"#### {t['demo_warm']}\n{t['demo_waiting']}"
    size = r.block_size
    note = t["demo_warm_note"].format(blocks=r.prefix_blocks, tokens=r.prefix_blocks * size, size=size)
    if r.shared_blocks != r.prefix_blocks:  # the chat's user header spilled into one more shared block
        note = t["demo_warm_note_header"].format(blocks=r.shared_blocks, tokens=r.shared_blocks * size, size=size,
                                                 prefix=r.prefix_blocks)
    headline = t["demo_speedup"].format(x=f"{r.speedup:.1f}", cold=duration(t, r.cold.stats.ttft_ms),
                                        warm=duration(t, r.warm.stats.ttft_ms))
    return headline, cold, f"#### {t['demo_warm']}\n{result(r.warm, note)}"


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
                f"{statistics.median(cached):.0f}", f"{statistics.median(prompt):.0f}"]

    warm_cached = [c for x in r.rounds for c in x.warm.num_cached_tokens]
    cold_cached = [c for x in r.rounds for c in x.cold.num_cached_tokens]
    prompt = [p for x in r.rounds for p in x.warm.prompt_tokens]
    return [row(t["ab_warm"], r.warm_ttft_ms, warm_cached, prompt), row(t["ab_cold"], r.cold_ttft_ms, cold_cached, prompt)]


def _points(r: ABRounds, t: dict):
    x, y, arm = t["ab_request"], t["ab_ttft"], t["ab_arm"]
    rows = [{x: i + 1, y: ms, arm: t["ab_warm"]} for i, ms in enumerate(r.warm_ttft_ms)]
    rows += [{x: i + 1, y: ms, arm: t["ab_cold"]} for i, ms in enumerate(r.cold_ttft_ms)]
    top = max(row[y] for row in rows)
    # Room around the points: a plot whose axes end on the extreme points clips them in half.
    return gr.update(value=pd.DataFrame(rows), x_lim=[0, len(r.warm_ttft_ms) + 1], y_lim=[0, top * 1.15])


def _whole(value, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or not lo <= value <= hi:
        raise ValueError(f"choose a whole number from {lo} to {hi}")
    return int(value)
