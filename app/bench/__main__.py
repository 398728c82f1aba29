"""``python -m app.bench``: the article's benchmark through this app's serving paths, on CPU or GPU.

Examples (README "Benchmarks" has more, docs/benchmarks.md has the GPU commands):

    python -m app.bench --modes none,static,dynamic --paths raw,app,http --concurrency 4 --num-requests 16
    python -m app.bench --shape cpu-prefill --paths app --rate 2 --duration-s 15 --output-len 16
    python -m app.bench --paths http --sweep 1,2,4 --sweep-duration-s 10

Prints a table shaped like the article's and writes ``bench.json`` and ``bench.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m app.bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="demo",
                   help="demo, cpu-prefill, qwen2.5-7b, or a model folder (config + tokenizer; dummy weights)")
    p.add_argument("--tokenizer-from", type=Path, help="tokenizer folder for --shape qwen2.5-7b")
    p.add_argument("--templates", default="ecommerce", help="ecommerce (~600 tokens), long (~2,000) or family")
    p.add_argument("--modes", default="none,static,dynamic", help="comma list of none, static, dynamic")
    p.add_argument("--paths", default="app", help="comma list of raw, app, http, vllm-http, gradio")
    p.add_argument("--concurrency", type=int, help="closed loop: this many users (default 8 without --rate)")
    p.add_argument("--rate", type=float, help="open loop: Poisson arrivals at this many requests/s")
    p.add_argument("--num-requests", type=int, default=64, help="requests per run (closed loop, or open without "
                   "--duration-s)")
    p.add_argument("--duration-s", type=float, help="open loop: send for this long (num-requests = rate x duration)")
    p.add_argument("--output-len", type=int, default=128, help="tokens per answer (EOS ignored)")
    p.add_argument("--sweep", default="", help="comma list of offered rates (req/s) for the TTFT-SLO sweep")
    p.add_argument("--sweep-path", help="path the sweep drives (default: http if listed, else app)")
    p.add_argument("--sweep-duration-s", type=float, default=20.0, help="seconds of traffic per sweep rate")
    p.add_argument("--ttft-slo-ms", type=float, default=800.0, help="p99 TTFT the sweep must stay within")
    p.add_argument("--low-load-requests", type=int, default=0,
                   help="also send this many requests one at a time (warm) and report their TTFT")
    p.add_argument("--dynamic-templates", type=int, default=0,
                   help="dynamic mode's template count (0: 1.5x what the KV cache holds)")
    p.add_argument("--pinned", type=int, default=2, help="dynamic mode: most popular templates kept warm")
    p.add_argument("--zipf", type=float, default=1.1, help="dynamic mode: Zipf exponent of template popularity")
    p.add_argument("--keep-warm-s", type=float, default=1.0, help="dynamic mode: seconds between re-warms")
    p.add_argument("--client-procs", type=int, default=1, help="client processes for http, vllm-http and gradio")
    p.add_argument("--cross-check", action="store_true",
                   help="also run mode none on a second engine with prefix caching off")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="an app setting for the engine (see python -m app --help), e.g. --set max_num_seqs=1024")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--label", default="", help="free text stored in the JSON")
    p.add_argument("--data-dir", type=Path, default=Path("/tmp/prefixdesk-bench"),
                   help="folder for the demo model, generated shapes and the gradio path's database")
    p.add_argument("--out", type=Path, default=Path("bench-out"), help="folder for bench.json and bench.png")
    args = p.parse_args(argv)
    if args.rate is None and args.concurrency is None:
        args.concurrency = 8
    return args


def build_settings(args: argparse.Namespace):
    """Settings from the environment, the benchmark's own needs, then ``--set`` (which wins)."""
    from app.settings import SETTINGS, SettingsError, load_settings

    by_name = {s.name: s for s in SETTINGS}
    overrides: dict = {"max_concurrent_requests": 100_000, "data_dir": str(args.data_dir)}
    for item in args.set:
        name, eq, value = item.partition("=")
        if not eq or name not in by_name:
            raise SettingsError(f"--set {item!r}: expected NAME=VALUE with NAME one of {', '.join(by_name)}")
        overrides[name] = by_name[name].parse(value)
    settings = load_settings(**overrides)
    if settings.max_tokens < args.output_len:
        settings = settings.replace(max_tokens=args.output_len)
    return settings


async def main_async(args: argparse.Namespace) -> int:
    from app.bench import report
    from app.bench.paths import CLIENT_PATHS, PATHS
    from app.bench.runner import Bench, Schedule, free_port, openai_app
    from app.bench.shapes import kv_bytes_per_token, resolve_shape
    from app.bench.external import cross_check, run_vllm_http, serve_full_app
    from app.bench.workload import build_workload, poisson_arrivals, template_set
    from app.engine import build_engine, resolve_model_path
    from app.prompts import PromptBuilder

    paths = [p for p in args.paths.split(",") if p]
    modes = [m for m in args.modes.split(",") if m]
    for p in paths:
        if p not in PATHS:
            print(f"app.bench: --paths takes {', '.join(PATHS)}, not {p!r}", file=sys.stderr)
            return 2
    settings = build_settings(args)
    demo_dir = resolve_model_path(settings.replace(model="")) if args.shape == "cpu-prefill" else None
    shape = resolve_shape(args.shape, data_dir=settings.data_dir, demo_model_dir=demo_dir,
                          tokenizer_dir=args.tokenizer_from)
    if shape.model_dir is not None:
        settings = settings.replace(model=str(shape.model_dir), load_format=shape.load_format)

    started = time.time()
    engine = build_engine(settings)
    info = engine.info
    print(f"app.bench: engine up in {time.time() - started:.0f} s: {info.device}, {info.num_blocks} blocks of "
          f"{info.block_size}, flags {engine.flags}", flush=True)
    prompts = PromptBuilder(settings.tokenizer or info.model, max_model_len=info.max_model_len,
                            max_tokens=settings.max_tokens, drop_oldest_turns=False,
                            trust_remote_code=settings.trust_remote_code)
    model_dir = Path(info.model)
    if info.device == "cpu" and info.num_blocks:
        block_bytes = info.kv_cache_bytes // info.num_blocks
    else:
        block_bytes = kv_bytes_per_token(model_dir, engine.flags.kv_cache_dtype) * info.block_size
    templates = template_set(args.templates, settings.templates_dir, prompts.count)
    prefix_tokens = {t.name: len(prompts.prefix_ids(t.system)) for t in templates}
    print(f"app.bench: templates {prefix_tokens} (system segment tokens)", flush=True)
    capacity_tokens = info.num_blocks * info.block_size
    dynamic_n = args.dynamic_templates or max(4, math.ceil(1.5 * capacity_tokens / min(prefix_tokens.values())))

    bench = Bench(engine, prompts, kv_block_bytes=block_bytes)
    args.out.mkdir(parents=True, exist_ok=True)
    progress = args.out / "runs.jsonl"

    def record(summary: report.RunSummary) -> None:
        # Written as each run ends, so a benchmark cut short by a time limit still leaves its numbers.
        with progress.open("a", encoding="utf-8") as f:
            f.write(json.dumps(asdict(summary), ensure_ascii=False) + "\n")
        print(report.table([summary]).splitlines()[-1], flush=True)

    summaries: list[report.RunSummary] = []
    sweep_runs: list[report.RunSummary] = []
    extra: dict = {"engine": {**asdict(info), "flags": asdict(engine.flags)}, "prefix_tokens": prefix_tokens,
                   "dynamic_templates": dynamic_n}

    def schedule_for(n: int, rate: float | None = None) -> Schedule:
        if rate is not None:
            return Schedule(arrivals_s=tuple(poisson_arrivals(rate, n, seed=args.seed)), rate_per_s=rate)
        return Schedule(concurrency=args.concurrency)

    def n_for(rate: float | None, duration: float | None) -> int:
        return max(1, round(rate * duration)) if rate and duration else args.num_requests

    def workload_for(mode: str, n: int):
        return build_workload(mode, templates, n, seed=args.seed, dynamic_templates=dynamic_n, pinned=args.pinned,
                              zipf_s=args.zipf, salt_prefix=f"bench-{int(started)}-{mode}")

    http_url: str | None = None
    gradio_url: str | None = None

    async def client_target(path: str) -> dict:
        nonlocal http_url, gradio_url
        if path == "http":
            http_url = http_url or await bench.serve_http(openai_app(bench.desk), free_port())
            return {"kind": "http", "base_url": http_url + "/v1"}
        if path == "gradio":
            gradio_url = gradio_url or await serve_full_app(bench, settings, args.output_len)
            return {"kind": "gradio", "base_url": gradio_url}
        raise ValueError(path)

    try:
        # Engine warm-up: the first requests pay one-off costs (graphs, allocator) nobody should measure.
        await bench.warm(templates)
        warm_wl = workload_for("static", min(8, args.num_requests))
        await bench.run("app", warm_wl, Schedule(concurrency=min(8, args.num_requests)), max_tokens=8)

        n = n_for(args.rate, args.duration_s)
        for mode in modes:
            wl = workload_for(mode, n)
            if mode == "static" and "raw" in paths:
                built = [prompts.build(wl.template(r.template).system, [], r.question).token_ids for r in wl.requests]
                raw = bench.raw_token_ids(wl)
                extra["raw_prompts_identical"] = sum(built[i] == raw[r.index] for i, r in enumerate(wl.requests))
            for path in paths:
                if path == "vllm-http":
                    continue
                target = await client_target(path) if path in CLIENT_PATHS else None
                if path == "gradio" and mode != "static":
                    continue  # the chat serves the database's templates only
                summary, _ = await bench.run(path, wl, schedule_for(n, args.rate), max_tokens=args.output_len,
                                             client_procs=args.client_procs, keep_warm_interval_s=args.keep_warm_s,
                                             client_target=target)
                summaries.append(summary)
                record(summary)

        if args.low_load_requests:
            wl = workload_for("static", args.low_load_requests)
            for path in [p for p in paths if p in ("raw", "app", "http")]:
                target = await client_target(path) if path in CLIENT_PATHS else None
                summary, _ = await bench.run(path, wl, Schedule(concurrency=1), max_tokens=args.output_len,
                                             client_target=target)
                summaries.append(summary)
                record(summary)

        rates = [float(r) for r in args.sweep.split(",") if r]
        if rates:
            path = args.sweep_path or ("http" if "http" in paths else "app")
            target = await client_target(path) if path in CLIENT_PATHS else None
            for rate in rates:
                k = n_for(rate, args.sweep_duration_s)
                summary, _ = await bench.run(path, workload_for("static", k), schedule_for(k, rate),
                                             max_tokens=args.output_len, client_procs=args.client_procs,
                                             client_target=target)
                sweep_runs.append(summary)
                record(summary)
    finally:
        await bench.close()
        engine.shutdown()

    if args.cross_check:
        summaries.append(await cross_check(settings, args, prompts, templates, block_bytes, workload_for, n,
                                           schedule_for))
        record(summaries[-1])
    if "vllm-http" in paths:
        summaries += await run_vllm_http(settings, engine.flags, model_dir, args, modes, workload_for, n,
                                         schedule_for, record)

    sweep = None
    if sweep_runs:
        sweep = {"path": sweep_runs[0].path, "ttft_slo_ms": args.ttft_slo_ms,
                 "max_rate_within_slo": report.max_rate_within(sweep_runs, args.ttft_slo_ms),
                 "runs": [asdict(s) for s in sweep_runs]}
    extra["comparisons"] = comparisons(summaries)
    args.out.mkdir(parents=True, exist_ok=True)
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    config.update(date=time.strftime("%Y-%m-%d %H:%M:%S"), shape=shape.name, model=str(model_dir))
    report.write_json(args.out / "bench.json", config=config, summaries=summaries, sweep=sweep, extra=extra)
    charted = report.write_chart(args.out / "bench.png", summaries, sweep_runs, args.ttft_slo_ms)

    print()
    print(report.table(summaries + sweep_runs))
    print()
    print(report.article_table([s for s in summaries if s.schedule.startswith(("closed", "poisson"))
                                and s.path in ("app", "http", "raw")]))
    if sweep:
        print(f"\nhighest offered rate with p99 TTFT <= {args.ttft_slo_ms:.0f} ms on {sweep['path']}: "
              f"{sweep['max_rate_within_slo']} req/s")
    for c in extra["comparisons"]:
        print(f"{c['mode']}: {c['ours']} / {c['baseline']} throughput {c['req_per_s_ratio']:.3f}, "
              f"TTFT p50 {c['ttft_p50_delta_ms']:+.1f} ms")
    print(f"\nwrote {args.out / 'bench.json'}" + (f" and {args.out / 'bench.png'}" if charted else
                                                  " (no chart: matplotlib is not installed)"))
    return 0


def comparisons(summaries) -> list[dict]:
    """Our path against its baseline in the same run and mode: app vs raw, http vs vllm-http."""
    out = []
    for ours, base in (("app", "raw"), ("http", "vllm-http")):
        for s in summaries:
            if s.path != ours:
                continue
            b = next((x for x in summaries if x.path == base and x.mode == s.mode and x.schedule == s.schedule), None)
            if b and b.req_per_s:
                out.append({"mode": s.mode, "schedule": s.schedule, "ours": ours, "baseline": base,
                            "req_per_s_ratio": s.req_per_s / b.req_per_s,
                            "ttft_p50_delta_ms": s.ttft_p50_ms - b.ttft_p50_ms})
    return out


def main(argv: list[str]) -> int:
    from app.settings import SettingsError

    args = parse_args(argv)
    try:
        from app.bench.loadgen import run_loop

        return run_loop(main_async(args))
    except SettingsError as exc:
        print(f"app.bench: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    sys.exit(main(sys.argv[1:]))
