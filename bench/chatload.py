"""``python -m bench.chatload --self-check``: the chat load generator (``bench.chatpage``) is never the limit.

It offers ``--rate`` chat customers a second, Poisson, from client processes of their own (the
benchmark's ``bench.clients``), to ``bench.chatstub`` — a server in a process of its own that speaks
the chat page's Gradio queue protocol with canned answers and does nothing else — and prints the
client's own numbers: requests sent this late after their scheduled arrival (p50 / p99 / max), how
late its event loop woke, first content and end, updates per answer, and whether every answer
rebuilt from its diffs equals the canned text. It passes when at least ``SELF_CHECK_RATE`` req/s
were offered with client lag p99 ≤ ``SELF_CHECK_LAG_MS``::

    python -m bench.chatload --self-check --rate 200 --window-s 10 --out bench-out
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.workload import BenchRequest

SELF_CHECK_RATE = 200.0
SELF_CHECK_LAG_MS = 10.0


def self_check_main(args) -> int:
    """Offer ``args.rate`` req/s of chat customers to ``bench.chatstub`` from client processes; print the
    client's own numbers and whether it kept up. Returns 0 when lag p99 ≤ SELF_CHECK_LAG_MS."""
    from bench import chatstub
    from bench.clients import run_in_client_processes, run_loop
    from bench.report import RunInfo, summarize
    from bench.servers import free_port
    from bench.workload import poisson_window

    port = free_port()
    stub = chatstub.start_process(port, updates=args.updates, interval_ms=args.interval_ms)
    try:
        url = f"http://127.0.0.1:{port}/"
        chatstub.wait_serving(url, stub)
        arrivals = poisson_window(args.rate, warmup_s=args.warmup_s, window_s=args.window_s, seed=args.seed)
        requests = [BenchRequest(i, chatstub.TEMPLATE, f"问题 {i}：退货怎么办？", None) for i in range(len(arrivals))]
        t0_wall, results = run_loop(run_in_client_processes(
            {"kind": "chat", "base_url": url, "expect_text": chatstub.answer(args.updates)}, requests, max_tokens=0, procs=args.client_procs, arrivals_s=arrivals,
            warmup_s=args.warmup_s, drain_timeout_s=10.0))
    finally:
        stub.terminate()
        stub.wait(10)
    info = RunInfo(path="chat", mode="stub", policy="", schedule=f"poisson {args.rate:g}/s", repeat=1,
                   offered_req_per_s=args.rate, warmup_s=args.warmup_s, window_s=args.window_s,
                   n_warmup=sum(t < args.warmup_s for t in arrivals), client_procs=args.client_procs)
    s = summarize(results, info, drain_deadline_s=max(arrivals) + 10.0)
    samples = [x for r in results for x in r.samples if x.counted and x.ok]
    kept_up = s.client_lag_p99_ms <= SELF_CHECK_LAG_MS and s.n_errors == 0 and s.n_unfinished == 0
    figures = {
        "offered_req_per_s": args.rate, "arrived_req_per_s": s.arrived_req_per_s, "req_per_s": s.req_per_s,
        "n_sent": s.n_sent, "n_ok": s.n_ok, "n_errors": s.n_errors, "n_unfinished": s.n_unfinished,
        "first_error": s.first_error, "client_procs": args.client_procs,
        "client_lag_p50_ms": s.client_lag_p50_ms, "client_lag_p99_ms": s.client_lag_p99_ms,
        "client_lag_max_ms": s.client_lag_max_ms, "client_loop_lag_p99_ms": s.client_loop_lag_p99_ms,
        "ttft_p50_ms": s.ttft_p50_ms, "e2e_p50_ms": s.e2e_p50_ms, "e2e_p99_ms": s.e2e_p99_ms,
        "updates_per_answer": sorted({x.updates for x in samples}), "stream_bytes_mean": s.stream_bytes_mean,
        "cached_tokens": sorted({x.cached_tokens for x in samples}),
        "prompt_tokens": sorted({x.prompt_tokens for x in samples}),
        "stub": {"updates": args.updates, "interval_ms": args.interval_ms}, "kept_up": kept_up,
        "target_met": kept_up and args.rate >= SELF_CHECK_RATE,
        "target": {"req_per_s": SELF_CHECK_RATE, "client_lag_p99_ms": SELF_CHECK_LAG_MS},
    }
    print(f"chat client self-check: {args.rate:g} req/s offered ({s.arrived_req_per_s:.1f} arrived) from "
          f"{args.client_procs} client processes, {s.window_s:g}-s window after {s.warmup_s:g} s: "
          f"{s.n_ok} answered, {s.n_errors} errors, {s.n_unfinished} cut off; achieved {s.req_per_s:.1f} req/s")
    print(f"  client lag p50 / p99 / max {s.client_lag_p50_ms:.2f} / {s.client_lag_p99_ms:.2f} / "
          f"{s.client_lag_max_ms:.2f} ms, its loop lag p99 {s.client_loop_lag_p99_ms:.2f} ms; "
          f"first content p50 {s.ttft_p50_ms:.1f} ms, end p50 / p99 {s.e2e_p50_ms:.0f} / {s.e2e_p99_ms:.0f} ms")
    print(f"  {args.updates} updates {args.interval_ms:g} ms apart per answer (stub); received "
          f"{', '.join(map(str, figures['updates_per_answer']))} updates, {s.stream_bytes_mean:.0f} bytes of SSE "
          f"per answer; every answer rebuilt from its diffs equals the stub's text unless counted as an error")
    met = kept_up and args.rate >= SELF_CHECK_RATE
    print(f"  the client {'kept up' if kept_up else 'DID NOT keep up'} (lag p99 <= {SELF_CHECK_LAG_MS:g} ms, every "
          f"answer complete and right); target >= {SELF_CHECK_RATE:g} req/s offered: {'met' if met else 'not met'}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "chatload-self-check.json").write_text(json.dumps(figures, indent=1, ensure_ascii=False),
                                                            encoding="utf-8")
    return 0 if kept_up else 1


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.chatload", description=__doc__.split("\n\n")[0])
    p.add_argument("--self-check", action="store_true", required=True,
                   help="measure the chat client against bench.chatstub (the only mode; python -m bench's chat "
                        "path uses the same client)")
    p.add_argument("--rate", type=float, default=SELF_CHECK_RATE, help="customers a second, Poisson")
    p.add_argument("--window-s", type=float, default=10.0)
    p.add_argument("--warmup-s", type=float, default=2.0)
    p.add_argument("--client-procs", type=int, default=2)
    p.add_argument("--updates", type=int, default=20, help="the stub's updates per answer")
    p.add_argument("--interval-ms", type=float, default=50.0, help="the stub's gap between updates")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="folder for chatload-self-check.json")
    return self_check_main(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
