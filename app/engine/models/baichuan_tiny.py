"""Tiny random-weight Baichuan2 checkpoints of both kinds, in the published layout, built offline.

``python -m app.engine.models.baichuan_tiny 7b|13b [--data-dir var]`` prints the folder (building it
on first use, about a second). With ``--real-shape`` it prints a folder of the published Baichuan2-7B
or -13B config.json (full size) with the tiny tokenizer and no weights: for ``load_format=dummy``
measurements of the real shapes on a GPU. Like the demo model, they let the Baichuan path — the plugin, the
weight names, the tokenizer conversion, the chat format — run and be tested with nothing downloaded:

- ``7b``: Baichuan2-7B's kind (RoPE; config.json has ``max_position_embeddings``), hidden 128,
  2 heads of 64, 2 layers, weights as ``model.safetensors``;
- ``13b``: Baichuan2-13B's kind (ALiBi; only ``model_max_length``), hidden 96, 3 heads of 32 (a head
  count that is not a power of two, as 13B's 40), 2 layers, weights as ``pytorch_model.bin``, the
  format Baichuan2-13B-Chat is published in.

Each has what the published folders have — config.json (``BaichuanForCausalLM``, ``model_type``
"baichuan", an ``auto_map`` naming remote code that is deliberately absent: nothing may need it),
generation_config.json (user 195, assistant 196, eos 2), tokenizer_config.json naming the remote
``BaichuanTokenizer``, and a SentencePiece BPE ``tokenizer.model`` trained here the way Baichuan2's
was (byte fallback, digits split, no normalization, no dummy prefix) on the 3,755 common Chinese
characters and the templates' text, with the chat tokens ``<reserved_106>``/``<reserved_107>`` at
ids 195/196. The weights are random but not timid: row norms of the LM head vary (NormHead must
matter), and the norms' weights are not all ones.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from app import template_files
from app.engine.models.demo import common_chinese_characters

BUILD_VERSION = 1  # bump when the recipe below changes, so cached builds are rebuilt
VOCAB_SIZE = 6000
RESERVED = 108  # <reserved_0> … <reserved_107>: the last two are the chat tokens
OTHER_CONTROL = 195 - 3 - (RESERVED - 2)  # control pieces between </s> and <reserved_0>, so 106 lands at 195


@dataclass(frozen=True)
class TinyShape:
    hidden_size: int
    num_attention_heads: int
    intermediate_size: int
    num_hidden_layers: int
    rope: bool  # True: Baichuan2-7B's kind; False: 13B's (ALiBi)
    weights_file: str  # model.safetensors or pytorch_model.bin


KINDS = {
    "7b": TinyShape(hidden_size=128, num_attention_heads=2, intermediate_size=256, num_hidden_layers=2, rope=True,
                    weights_file="model.safetensors"),
    "13b": TinyShape(hidden_size=96, num_attention_heads=3, intermediate_size=256, num_hidden_layers=2, rope=False,
                     weights_file="pytorch_model.bin"),
}

# The published config.json of Baichuan2-7B-Chat and Baichuan2-13B-Chat (less auto_map and tokenizer_class).
REAL_CONFIGS = {
    "7b": {"architectures": ["BaichuanForCausalLM"], "model_type": "baichuan", "hidden_size": 4096,
           "intermediate_size": 11008, "num_attention_heads": 32, "num_hidden_layers": 32,
           "max_position_embeddings": 4096, "model_max_length": 4096, "vocab_size": 125696, "rms_norm_eps": 1e-06,
           "hidden_act": "silu", "initializer_range": 0.02, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
           "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True},
    "13b": {"architectures": ["BaichuanForCausalLM"], "model_type": "baichuan", "hidden_size": 5120,
            "intermediate_size": 13696, "num_attention_heads": 40, "num_hidden_layers": 40, "model_max_length": 4096,
            "vocab_size": 125696, "rms_norm_eps": 1e-06, "hidden_act": "silu", "initializer_range": 0.02,
            "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16", "use_cache": True},
}
GENERATION_CONFIG = {"assistant_token_id": 196, "user_token_id": 195, "bos_token_id": 1, "eos_token_id": 2,
                     "pad_token_id": 0, "do_sample": True, "max_new_tokens": 2048, "temperature": 0.3, "top_p": 0.85,
                     "top_k": 5, "repetition_penalty": 1.05}

_ENGLISH = (
    "Hello, how can I help you today? Thank you for contacting customer service. "
    "order refund return shipping invoice warranty membership price protection delivery "
    "account password payment discount coupon exchange repair please sorry wait minute 2024 10:30"
)


def ensure_tiny_baichuan(kind: str, data_dir: Path, templates_dir: Path) -> Path:
    """The folder of the tiny checkpoint of ``kind`` ("7b" or "13b"), built first if missing or stale."""
    shape = KINDS[kind]
    corpus = _corpus(templates_dir)
    recipe = json.dumps([BUILD_VERSION, asdict(shape)])
    digest = hashlib.sha256(f"{recipe}\n{corpus}".encode()).hexdigest()[:12]
    folder = Path(data_dir) / "tiny-baichuan" / f"{kind}-{digest}"
    if (folder / shape.weights_file).exists():
        return folder
    tmp = folder.with_name(folder.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    build(tmp, shape, corpus)
    tmp.rename(folder)
    return folder


def ensure_real_shape(kind: str, data_dir: Path, templates_dir: Path) -> Path:
    """A folder of the published Baichuan2 ``kind`` config (full size) with the tiny tokenizer, no weights.

    Served with ``load_format=dummy`` it has the real model's compute and memory; its prompts are
    tokenized by the tiny SentencePiece model (Baichuan2's chat tokens at the same ids, all ids below
    the real vocabulary's 125,696), which is what a machine without the real tokenizer.model can do.
    """
    tiny = ensure_tiny_baichuan("7b", data_dir, templates_dir)
    folder = Path(data_dir) / "tiny-baichuan" / f"shape-{kind}-{tiny.name.split('-', 1)[1]}"
    if (folder / "config.json").exists():
        return folder
    tmp = folder.with_name(folder.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "tokenizer.model").write_bytes((tiny / "tokenizer.model").read_bytes())
    (tmp / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=2) + "\n", encoding="utf-8")
    (tmp / "config.json").write_text(json.dumps(REAL_CONFIGS[kind], indent=2) + "\n", encoding="utf-8")
    tmp.rename(folder)
    return folder


def build(folder: Path, shape: TinyShape, corpus: list[str]) -> None:
    """Write a complete tiny checkpoint of ``shape`` into ``folder``."""
    spm_model = _train_tokenizer(corpus)
    (folder / "tokenizer.model").write_bytes(spm_model)
    vocab_size = _vocab_size(spm_model)
    config = {
        "architectures": ["BaichuanForCausalLM"],
        "auto_map": {"AutoConfig": "configuration_baichuan.BaichuanConfig",
                     "AutoModelForCausalLM": "modeling_baichuan.BaichuanForCausalLM"},
        "model_type": "baichuan",
        "tokenizer_class": "BaichuanTokenizer",
        "vocab_size": vocab_size,
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_hidden_layers,
        "num_attention_heads": shape.num_attention_heads,
        "hidden_act": "silu",
        "model_max_length": 4096,
        "rms_norm_eps": 1e-6,
        "initializer_range": 0.02,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "use_cache": True,
    }
    if shape.rope:
        config["max_position_embeddings"] = 4096
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    (folder / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=2) + "\n", encoding="utf-8")
    tokenizer_config = {"auto_map": {"AutoTokenizer": ["tokenization_baichuan.BaichuanTokenizer", None]},
                        "tokenizer_class": "BaichuanTokenizer", "add_bos_token": False, "add_eos_token": False,
                        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<unk>",
                        "model_max_length": 4096, "use_fast": False}
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n", encoding="utf-8")
    _write_weights(folder / shape.weights_file, random_weights(shape, vocab_size))


def random_weights(shape: TinyShape, vocab_size: int, seed: int = 0) -> dict:
    """Random float32 tensors under the published names (``model.layers.N.self_attn.W_pack.weight`` …)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    h, i = shape.hidden_size, shape.intermediate_size

    def normal(*size: int, std: float):
        return torch.randn(*size, generator=g) * std

    def norm_weight():
        return 1.0 + normal(h, std=0.1)

    head = normal(vocab_size, h, std=0.05) * (0.5 + 1.5 * torch.rand(vocab_size, 1, generator=g))
    tensors = {"model.embed_tokens.weight": normal(vocab_size, h, std=1.0), "model.norm.weight": norm_weight(),
               "lm_head.weight": head}
    for n in range(shape.num_hidden_layers):
        p = f"model.layers.{n}."
        tensors[p + "self_attn.W_pack.weight"] = normal(3 * h, h, std=h**-0.5 * 1.5)
        tensors[p + "self_attn.o_proj.weight"] = normal(h, h, std=h**-0.5)
        tensors[p + "mlp.gate_proj.weight"] = normal(i, h, std=h**-0.5)
        tensors[p + "mlp.up_proj.weight"] = normal(i, h, std=h**-0.5)
        tensors[p + "mlp.down_proj.weight"] = normal(h, i, std=i**-0.5)
        tensors[p + "input_layernorm.weight"] = norm_weight()
        tensors[p + "post_attention_layernorm.weight"] = norm_weight()
    return tensors


def read_weights(folder: Path) -> dict:
    """The tensors of a tiny checkpoint, whichever format it was written in."""
    import torch

    if (folder / "model.safetensors").exists():
        from safetensors.torch import load_file

        return load_file(str(folder / "model.safetensors"))
    return torch.load(folder / "pytorch_model.bin", weights_only=True)


def _write_weights(path: Path, tensors: dict) -> None:
    import torch

    if path.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata={"format": "pt"})
        path.chmod(0o644)
    else:
        torch.save(tensors, path)


def _corpus(templates_dir: Path) -> list[str]:
    chars = common_chinese_characters()
    lines = ["".join(chars[k:k + 64]) for k in range(0, len(chars), 64)] + [_ENGLISH]
    for template in template_files.read_folder(templates_dir):
        lines += [line for line in template.text.splitlines() if line.strip()]
    return lines


def _train_tokenizer(corpus: list[str]) -> bytes:
    import sentencepiece as spm

    out = io.BytesIO()
    control = [f"<control_{k}>" for k in range(OTHER_CONTROL)] + [f"<reserved_{k}>" for k in range(RESERVED)]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus), model_writer=out, vocab_size=VOCAB_SIZE, model_type="bpe",
        byte_fallback=True, split_digits=True, add_dummy_prefix=False, remove_extra_whitespaces=False,
        normalization_rule_name="identity", allow_whitespace_only_pieces=True, character_coverage=1.0,
        max_sentencepiece_length=16, control_symbols=control, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        num_threads=1, minloglevel=2,
    )
    return out.getvalue()


def _vocab_size(spm_model: bytes) -> int:
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_proto=spm_model)
    assert processor.id_to_piece(195) == "<reserved_106>" and processor.id_to_piece(196) == "<reserved_107>"
    return processor.get_piece_size()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.engine.models.baichuan_tiny",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=sorted(KINDS))
    parser.add_argument("--data-dir", type=Path, default=Path("var"))
    parser.add_argument("--templates-dir", type=Path, default=Path("templates"))
    parser.add_argument("--real-shape", action="store_true",
                        help="the published config (full size) with the tiny tokenizer and no weights, "
                             "for load_format=dummy")
    args = parser.parse_args(argv)
    ensure = ensure_real_shape if args.real_shape else ensure_tiny_baichuan
    print(ensure(args.kind, args.data_dir, args.templates_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
