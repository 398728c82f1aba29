"""Built-in model names that stand for a folder the app prepares under the data dir."""

from __future__ import annotations

from pathlib import Path

# alias -> folder under data_dir/models
ALIASES = {"qwen2.5-0.5b-demo": "qwen2.5-0.5b-demo"}


def resolve_alias(model: str, data_dir: Path) -> str:
    """The folder an alias names (it must have been prepared), or ``model`` unchanged."""
    if model not in ALIASES:
        return model
    return str(Path(data_dir) / "models" / ALIASES[model])
