"""Model shapes for benchmarks: a folder with config.json and a tokenizer, run with random weights.

* ``demo``: the app's tiny demo model (real weights file, CPU);
* ``cpu-prefill``: a Qwen2 large enough on a 2-core CPU that a 600-token prefill dominates a
  short answer (``load_format="dummy"``), with the demo tokenizer;
* ``qwen2.5-7b``: Qwen2.5-7B-Instruct's published shape (GQA, 28 query / 4 KV heads), config
  written here, tokenizer copied from a tokenizer folder (the 13B bundle's Qwen2.5 tokenizer);
* ``baichuan2-13b``, ``baichuan2-7b``: Baichuan2's published shapes (13B: ALiBi, 7B: RoPE) served by the
  app's own model plugin, with the tiny Baichuan tokenizer (app/engine/models/baichuan_tiny.py);
  ``baichuan2-tiny-13b``, ``baichuan2-tiny-7b``: the tiny checkpoints themselves (real weights), for
  rehearsing on a CPU;
* any other value is a model folder used as is (the 13B shape in the device bundle).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
                   "vocab.json", "merges.txt")

CPU_PREFILL_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 768, "intermediate_size": 2048,
    "num_hidden_layers": 8, "num_attention_heads": 12, "num_key_value_heads": 4, "head_dim": 64,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "hidden_act": "silu",
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_sliding_window": False,
}

QWEN25_7B_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
    "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "max_position_embeddings": 32768,
    "max_window_layers": 28, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "hidden_act": "silu",
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_sliding_window": False, "sliding_window": None,
    "vocab_size": 152064, "bos_token_id": 151643, "eos_token_id": 151645,
}


@dataclass(frozen=True)
class Shape:
    name: str
    model_dir: Path | None  # None: the demo model, built by the engine on first use
    load_format: str  # "auto" or "dummy"


def resolve_shape(name: str, *, data_dir: Path, demo_model_dir: Path | None = None,
                  tokenizer_dir: Path | None = None, templates_dir: Path = Path("templates")) -> Shape:
    """The model folder for ``name``; writes the configs of generated shapes under ``data_dir``."""
    if name == "demo":
        return Shape("demo", None, "auto")
    if name == "cpu-prefill":
        if demo_model_dir is None:
            raise ValueError("cpu-prefill needs the demo model's folder for its tokenizer")
        vocab = json.loads((demo_model_dir / "config.json").read_text())["vocab_size"]
        folder = _write_shape(data_dir / "shapes" / "cpu-prefill", dict(CPU_PREFILL_CONFIG, vocab_size=vocab),
                              demo_model_dir)
        return Shape(name, folder, "dummy")
    if name == "qwen2.5-7b":
        if tokenizer_dir is None:
            raise ValueError("qwen2.5-7b needs --tokenizer-from, a folder with a Qwen2.5 tokenizer")
        return Shape(name, _write_shape(data_dir / "shapes" / "qwen2.5-7b", QWEN25_7B_CONFIG, tokenizer_dir), "dummy")
    if name.startswith("baichuan2-"):
        from app.engine.models.baichuan_tiny import ensure_real_shape, ensure_tiny_baichuan

        kind = name.rsplit("-", 1)[1]
        if kind not in ("7b", "13b"):
            raise ValueError(f"--shape {name!r}: Baichuan2 shapes are 7b and 13b")
        if name.startswith("baichuan2-tiny-"):
            return Shape(name, ensure_tiny_baichuan(kind, data_dir, templates_dir), "auto")
        return Shape(name, ensure_real_shape(kind, data_dir, templates_dir), "dummy")
    folder = Path(name)
    if not (folder / "config.json").exists():
        raise ValueError(f"--shape {name!r} is neither demo, cpu-prefill, qwen2.5-7b nor a folder with config.json")
    return Shape(folder.name, folder, "dummy")


def kv_bytes_per_token(model_dir: Path, kv_cache_dtype: str) -> int:
    """Bytes of K and V per token for the whole model (every layer), from its config.json."""
    cfg = json.loads((model_dir / "config.json").read_text())
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    kv_heads = cfg.get("num_key_value_heads") or heads
    dtype = cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    element = 1 if kv_cache_dtype.startswith("fp8") else (4 if dtype == "float32" else 2)
    return 2 * cfg["num_hidden_layers"] * kv_heads * head_dim * element


def _write_shape(folder: Path, config: dict, tokenizer_dir: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy2(tokenizer_dir / name, folder / name)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder
