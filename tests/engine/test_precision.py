"""PREFIXDESK_QUANTIZATION: what each machine and checkpoint may serve, refused with the setting's
name; and how the precision that serves is named for people (/healthz, the start-up line)."""

import json

import pytest
import torch

from app.engine.precision import check_quantization, describe_precision
from app.engine.types import EngineStartError
from app.settings import QUANTIZATIONS, SettingsError, load_settings


@pytest.mark.parametrize("quantization", QUANTIZATIONS)
def test_the_cpu_engine_refuses_every_quantization_naming_the_setting(quantization, tmp_path):
    with pytest.raises(EngineStartError, match=f"^PREFIXDESK_QUANTIZATION={quantization} is not available on this "
                                               "CPU machine: .* Leave PREFIXDESK_QUANTIZATION empty"):
        check_quantization(quantization, tmp_path, on_cpu=True, capability=None)


@pytest.mark.parametrize("capability", [70, 80, 86])
def test_fp8_needs_a_gpu_with_fp8_units(capability, tmp_path):
    with pytest.raises(EngineStartError, match=rf"PREFIXDESK_QUANTIZATION=fp8 needs a GPU with fp8 units \(compute "
                                               rf"capability 8.9 or newer: L4, L40, H100, H200\); this GPU has "
                                               rf"{capability // 10}.{capability % 10}"):
        check_quantization("fp8", tmp_path, on_cpu=False, capability=capability)


@pytest.mark.parametrize("capability", [89, 90, 100])
def test_fp8_is_accepted_from_compute_capability_8_9(capability, tmp_path):
    check_quantization("fp8", tmp_path, on_cpu=False, capability=capability)


@pytest.mark.parametrize("quantization", ["awq", "gptq"])
def test_awq_and_gptq_need_a_checkpoint_quantized_that_way(quantization, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "baichuan"}))
    with pytest.raises(EngineStartError, match=f"needs a checkpoint quantized with {quantization.upper()}, but "
                                               f"{tmp_path} is not one \\(its config.json has no quantization_config\\)"):
        check_quantization(quantization, tmp_path, on_cpu=False, capability=90)
    other = "gptq" if quantization == "awq" else "awq"
    config.write_text(json.dumps({"quantization_config": {"quant_method": other, "bits": 4}}))
    with pytest.raises(EngineStartError, match=f"its config.json names quant_method '{other}'"):
        check_quantization(quantization, tmp_path, on_cpu=False, capability=90)
    config.write_text(json.dumps({"quantization_config": {"quant_method": quantization.upper(), "bits": 4}}))
    check_quantization(quantization, tmp_path, on_cpu=False, capability=90)


def test_no_quantization_is_always_fine(tmp_path):
    check_quantization("", tmp_path, on_cpu=True, capability=None)


def test_the_settings_refuse_an_unknown_quantization():
    with pytest.raises(SettingsError, match="PREFIXDESK_QUANTIZATION must be empty or one of fp8, awq, gptq, not "
                                            "'int4'"):
        load_settings(environ={"PREFIXDESK_QUANTIZATION": "int4"})
    assert load_settings(environ={"PREFIXDESK_QUANTIZATION": "fp8"}).quantization == "fp8"


@pytest.mark.parametrize(("dtype", "quantization", "kv_cache_dtype", "named"), [
    (torch.bfloat16, None, "fp8", "bf16 weights · fp8 KV"),
    (torch.bfloat16, None, "auto", "bf16 weights · bf16 KV"),
    (torch.float32, None, "auto", "fp32 weights · fp32 KV"),
    (torch.bfloat16, "fp8", "fp8_e4m3", "fp8 weights · bf16 compute · fp8 KV"),
    (torch.float16, "awq", "auto", "awq weights · fp16 compute · fp16 KV"),
    ("float16", "gptq", "fp8", "gptq weights · fp16 compute · fp8 KV"),
])
def test_the_precision_is_named_for_people(dtype, quantization, kv_cache_dtype, named):
    assert describe_precision(dtype, quantization, kv_cache_dtype) == named


def test_the_local_engine_refuses_fp8_here_before_starting_anything(tmp_path):
    from app.engine.local import LocalEngine

    from tests.helpers.servers import settings_for

    with pytest.raises(EngineStartError, match="^PREFIXDESK_QUANTIZATION=fp8 is not available on this CPU machine"):
        LocalEngine(settings_for(tmp_path, quantization="fp8"), tmp_path / "no-model-needed")
