"""The Benchmark tab: a short live A/B on the running engine, for demos at meetings.

Warm arm: the template's prefix is cached, as for every customer. Cold arm: each request carries
its own cache_salt, so nothing is shared and the whole prompt is computed. Same questions, same
answer length, same engine; the chart shows both TTFT distributions.
"""

from __future__ import annotations

import gradio as gr
import pandas as pd

from app.bench.ab import ABResult, run_ab

NOTE = ("Measured on the live engine, between real traffic: {n} requests per arm, {c} at a time, "
        "{t} answer tokens each. Warm = the template's {p}-token system prompt comes from the KV cache; "
        "cold = every request has its own cache_salt, so the whole prompt is computed.")


def build_bench_tab(services, *, require_operator) -> None:
    names = [t.name for t in services.desk.templates()]

    async def run(template: str, n_requests: float, request: gr.Request):
        require_operator(request)
        chain = services.store.get_published(template).chain
        result = await run_ab(services.engine, services.prompts, chain, int(n_requests), concurrency=4, max_tokens=16)
        return _summary(result, int(n_requests)), _points(result)

    with gr.Row():
        template = gr.Dropdown(names, value=names[0] if names else None, label="Template", elem_id="bench-template")
        n_requests = gr.Slider(4, 32, value=8, step=4, label="Requests per arm", elem_id="bench-n")
        button = gr.Button("Run A/B", variant="primary", elem_id="bench-run")
    summary = gr.Markdown(elem_id="bench-summary")
    plot = gr.ScatterPlot(x="request", y="ttft_ms", color="arm", title="Time to first token per request",
                          x_title="request", y_title="TTFT (ms)", elem_id="bench-plot", height=320)
    button.click(run, [template, n_requests], [summary, plot], api_name="bench_ab")


def _summary(r: ABResult, n: int) -> str:
    def median(xs):
        xs = sorted(xs)
        return xs[len(xs) // 2]

    return "\n".join([
        "| arm | TTFT p50 ms | req/s | output tok/s | cached tokens / request |",
        "|---|---|---|---|---|",
        f"| warm prefix | {median(r.warm.ttft_ms):.0f} | {r.warm.req_per_s:.2f} | {r.warm.output_tok_per_s:.0f} | "
        f"{median(r.warm.num_cached_tokens)} / {median(r.warm.prompt_tokens)} |",
        f"| unique salt (cold) | {median(r.cold.ttft_ms):.0f} | {r.cold.req_per_s:.2f} | "
        f"{r.cold.output_tok_per_s:.0f} | {median(r.cold.num_cached_tokens)} / {median(r.cold.prompt_tokens)} |",
        "",
        f"**TTFT {r.ttft_speedup:.1f}× faster, throughput {r.throughput_ratio:.2f}× with the warm prefix.**",
        "",
        NOTE.format(n=n, c=4, t=16, p=r.prefix_tokens),
    ])


def _points(r: ABResult) -> pd.DataFrame:
    rows = [{"request": i + 1, "ttft_ms": ms, "arm": "warm prefix"} for i, ms in enumerate(r.warm.ttft_ms)]
    rows += [{"request": i + 1, "ttft_ms": ms, "arm": "unique salt (cold)"} for i, ms in enumerate(r.cold.ttft_ms)]
    return pd.DataFrame(rows)
