"""What the engine's snapshot reports on the installed vLLM: its version, which optional numbers it carries
(prompt tokens by source, preemptions, waiting reasons, sampled evictions) and the block split, after a
few requests that share a prefix. Prints one JSON object; a program to run where vLLM differs from the
CPU build (the GPU's vLLM 0.26), not a test:

    python -m bench.engine_stats_probe --model MODEL_DIR [--load-format dummy]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import tempfile
import time


async def probe(model: str, load_format: str, requests: int) -> dict:
    import vllm

    from app.engine.local import LocalEngine
    from app.engine.monitor import vllm_stats_features
    from app.settings import load_settings

    settings = load_settings(environ={}, model=model, load_format=load_format, max_model_len=2048, max_tokens=16,
                             kv_cache_metrics=True, data_dir=tempfile.mkdtemp(prefix="probe-"), enforce_eager=True,
                             gpu_memory_utilization=0.5, max_num_seqs=64, max_num_batched_tokens=8192)
    engine = LocalEngine(settings, model)
    try:
        prefix = list(range(1000, 1600))  # 600 tokens every request shares

        async def one(i: int):
            async with contextlib.aclosing(engine.stream(prefix + [3000 + i] * 40, max_tokens=16,
                                                         ignore_eos=True)) as stream:
                return [e async for e in stream][-1]

        first = await one(0)
        rest = await asyncio.gather(*(one(i) for i in range(1, requests)))
        await asyncio.sleep(1.0)  # stats and KV events follow the last step
        if engine.residency is not None:
            engine.residency.wait_quiet()
        snap = engine.snapshot()
        return {
            "vllm": vllm.__version__, "features": dataclasses.asdict(vllm_stats_features()),
            "cached_tokens": [first.num_cached_tokens] + [s.num_cached_tokens for s in rest],
            "prompt_tokens": dataclasses.asdict(snap.prompt_tokens) if snap.prompt_tokens else None,
            "preemptions": snap.preemptions,
            "waiting_by_reason": dataclasses.asdict(snap.waiting_by_reason) if snap.waiting_by_reason else None,
            "evictions": dataclasses.asdict(snap.evictions) if snap.evictions else None,
            "blocks": dict(dataclasses.asdict(snap.blocks), empty=snap.blocks.empty, free=snap.blocks.free)
            if snap.blocks else None,
            "queries": snap.queries, "hits": snap.hits, "block_size": snap.block_size, "num_blocks": snap.num_blocks,
        }
    finally:
        engine.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--load-format", default="auto")
    parser.add_argument("--requests", type=int, default=8)
    args = parser.parse_args()
    started = time.monotonic()
    result = asyncio.run(probe(args.model, args.load_format, args.requests))
    result["wall_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
