"""The engine behind the desk: one in-process vLLM (``local``, the default) or a remote
OpenAI-compatible server (``remote``: normally a router in front of ``vllm serve`` replicas).

Only this package imports vLLM, and only its ``local`` and ``monitor`` modules and the model plugins
of ``models`` do. Everything above
it speaks the types of ``app.engine.types``.
"""

from __future__ import annotations

import os
from pathlib import Path

from app.engine.residency import CacheBranch, KVEventStats, ResidencyMatch, ResidencyMirror
from app.engine.types import (CacheSnapshot, Delta, Engine, EngineBusy, EngineError, EngineInfo, EngineRejected,
                              EngineStartError, Health, ReplicaView, RequestStats, Residency)
from app.settings import Settings

__all__ = [
    "CacheBranch", "CacheSnapshot", "Delta", "Engine", "EngineBusy", "EngineError", "EngineInfo", "EngineRejected",
    "EngineStartError", "Health", "KVEventStats", "ReplicaView", "RequestStats", "Residency", "ResidencyMatch", "ResidencyMirror",
    "build_engine", "resolve_model_path", "resolve_tokenizer",
]


def resolve_model_path(settings: Settings) -> Path | str:
    """The model (folder or hub id) the engine serves and whose tokenizer builds the prompts."""
    from app.engine.local import resolve_model_path as resolve

    return resolve(settings)


def resolve_tokenizer(settings: Settings, model_path: Path | str) -> str:
    """The tokenizer of ``model_path``: PREFIXDESK_TOKENIZER, a converted one (Baichuan2), or the model's own.

    Raises EngineStartError when a Baichuan folder's tokenizer cannot be converted.
    """
    from app.engine.models import resolve_tokenizer as resolve

    return resolve(settings.tokenizer, model_path, settings.data_dir)


def build_engine(settings: Settings, model_path: Path | str | None = None) -> Engine:
    """Start the process's engine for ``settings``; raises EngineStartError with what to fix."""
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    if settings.engine == "remote":
        from app.engine.remote import RemoteEngine

        return RemoteEngine.connect(settings, model_path or resolve_model_path(settings))
    from app.engine.local import LocalEngine

    return LocalEngine(settings, model_path or resolve_model_path(settings))
