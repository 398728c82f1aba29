"""The Cache tab (live cache view). Placeholder until the cache view lands."""

from __future__ import annotations

from collections.abc import Callable

import gradio as gr


def build_cache_tab(services, *, require_operator: Callable[[gr.Request | None], str]) -> None:
    """Render the cache view inside the console's Blocks; every handler calls ``require_operator``."""
    gr.Markdown("The live cache view is not built yet.")
