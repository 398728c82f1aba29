"""Built-in model names that stand for a folder the app prepares under the data dir.

``python -m app.engine.models.fetch ALIAS`` (``make demo-model``) prepares the folder and writes
``MARKER_NAME`` into it last, so a folder without the marker is a conversion that never finished.
The names themselves are declared with the settings (``BUILT_IN_MODELS``), which accept them.
"""

from __future__ import annotations

from pathlib import Path

from app.settings import BUILT_IN_MODELS

# alias -> folder under data_dir/models
ALIASES = {name: name for name in BUILT_IN_MODELS}

# Written by app.engine.models.fetch when a model folder is complete: JSON with the source's sha256.
MARKER_NAME = "prefixdesk-prepared.json"


class ModelNotPrepared(FileNotFoundError):
    """An alias names a model folder that has not been prepared (or was left half-done)."""


def alias_folder(model: str, data_dir: Path) -> Path:
    """The folder under ``data_dir`` that alias ``model`` stands for; KeyError if it is no alias."""
    return Path(data_dir) / "models" / ALIASES[model]


def resolve_alias(model: str, data_dir: Path) -> str:
    """The prepared folder an alias names, or ``model`` unchanged when it is no alias.

    Raises ModelNotPrepared, saying which command prepares it, when the folder or its marker is missing.
    """
    if model not in ALIASES:
        return model
    folder = alias_folder(model, data_dir)
    if not (folder / MARKER_NAME).is_file():
        raise ModelNotPrepared(
            f"model {model!r} is not prepared: {folder} has no {MARKER_NAME}. Run `make demo-model` "
            f"(or `.venv/bin/python -m app.engine.models.fetch {model} --data-dir {data_dir}`) once, then start again"
        )
    return str(folder)
