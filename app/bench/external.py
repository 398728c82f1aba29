"""Paths that need a second server or engine: the whole app for the gradio path, vLLM's own OpenAI
server with the same flags (``vllm-http``), and the no-reuse cross-check on an engine with prefix
caching off. Used by ``python -m app.bench``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time


async def serve_full_app(bench, settings, output_len: int) -> str:
    """The whole app (chat UI, OpenAI routes) on this engine, for the gradio path; returns its URL.

    The chat stops at EOS and has no ignore_eos, so its answers are capped at ``output_len`` but may
    end sooner; the JSON's output tok/s shows how long they were.
    """
    from app.bench.runner import free_port
    from app.server import build_services, create_app

    services = build_services(settings.replace(max_tokens=output_len), engine=bench.engine)
    return await bench.serve_http(create_app(services), free_port()) + "/"


async def cross_check(settings, args, prompts, templates, block_bytes, workload_for, n, schedule_for):
    """Mode ``none`` once more, on a fresh engine with prefix caching off: it should match the salted run."""
    from app.bench.runner import Bench
    from app.engine import build_engine

    engine = build_engine(settings.replace(prefix_caching=False))
    try:
        bench = Bench(engine, prompts, kv_block_bytes=block_bytes)
        await bench.warm(templates)
        wl = workload_for("none", n)
        summary, _ = await bench.run("app", wl, schedule_for(n, args.rate), max_tokens=args.output_len,
                                     reset_cache=False)
    finally:
        engine.shutdown()
    from dataclasses import replace

    return replace(summary, mode="none", path="app-nocache")


async def run_vllm_http(settings, flags, model_dir, args, modes, workload_for, n, schedule_for, record):
    """vLLM's own OpenAI server with the same flags and model, driven by the same client."""
    import signal
    import subprocess

    import httpx

    from app.bench import loadgen, report
    from app.bench.runner import free_port

    port = free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--served-model-name", "bench", "--host", "127.0.0.1", "--port", str(port),
           "--max-model-len", str(settings.max_model_len), "--max-num-seqs", str(flags.max_num_seqs),
           "--max-num-batched-tokens", str(flags.max_num_batched_tokens), "--kv-cache-dtype", flags.kv_cache_dtype,
           "--enable-prefix-caching", "--seed", str(settings.seed), "--load-format", settings.load_format,
           "--stream-interval", str(flags.stream_interval), "--uvicorn-log-level", "warning",
           "--enable-prompt-tokens-details"]
    if settings.block_size:
        cmd += ["--block-size", str(settings.block_size)]
    if flags.enforce_eager:
        cmd.append("--enforce-eager")
    cuda = flags.cuda_graph_max_batch or not flags.enforce_eager
    if cuda:  # GPU-only flags
        cmd += ["--gpu-memory-utilization", str(settings.gpu_memory_utilization)]
        if flags.cuda_graph_max_batch:
            cmd += ["--max-cudagraph-capture-size", str(flags.cuda_graph_max_batch)]
        cmd.append("--no-disable-cascade-attn" if flags.cascade_attention else "--disable-cascade-attn")
    else:
        cmd += ["--kv-cache-memory-bytes", str(settings.kv_cache_mib << 20), "--block-size",
                str(settings.block_size or 32)]
    print("app.bench: starting", " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, start_new_session=True)
    out = []
    try:
        async with httpx.AsyncClient() as client:
            deadline = time.monotonic() + 400
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"vLLM's server exited with {proc.returncode}")
                try:
                    if (await client.get(f"http://127.0.0.1:{port}/health")).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("vLLM's server did not answer /health in 400 s")
                await asyncio.sleep(1)
        for mode in [m for m in modes if m != "dynamic"]:
            wl = workload_for(mode, n)
            systems = {t.name: t.system for t in wl.templates}
            target = {"kind": "vllm-http", "base_url": f"http://127.0.0.1:{port}/v1", "served_model": "bench",
                      "systems": systems}
            if wl.warm_first:  # warm through the server itself: one short request per template
                warm = [r for r in workload_for(mode, len(wl.templates)).requests]
                await loadgen.run_in_client_processes(target, warm, max_tokens=1, procs=1, concurrency=1)
            schedule = schedule_for(n, args.rate)
            t_start = time.time()
            _, samples = await loadgen.run_in_client_processes(target, wl.requests, max_tokens=args.output_len,
                                                               procs=args.client_procs,
                                                               arrivals_s=schedule.arrivals_s,
                                                               concurrency=schedule.concurrency)
            cached = [s.cached_tokens or 0 for s in samples if s.ok]
            prompt = [s.prompt_tokens or 0 for s in samples if s.ok]
            window = report.EngineWindow(queries=sum(prompt), hits=sum(cached), kv_blocks_peak=0,
                                         kv_used_mib_peak=0.0, running_peak=0, waiting_peak=0, memory_mib=0.0,
                                         loop_lag_p99_ms=None)
            s = report.summarize(samples, path="vllm-http", mode=mode, schedule=schedule.label,
                                 offered_req_per_s=schedule.rate_per_s, window=window)
            out.append(s)
            record(s)
            print(f"app.bench: vllm-http {mode} took {time.time() - t_start:.0f} s", flush=True)
    except RuntimeError as exc:
        print(f"app.bench: vllm-http skipped: {exc}", file=sys.stderr, flush=True)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    return out
