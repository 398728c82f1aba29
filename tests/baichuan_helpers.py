"""What the Baichuan tests share: the plugin's entry point made visible, and the tiny checkpoints.

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

import pytest

from app.engine.models import ENTRY_POINT_GROUP, ENTRY_POINTS

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("7b", "13b")


@pytest.fixture(scope="session")
def baichuan_plugin(tmp_path_factory) -> None:
    """The plugin's entry point, visible to this process and every process it starts."""
    if set(ENTRY_POINTS) <= {e.name for e in entry_points(group=ENTRY_POINT_GROUP)}:
        return
    from app.engine.models.plugin_dist import write_plugin_dist

    folder = tmp_path_factory.mktemp("plugin-dist")
    write_plugin_dist(folder)
    sys.path.insert(0, str(folder))
    paths = [str(folder), str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    assert set(ENTRY_POINTS) <= {e.name for e in entry_points(group=ENTRY_POINT_GROUP)}


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    """The tiny checkpoint of each kind ("7b": RoPE, safetensors; "13b": ALiBi, pytorch .bin)."""
    from app.engine.models.baichuan_tiny import ensure_tiny_baichuan

    data_dir = tmp_path_factory.mktemp("tiny-baichuan")
    return {kind: ensure_tiny_baichuan(kind, data_dir, ROOT / "templates") for kind in KINDS}
