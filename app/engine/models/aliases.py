"""Built-in model names that stand for a folder the app prepares under the data dir.

``python -m app.engine.models.fetch ALIAS`` (``make demo-model``) prepares the folder and writes
``MARKER_NAME`` into it last, so a folder without the marker is a conversion that never finished.
The names themselves are declared with the settings (``BUILT_IN_MODELS``), which accept them.
"""

from __future__ import annotations

import os
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


# Where `make demo-model` prepares models: the default data dir of the project's own checkout. A server started with
# another PREFIXDESK_DATA_DIR finds them there too, rather than asking for a download already made.
PROJECT_DATA_DIR = Path(__file__).resolve().parents[3] / "var"


def resolve_alias(model: str, data_dir: Path, *, also: tuple[Path, ...] = (PROJECT_DATA_DIR,)) -> str:
    """The prepared folder an alias names, under ``data_dir`` or else under one of ``also``, or ``model`` unchanged
    when it is no alias.

    Raises ModelNotPrepared, saying where it looked and which command prepares it, when no folder with its marker is
    found.
    """
    if model not in ALIASES:
        return model
    folders = list(dict.fromkeys(Path(os.path.abspath(alias_folder(model, d))) for d in (Path(data_dir), *also)))
    for folder in folders:
        if (folder / MARKER_NAME).is_file():
            return str(folder)
    where = (f"neither {' nor '.join(str(f) for f in folders)} has {MARKER_NAME}" if len(folders) > 1
             else f"{folders[0]} has no {MARKER_NAME}")
    raise ModelNotPrepared(
        f"model {model!r} is not prepared: {where}. Prepare it with `.venv/bin/python -m app.engine.models.fetch "
        f"{model} --data-dir {data_dir}` (`make demo-model` prepares it under {PROJECT_DATA_DIR}), then start again"
    )
