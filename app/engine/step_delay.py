"""A pause after every engine step for the answers that ask for one (tests only).

A test that stops, kills or signals an answer mid-stream needs one that is certainly still streaming when
it acts, however loaded the machine. vLLM has no such knob, so this is a vLLM logits processor that changes
no logits: vLLM calls ``update_state`` once before each forward pass, in the process that runs the model, and
while a request in the batch asked for a pause (``SamplingParams.extra_args[STEP_DELAY_ARG]``; ``vllm_xargs``
over HTTP) it sleeps there, which holds the whole batch. The engine registers it only with
PREFIXDESK_ENGINE_STEP_DELAYS.
"""

from __future__ import annotations

import time

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from app.engine.types import STEP_DELAY_ARG

MAX_STEP_DELAY_MS = 1000


class StepDelay(LogitsProcessor):
    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        delay_ms = (sampling_params.extra_args or {}).get(STEP_DELAY_ARG)
        if delay_ms is not None and (type(delay_ms) not in (int, float) or not 0 < delay_ms <= MAX_STEP_DELAY_MS):
            raise ValueError(f"{STEP_DELAY_ARG} must be a number of milliseconds in (0, {MAX_STEP_DELAY_MS}], "
                             f"not {delay_ms!r}")

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        self._delay_ms: dict[int, float] = {}  # batch row -> the pause its request asked for

    def is_argmax_invariant(self) -> bool:
        return True  # it never changes a logit

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self._delay_ms, batch_update,
                             lambda params, _prompt, _output: (params.extra_args or {}).get(STEP_DELAY_ARG))
        if self._delay_ms:
            time.sleep(max(self._delay_ms.values()) / 1000)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits
