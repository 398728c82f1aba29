"""What the Baichuan tests share: the plugin's entry point made visible, the tiny checkpoints, log-probs.

vLLM finds our model plugin through the ``vllm.general_plugins`` entry point, in every process it
starts. Where prefixdesk is installed from this checkout's pyproject.toml the entry point is there
already; where it is not (a worktree run over another checkout's venv), ``baichuan_plugin`` writes
the same entry point as a dist-info folder (``app.engine.models.plugin_dist``) and puts it, and this
checkout, on PYTHONPATH, which the engine core, the ``vllm serve`` replicas and their helper
processes inherit.
"""

from __future__ import annotations

import os
import sys
from importlib.metadata import entry_points
from pathlib import Path

from app.engine.models import ENTRY_POINT_GROUP, ENTRY_POINTS
from app.engine.types import Logprobs

from tests.helpers.servers import ROOT

KINDS = ("7b", "13b")


def make_plugin_visible(folder: Path) -> None:
    """The plugin's entry point, visible to this process and every process it starts."""
    if set(ENTRY_POINTS) <= {e.name for e in entry_points(group=ENTRY_POINT_GROUP)}:
        return
    from app.engine.models.plugin_dist import write_plugin_dist

    write_plugin_dist(folder)
    sys.path.insert(0, str(folder))
    paths = [str(folder), str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    assert set(ENTRY_POINTS) <= {e.name for e in entry_points(group=ENTRY_POINT_GROUP)}


def build_tiny_models(data_dir: Path) -> dict[str, Path]:
    """The tiny checkpoint of each kind ("7b": RoPE, safetensors; "13b": ALiBi, pytorch .bin)."""
    from app.engine.models.baichuan_tiny import ensure_tiny_baichuan

    return {kind: ensure_tiny_baichuan(kind, data_dir, ROOT / "templates") for kind in KINDS}


async def logprobs(engine, prompt_token_ids, *, top_k: int = 5) -> Logprobs:
    """What the model makes of ``prompt_token_ids``: each token's log-probability after the ones before it,
    and the ``top_k`` likeliest next tokens — vLLM's raw log-probs (before temperature and top-p), asked of
    the engine's AsyncLLM directly, for checking a model port against a reference implementation."""
    import uuid

    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=top_k, prompt_logprobs=0)
    prompt = {"prompt_token_ids": list(prompt_token_ids), "cache_salt": uuid.uuid4().hex}  # computed afresh
    final = None
    async for out in engine._llm.generate(prompt, params, request_id=f"logprobs-{uuid.uuid4().hex[:8]}"):
        final = out
    assert final is not None and final.prompt_logprobs is not None
    prompt_logprobs = tuple(position[token].logprob
                            for position, token in zip(final.prompt_logprobs[1:], prompt_token_ids[1:]))
    top = final.outputs[0].logprobs[0]
    return Logprobs(prompt=prompt_logprobs, next_token={token: lp.logprob for token, lp in top.items()})
