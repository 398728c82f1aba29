"""``python -m bench``: the article's benchmark through this app's serving paths, on CPU or GPU.

Examples (docs/benchmarks.md, "The benchmark tool", has more; bench/gpu.sh holds the GPU stages):

    python -m bench --modes none,static,dynamic --paths raw,app,http --concurrency 4 --num-requests 16
    python -m bench --paths app,http --sweep 1,2 --window-s 60 --warmup-s 15 --client-procs 2
    python -m bench --cluster 2 --paths remote,router --web-processes 2 --rate 3 --concurrency 16

Prints one line per configuration with its repeats side by side, the load generator's own lag per
run (REJECTED when it could have hidden queueing), the replicas' numbers, and writes ``bench.json``,
``runs.jsonl`` and ``bench.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from bench.paths import PATHS
from bench.workload import MODES


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("workload")
    g.add_argument("--shape", default="demo",
                   help="demo, cpu-prefill, qwen2.5-7b, or a model folder (config + tokenizer; dummy weights)")
    g.add_argument("--tokenizer-from", type=Path, help="tokenizer folder for --shape qwen2.5-7b")
    g.add_argument("--templates", default="ecommerce", help="ecommerce (~600 tokens), long (~2,000) or family")
    g.add_argument("--modes", default="static", help=f"comma list of {', '.join(MODES)}")
    g.add_argument("--output-len", type=int, default=128, help="tokens per answer (EOS ignored)")
    g.add_argument("--dynamic-templates", type=int, default=0,
                   help="dynamic mode's template count (0: 1.5x what one engine's or replica's KV cache holds)")
    g.add_argument("--pinned", type=int, default=2, help="dynamic mode: most popular templates kept warm")
    g.add_argument("--zipf", type=float, default=1.1, help="dynamic mode: Zipf exponent of popularity (0: uniform)")
    g.add_argument("--keep-warm-s", type=float, default=1.0, help="dynamic mode: seconds between re-warms")
    g.add_argument("--seed", type=int, default=0)

    g = p.add_argument_group("schedules")
    g.add_argument("--concurrency", type=int, help="closed burst: this many users at once")
    g.add_argument("--num-requests", type=int, help="closed burst: requests in all (default: --concurrency)")
    g.add_argument("--burst-repeats", type=int, default=1, help="times each closed burst runs")
    g.add_argument("--rate", type=float, action="append", default=[], help="Poisson window at this req/s (repeatable)")
    g.add_argument("--sweep", default="", help="comma list of Poisson rates (req/s), added to --rate")
    g.add_argument("--window-s", type=float, default=60.0, help="counted seconds of each Poisson run")
    g.add_argument("--warmup-s", type=float, default=15.0, help="seconds of Poisson traffic before the window, "
                   "sent but never counted")
    g.add_argument("--repeats", type=int, default=2, help="runs of each Poisson rate (shown side by side)")
    g.add_argument("--drain-timeout-s", type=float, default=30.0,
                   help="after the window, how long counted requests may still run before they are cut off")
    g.add_argument("--burst-timeout-s", type=float, default=600.0, help="a closed burst is cut off after this")
    g.add_argument("--ttft-slo-ms", type=float, default=800.0, help="p99 TTFT a passing rate stays within")
    g.add_argument("--low-load-requests", type=int, default=0,
                   help="also send this many requests one at a time (warm) per path: the idle TTFT")

    g = p.add_argument_group("paths")
    g.add_argument("--paths", default="app", help=f"comma list of {', '.join(PATHS)}")
    g.add_argument("--client-procs", type=int, default=4, help="client processes for the HTTP paths")
    g.add_argument("--app-web-processes", type=int, default=0,
                   help="--app-engine local: the app's PREFIXDESK_WEB_PROCESSES (0: its own choice, as make run makes "
                        "it: several behind the proxy over one shared engine on a GPU machine, 1 on a CPU)")
    g.add_argument("--web-processes", type=int, default=1,
                   help="web processes of the app for remote (and http: more than 1 makes it remote)")
    g.add_argument("--app-entry", choices=("auto", "full", "api"), default="auto",
                   help="the remote path's app: full (python -m app) or api (python -m app --api-only, no "
                        "Gradio); auto: full when Gradio is installed")
    g.add_argument("--app-url", help="remote path (and chat, with --app-engine local): an app already serving "
                   "(else the benchmark starts one)")
    g.add_argument("--engine-url", help="the started app's PREFIXDESK_ENGINE_URL (default: the router, or the "
                   "replica with --app-engine replica)")
    g.add_argument("--router-url", help="router path: a vllm-router already serving")
    g.add_argument("--replica-url", help="replica path: a vllm serve replica already serving")
    g.add_argument("--replica-urls", default="", help="the replicas behind --router-url, comma-separated (for "
                   "cache resets and /metrics; default: the router's /list_workers)")

    g = p.add_argument_group("cluster")
    g.add_argument("--cluster", type=int, default=0, help="start this many replicas and a router (app.cluster), "
                   "stopped at the end")
    g.add_argument("--policy", default="consistent_hash", help="the router's policy")
    g.add_argument("--policies", default="", help="comma list: run everything once per router policy (the "
                   "router restarts between them, the replicas stay, their caches are reset)")
    g.add_argument("--families-policies", default="", help="policies under which mode families runs (default: all)")
    g.add_argument("--app-engine", choices=("router", "replica", "local"), default="router",
                   help="where the started app sends its requests; local: the benchmark starts python -m app with "
                        "its own in-process engine (the embedded default) and measures its /v1 (remote) and its "
                        "chat page (chat)")
    g.add_argument("--api-servers", type=int, default=0, help="API processes per replica (0: 1 on CPU, 4 on GPU)")
    g.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto", help="replicas on GPUs or CPU cores")
    g.add_argument("--base-port", type=int, default=8600, help="router port; replicas and KV events above it")
    g.add_argument("--cascade-probe", action="store_true",
                   help="count the replicas' model steps that ran cascade attention (a probe in their engine)")

    g = p.add_argument_group("engine and output")
    g.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="an app setting (see python -m app --help), e.g. --set max_num_seqs=1024")
    g.add_argument("--cross-check", action="store_true",
                   help="also run mode none on a second in-process engine with prefix caching off")
    g.add_argument("--deadline", type=float, default=0.0,
                   help="Unix time by which everything must be done: runs that would end later are skipped")
    g.add_argument("--label", default="", help="free text stored in the JSON")
    g.add_argument("--skip", default="", metavar="PATH@RATE[#REPEAT],...",
                   help="Poisson runs not to run, e.g. remote@50,remote@70#1 (every repeat unless #REPEAT names one): "
                        "a schedule that fits a time-limited machine")
    g.add_argument("--profile", default="", metavar="PATH@RATE",
                   help="py-spy records the server (the started app, else this process) during the first run of "
                        "PATH at RATE req/s (its window) or PATH@cN (a burst of N users): profile-PATH-RATE.svg")
    g.add_argument("--data-dir", type=Path, default=Path("/tmp/prefixdesk-bench"),
                   help="folder for the demo model, shapes, databases, templates and cluster logs")
    g.add_argument("--out", type=Path, default=Path("bench-out"), help="folder for bench.json, runs.jsonl, bench.png")
    g.add_argument("--no-chart", dest="chart", action="store_false", help="write no bench.png")
    args = p.parse_args(argv)
    args.rates = [*args.rate, *(float(r) for r in args.sweep.split(",") if r)]
    if not args.rates and args.concurrency is None and not args.low_load_requests:
        args.concurrency = 8
    if args.concurrency is not None and args.num_requests is None:
        args.num_requests = args.concurrency
    args.paths = [x for x in args.paths.split(",") if x]
    args.modes = [x for x in args.modes.split(",") if x]
    for path in args.paths:
        if path not in PATHS:
            p.error(f"--paths takes {', '.join(PATHS)}, not {path!r}")
    for mode in args.modes:
        if mode not in MODES:
            p.error(f"--modes takes {', '.join(MODES)}, not {mode!r}")
    if args.web_processes > 1 and "http" in args.paths:
        # Several web processes need the engine behind HTTP: that is the remote path.
        args.paths = [x if x != "http" else "remote" for x in args.paths]
        args.paths = list(dict.fromkeys(args.paths))
        print("bench: --web-processes > 1: the http path runs as remote (python -m app over the cluster)",
              flush=True)
    if args.profile:
        from bench.pyspy import parse_profile

        try:
            parse_profile(args.profile)
        except ValueError as exc:
            p.error(str(exc))
    if args.app_engine == "local":
        others = [x for x in args.paths if x not in ("remote", "chat")]
        if others or args.cluster:
            p.error("--app-engine local measures an app with its own engine (started, or --app-url): its /v1 "
                    f"(remote) and chat page (chat) only; drop {', '.join(others) or '--cluster'}")
    if args.app_entry == "auto":
        import importlib.util

        args.app_entry = "full" if importlib.util.find_spec("gradio") else "api"
    return args


def main(argv: list[str]) -> int:
    from app.settings import SettingsError
    from bench.clients import run_loop
    from bench.session import run_session

    args = parse_args(argv)
    try:
        return run_loop(run_session(args))
    except SettingsError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    sys.exit(main(sys.argv[1:]))
