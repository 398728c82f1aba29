"""Gradio's per-session state, without the copies it keeps for deep links.

For every session Gradio keeps, besides the ``gr.State`` values the app asked for, a snapshot of
every component's config and the last value every input was sent with — for
``/gradio_api/deep_link``, which the app does not serve. That snapshot held whatever a script
sent, refused or not, for as long as the session lived (up to 10,000 sessions): 200 refused
messages of 900 KB kept 197 MB; and building it cost every new session a config of every component.
Here each session keeps only what the app's handlers use, and builds nothing it does not keep.
"""

from __future__ import annotations

import os
from copy import copy
from typing import Any

import gradio as gr
from fastapi import FastAPI
from gradio.state_holder import SessionState, StateHolder
from starlette.routing import Mount


def keep_no_snapshots(app: FastAPI, blocks: gr.Blocks) -> None:
    """Give ``blocks``, mounted on ``app``, sessions that keep no deep-link snapshot (call after mounting)."""
    mounted = next(r.app for r in app.routes if isinstance(r, Mount) and getattr(r.app, "blocks", None) is blocks)
    holder = _StateHolder()
    mounted.state_holder = holder
    holder.set_blocks(blocks)  # sets blocks.state_holder too: the queue and the routes use the same one


class _Session(SessionState):
    def __init__(self, blocks: gr.Blocks):
        # SessionState.__init__ builds the deep-link snapshot of every component's config for each new session
        # (the GPU profile's SessionState.__init__ and config_for_block): its other fields, without it.
        self.blocks_config = copy(blocks.default_config)
        self.config_values = {}
        self.state_data: dict[int, Any] = {}
        self._state_ttl = {}
        self.is_closed = False
        self.STATE_TTL_WHEN_CLOSED = 1 if os.getenv("GRADIO_IS_E2E_TEST", None) else 3600

    def __setitem__(self, key: int, value: Any) -> None:
        super().__setitem__(key, value)
        self.config_values.pop(key, None)

    def _update_config(self, key: int) -> None:
        pass

    def _update_value_in_config(self, key: int, value: Any) -> None:
        pass


class _StateHolder(StateHolder):
    def __getitem__(self, session_id: str) -> SessionState:
        if session_id not in self.session_data:
            self.session_data[session_id] = _Session(self.blocks)
        return super().__getitem__(session_id)
