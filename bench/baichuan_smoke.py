"""One case of bench/baichuan_smoke.sh (the Baichuan2 plugin on the GPU device): python3 THIS CASE.

CASE: tiny-7b, tiny-13b (log-probs against tests/engine/test_baichuan_engine.py's reference forward),
shape-13b, shape-7b-fp8 (the published shapes, dummy weights). Prints one line per check.
"""
import ast
import asyncio
import json
import math  # noqa: F401  (the reference forward uses it)
import sys
import time
import uuid
from pathlib import Path

import torch  # noqa: F401

ROOT = Path.cwd()
VAR = Path("/tmp/pd-var")


def reference():
    src = (ROOT / "tests/engine/test_baichuan_engine.py").read_text()
    tree = ast.parse(src)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "baichuan_forward")
    ns = {"math": __import__("math"), "torch": __import__("torch")}
    exec(compile(ast.Module([fn], []), "ref", "exec"), ns)
    return ns["baichuan_forward"]


def main(case: str) -> None:
    from app.engine import build_engine
    from app.engine.models.baichuan_tiny import ensure_real_shape, ensure_tiny_baichuan, read_weights
    from app.settings import load_settings
    from app.template_files import read_folder
    import sentencepiece as spm

    kind = case.split("-")[1]
    if case.startswith("tiny"):
        folder = ensure_tiny_baichuan(kind, VAR, ROOT / "templates")
        extra = dict(dtype="float32")
    else:
        folder = ensure_real_shape(kind, VAR, ROOT / "templates")
        extra = dict(dtype="bfloat16", load_format="dummy", quantization="fp8" if case.endswith("fp8") else "")
    settings = load_settings(environ={}, model=str(folder), data_dir=str(VAR / case), templates_dir=str(ROOT / "templates"),
                             enforce_eager=True, max_model_len=4096, gpu_memory_utilization=0.5, kv_events=False,
                             max_num_seqs=16, max_num_batched_tokens=4096, **extra)
    t = time.time()
    engine = build_engine(settings)
    cfg = engine._llm.vllm_config
    print(f"[{case}] started in {time.time() - t:.0f}s; precision={engine.info.precision!r}; "
          f"uses_alibi={cfg.model_config.uses_alibi}; attention_backend={cfg.attention_config.backend}; "
          f"tokenizer={engine.tokenizer}; block_size={engine.info.block_size}", flush=True)
    sp = spm.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))
    system = next(t for t in read_folder(ROOT / "templates") if t.name == "电商客服").text.strip()

    async def run():
        if case.startswith("tiny"):
            ids = sp.encode(next(t for t in read_folder(ROOT / "templates") if t.name == "商城通用规则").text.strip()) \
                + [195] + sp.encode("手机保修多久？") + [196]
            from tests.helpers.baichuan import logprobs

            got = await logprobs(engine, ids, top_k=5)
            exp = reference()(read_weights(folder), json.loads((folder / "config.json").read_text()), ids)
            want = exp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
            diff = (torch.tensor(got.prompt) - want).abs().max().item()
            top = exp[-1].topk(5).indices.tolist()
            print(f"[{case}] {len(ids)} tokens: max |logprob diff| {diff:.2e}; next-token top-5 equal: "
                  f"{list(got.next_token) == top}", flush=True)
        salt = uuid.uuid4().hex
        for q in ("我刚买的手机屏幕碎了能退吗？", "价格保护怎么申请？"):
            ids = sp.encode(system) + [195] + sp.encode(q) + [196]
            stats = [e async for e in engine.stream(ids, max_tokens=8, cache_salt=salt, ignore_eos=True)][-1]
            print(f"[{case}] prompt {stats.prompt_tokens} (system {len(sp.encode(system))}), cached "
                  f"{stats.num_cached_tokens}, output {stats.output_tokens}, ttft {stats.ttft_ms:.0f} ms", flush=True)

    asyncio.run(run())
    engine.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
