"""Turning samples into the article's figures: percentiles, a table shaped like its table, JSON and a chart."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from app.bench.loadgen import Sample

ARTICLE = {
    # The article's numbers (A100-80GB, Baichuan2-13B, ~600-token system prompt).
    "none": {"memory_mib": 18432, "req_per_s": 12},
    "static": {"memory_mib": 15360, "req_per_s": 28},
    "dynamic": {"memory_mib": 14336, "req_per_s": 32},
}
MODE_LABEL = {"none": "无Prefix (no reuse)", "static": "Prefix静态缓存 (static)", "dynamic": "Prefix动态调度 (dynamic)"}


@dataclass(frozen=True)
class EngineWindow:
    """What the engine did during one run, read from its stats (server process)."""

    queries: int  # prompt tokens looked up in the prefix cache
    hits: int
    kv_blocks_peak: int  # blocks held by running requests, at the fullest moment
    kv_used_mib_peak: float
    running_peak: int
    waiting_peak: int
    memory_mib: float  # the process tree's RSS on CPU; the GPU's used memory on CUDA
    loop_lag_p99_ms: float | None  # how late the server's event loop ran; None for client-process paths

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


@dataclass(frozen=True)
class RunSummary:
    path: str
    mode: str
    schedule: str  # "poisson 4.0/s" or "closed 8 users"
    offered_req_per_s: float | None
    n_requests: int
    n_errors: int
    duration_s: float
    req_per_s: float
    output_tok_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    e2e_p50_ms: float
    e2e_p99_ms: float
    prompt_tokens_mean: float
    cached_tokens_mean: float | None
    hit_rate: float
    kv_blocks_peak: int
    kv_used_mib_peak: float
    running_peak: int
    waiting_peak: int
    memory_mib: float
    loop_lag_p99_ms: float | None
    first_error: str | None


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation; NaN for no values."""
    if not values:
        return math.nan
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summarize(samples: Sequence[Sample], *, path: str, mode: str, schedule: str, offered_req_per_s: float | None,
              window: EngineWindow) -> RunSummary:
    """One row of figures for one run. Throughput counts finished requests over first send → last end."""
    ok = [s for s in samples if s.ok]
    errors = [s for s in samples if not s.ok]
    duration = (max(s.end_s for s in samples) - min(s.start_s for s in samples)) if samples else 0.0
    ttft = [s.ttft_ms for s in ok if s.ttft_ms is not None]
    itl = [s.itl_ms for s in ok if s.itl_ms is not None]
    e2e = [s.e2e_ms for s in ok]
    cached = [s.cached_tokens for s in ok if s.cached_tokens is not None]
    prompt = [s.prompt_tokens for s in ok if s.prompt_tokens is not None]
    return RunSummary(
        path=path, mode=mode, schedule=schedule, offered_req_per_s=offered_req_per_s,
        n_requests=len(samples), n_errors=len(errors), duration_s=round(duration, 3),
        req_per_s=len(ok) / duration if duration else 0.0,
        output_tok_per_s=sum(s.output_tokens for s in ok) / duration if duration else 0.0,
        ttft_p50_ms=percentile(ttft, 50), ttft_p99_ms=percentile(ttft, 99),
        itl_p50_ms=percentile(itl, 50), itl_p99_ms=percentile(itl, 99),
        e2e_p50_ms=percentile(e2e, 50), e2e_p99_ms=percentile(e2e, 99),
        prompt_tokens_mean=sum(prompt) / len(prompt) if prompt else math.nan,
        cached_tokens_mean=sum(cached) / len(cached) if cached else None,
        hit_rate=window.hit_rate, kv_blocks_peak=window.kv_blocks_peak, kv_used_mib_peak=window.kv_used_mib_peak,
        running_peak=window.running_peak, waiting_peak=window.waiting_peak, memory_mib=window.memory_mib,
        loop_lag_p99_ms=window.loop_lag_p99_ms, first_error=errors[0].error if errors else None,
    )


def max_rate_within(summaries: Sequence[RunSummary], ttft_p99_ms: float) -> float | None:
    """The highest offered rate whose p99 TTFT stays within ``ttft_p99_ms`` with no errors; None if none."""
    good = [s.offered_req_per_s for s in summaries
            if s.offered_req_per_s is not None and s.n_errors == 0 and s.ttft_p99_ms <= ttft_p99_ms]
    return max(good) if good else None


def table(summaries: Sequence[RunSummary]) -> str:
    """A plain-text table, one row per run, with the article's two columns first."""
    head = (f"{'mode':<26}{'path':<12}{'schedule':<17}{'KV MiB':>8}{'mem MiB':>9}{'req/s':>8}{'tok/s':>9}"
            f"{'TTFT p50':>9}{'p99':>8}{'ITL p50':>8}{'e2e p50':>9}{'p99':>8}{'hit':>6}{'blocks':>8}{'err':>5}")
    lines = [head, "-" * len(head)]
    for s in summaries:
        lines.append(
            f"{MODE_LABEL.get(s.mode, s.mode):<26}{s.path:<12}{s.schedule:<17}{s.kv_used_mib_peak:>8.0f}"
            f"{s.memory_mib:>9.0f}{s.req_per_s:>8.2f}{s.output_tok_per_s:>9.0f}{s.ttft_p50_ms:>9.1f}"
            f"{s.ttft_p99_ms:>8.1f}{s.itl_p50_ms:>8.1f}{s.e2e_p50_ms:>9.0f}{s.e2e_p99_ms:>8.0f}"
            f"{s.hit_rate:>6.2f}{s.kv_blocks_peak:>8}{s.n_errors:>5}")
    return "\n".join(lines)


def article_table(summaries: Sequence[RunSummary]) -> str:
    """The article's table (场景 / 显存占用 / 吞吐量) with our numbers beside its numbers."""
    lines = ["场景 (mode)                 article MiB  article req/s |  ours KV MiB  ours req/s  hit rate  path",
             "-" * 96]
    for s in summaries:
        a = ARTICLE.get(s.mode)
        if a is None:
            continue
        lines.append(f"{MODE_LABEL[s.mode]:<26}{a['memory_mib']:>12,}{a['req_per_s']:>15} |"
                     f"{s.kv_used_mib_peak:>13.1f}{s.req_per_s:>12.2f}{s.hit_rate:>10.2f}  {s.path}")
    return "\n".join(lines)


def write_json(path: Path, *, config: dict, summaries: Sequence[RunSummary], sweep: dict | None,
               extra: dict | None = None) -> None:
    def clean(x):
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, list):
            return [clean(v) for v in x]
        return x

    body = {"config": config, "runs": [dataclasses.asdict(s) for s in summaries], "sweep": sweep}
    body.update(extra or {})
    path.write_text(json.dumps(clean(body), ensure_ascii=False, indent=2, allow_nan=False), encoding="utf-8")


def write_chart(path: Path, summaries: Sequence[RunSummary], sweep_runs: Sequence[RunSummary],
                ttft_slo_ms: float) -> bool:
    """A PNG: req/s and TTFT p50 by mode and path, and p99 TTFT against offered rate. False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    labels = [f"{s.mode}\n{s.path}" for s in summaries]
    axes[0].bar(labels, [s.req_per_s for s in summaries], color="#4C72B0")
    axes[0].set_title("throughput (req/s)")
    axes[1].bar(labels, [s.ttft_p50_ms for s in summaries], color="#DD8452", label="p50")
    axes[1].set_title("TTFT p50 (ms)")
    for ax in axes[:2]:
        ax.tick_params(axis="x", labelsize=7)
    if sweep_runs:
        by_path: dict[str, list[RunSummary]] = {}
        for s in sweep_runs:
            by_path.setdefault(s.path, []).append(s)
        for name, runs in by_path.items():
            runs = sorted(runs, key=lambda s: s.offered_req_per_s or 0)
            axes[2].plot([s.offered_req_per_s for s in runs], [s.ttft_p99_ms for s in runs], marker="o", label=name)
        axes[2].axhline(ttft_slo_ms, color="red", linestyle="--", label=f"{ttft_slo_ms:.0f} ms")
        axes[2].set_xlabel("offered req/s")
        axes[2].set_yscale("log")
        axes[2].legend()
    axes[2].set_title("TTFT p99 (ms) by offered rate")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
