"""Gradio's per-session state, without the copies it keeps for deep links.

For every session Gradio keeps, besides the ``gr.State`` values the app asked for, a snapshot of
every component's config and the last value every input was sent with — for
``/gradio_api/deep_link``, which the app does not serve. That snapshot held whatever a script
sent, refused or not, for as long as the session lived (up to 10,000 sessions): 200 refused
messages of 900 KB kept 197 MB; and building it cost every new session a config of every component.
Here each session keeps only what the app's handlers use, and builds nothing it does not keep.

A session's state also dies with its page. Gradio keeps a closed session's state for an hour, so that
a page could come back to it; but its hash travels in URLs (proxy logs), and whoever took the hash
over after the page closed would have run events with that state (the conversation the page showed).
When a session's page is closed (it said so, or nothing was heard of it for PREFIXDESK_PAGE_GONE_S:
app/web/sessions.py) its state is dropped, and nothing is kept for it afterwards by an event still running: a
page that comes back starts on empty state, and the chat's handlers take its conversation from the store again,
as after a restart.
"""

from __future__ import annotations

from copy import copy, deepcopy
from pathlib import Path
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


# The pages' script that says they are alive (app/web/sessions.py), for each Gradio app's head.
PAGE_LIFE_HEAD = f"<script>{(Path(__file__).with_name('static') / 'page_life.js').read_text(encoding='utf-8')}</script>"


def no_heartbeat_stream(blocks: gr.Blocks) -> None:
    """``blocks``' pages open no heartbeat stream (PAGE_LIFE_HEAD says they are alive instead): Gradio opens one
    per page, wherever its config says it must, and six held every connection an HTTP/1.1 browser gives a host."""
    set_in_config(blocks, connect_heartbeat=False)


def set_in_config(blocks: gr.Blocks, **values) -> None:
    """``values`` set in every config ``blocks`` build from now on (call before mounting)."""
    config_file = blocks.get_config_file

    def with_values():
        return config_file() | values

    blocks.get_config_file = with_values
    blocks.config = with_values()


def end_session(blocks: gr.Blocks, session_hash: str) -> None:
    """The page of ``session_hash`` was closed (app/web/sessions.py): its state goes now, an event of it still
    running keeps nothing, and a page that comes back under the hash starts a session of its own."""
    holder = blocks.state_holder
    session = holder.session_data.pop(session_hash, None) if holder is not None else None
    if session is not None:
        session.is_closed = True


class _Session(SessionState):
    def __init__(self, blocks: gr.Blocks):
        # SessionState.__init__ builds the deep-link snapshot of every component's config for each new session
        # (the GPU profile's SessionState.__init__ and config_for_block): its other fields, without it.
        self.blocks_config = copy(blocks.default_config)
        self.config_values = {}
        self.state_data: dict[int, Any] = {}
        self._state_ttl = {}
        self._closed = False
        self.STATE_TTL_WHEN_CLOSED = 0

    @property
    def is_closed(self) -> bool:
        return self._closed

    @is_closed.setter
    def is_closed(self, closed: bool) -> None:
        # Gradio sets it when the session's heartbeat ends (gradio/routes.py, heartbeat): the state goes now.
        self._closed = closed
        if closed:
            self.state_data.clear()
            self._state_ttl.clear()

    def __getitem__(self, key: int) -> Any:
        block = self.blocks_config.blocks[key]
        if self._closed and block.stateful and key not in self.state_data:  # its initial value, not kept either
            value = getattr(block, "value", None)
            return deepcopy(value() if callable(value) else value)
        return super().__getitem__(key)

    def __setitem__(self, key: int, value: Any) -> None:
        if self._closed:  # an event still running when its page closed keeps nothing
            return
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
