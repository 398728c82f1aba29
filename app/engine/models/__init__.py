"""Model support of our own: vLLM model plugins and the tokenizers they need.

Baichuan2 (``BaichuanForCausalLM``, and Baichuan-7B's ``BaiChuanForCausalLM``) left vLLM after 0.23;
``app.engine.models.baichuan`` brings it back as an out-of-tree model, registered through vLLM's
``vllm.general_plugins`` entry point, which vLLM loads in every process it starts: the in-process
engine's spawned core, each ``vllm serve`` replica and its workers, vLLM's own CLI.

How a process finds the entry point: installed, from ``pyproject.toml``
(``[project.entry-points."vllm.general_plugins"]``, which ``make install`` writes into the venv);
where the code runs from PYTHONPATH instead (the GPU device, a worktree over another checkout's venv),
from a ``*.dist-info`` folder on that PYTHONPATH, which ``python -m app.engine.models.plugin_dist DIR``
writes. ``register`` also runs in the app's own process (``LocalEngine``), so the app reads a
Baichuan config whether or not the entry point is installed; the engine core still needs it.

This module stays light: vLLM imports it to call ``register``, and the app imports it to find a
model's tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path

ENTRY_POINT_GROUP = "vllm.general_plugins"
# name -> object, exactly as pyproject.toml declares them (tests/test_baichuan.py keeps the two equal)
ENTRY_POINTS = {"prefixdesk_baichuan": "app.engine.models:register"}
BAICHUAN_ARCHITECTURES = ("BaichuanForCausalLM", "BaiChuanForCausalLM")
_MODEL_CLASS = "app.engine.models.baichuan:{}"


def register() -> None:
    """Register the Baichuan models with vLLM and their config with transformers. Idempotent.

    The models are registered as "module:Class" strings, so vLLM imports them (and torch's CUDA
    state) only where it builds one.
    """
    register_config()
    from vllm import ModelRegistry

    for architecture in BAICHUAN_ARCHITECTURES:
        ModelRegistry.register_model(architecture, _MODEL_CLASS.format(architecture))


def register_config() -> None:
    """Let transformers' ``AutoConfig`` read Baichuan configs without their remote code. Idempotent."""
    from transformers import AutoConfig

    from app.engine.models.baichuan_config import BaichuanConfig

    AutoConfig.register(BaichuanConfig.model_type, BaichuanConfig, exist_ok=True)


def read_config(model: Path | str) -> dict | None:
    """The config.json of a local model folder as a dict; None for a hub id or a folder without one."""
    path = Path(model) / "config.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def is_baichuan(model: Path | str) -> bool:
    """Whether ``model`` is a local folder of a Baichuan or Baichuan2 checkpoint."""
    config = read_config(model) or {}
    return config.get("model_type") == "baichuan" or bool(set(config.get("architectures") or ()) &
                                                           set(BAICHUAN_ARCHITECTURES))


def resolve_tokenizer(tokenizer: str, model: Path | str, data_dir: Path) -> str:
    """The tokenizer the prompts and the engine use for ``model``.

    ``tokenizer`` (PREFIXDESK_TOKENIZER) when given; for a Baichuan folder (or a Baichuan hub id
    in the Hugging Face cache), its SentencePiece tokenizer converted to a fast tokenizer with the
    Baichuan2 chat template under ``data_dir`` (built on first use, never written into the model's
    folder); otherwise the model itself. Raises TokenizerConversionError when a Baichuan model's
    tokenizer cannot be converted, or a Baichuan hub id has no local copy.
    """
    if tokenizer:
        return tokenizer
    folder = _local_folder(model)
    if folder is not None and is_baichuan(folder):
        from app.engine.models.baichuan_tokenizer import ensure_converted_tokenizer

        register_config()  # the converted folder carries the model's config, which transformers may read
        return str(ensure_converted_tokenizer(folder, data_dir))
    if folder is None and "baichuan" in str(model).lower():
        from app.engine.models.baichuan_tokenizer import TokenizerConversionError

        name = Path(str(model)).name
        raise TokenizerConversionError(
            f"{model} is not on this machine, and its tokenizer is converted from the files of a local copy: "
            f"download it first (`huggingface-cli download {model} --local-dir /models/{name}`) and set "
            f"PREFIXDESK_MODEL=/models/{name}")
    return str(model)


def _local_folder(model: Path | str) -> Path | None:
    """``model`` as a folder on this machine: itself, or a hub id's copy in the Hugging Face cache."""
    if Path(model).is_dir():
        return Path(model)
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(str(model), local_files_only=True))
    except Exception:  # not a hub id, or not in the cache: huggingface_hub raises several types
        return None


def attention_backend(model: Path | str, *, on_cpu: bool) -> str | None:
    """The vLLM attention backend ``model`` needs on this machine; None leaves vLLM's own choice.

    ALiBi (Baichuan2-13B) on a GPU: vLLM's default FlashAttention backend runs ALiBi only with
    FlashAttention 2 (FA3 and FA4 have no ALiBi), and slim vLLM builds leave FA2 out (the GPU
    device's bundle keeps only FA3); the Triton backend has ALiBi, so it serves then.
    """
    config = read_config(model)
    if on_cpu or not config or not is_baichuan(model):
        return None
    from app.engine.models.baichuan_config import ALIBI, position_embedding_of

    if position_embedding_of(config, (config.get("architectures") or [""])[0]) != ALIBI:
        return None
    try:
        from vllm.vllm_flash_attn.flash_attn_interface import FA2_AVAILABLE
    except ImportError:
        FA2_AVAILABLE = False  # noqa: N806  (vLLM's name)
    return None if FA2_AVAILABLE else "TRITON_ATTN"
