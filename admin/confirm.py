"""The console's "are you sure?" for a button that cannot be taken back (the cache reset, the re-warm): the
button shows a row with the question, a yes and a cancel; cancel hides it again and clears the status line."""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from admin.access import AdminAccess


@dataclass(frozen=True)
class Confirm:
    """The dialog's parts: the caller wires ``yes`` to its action, whose outputs are ``[row, status]``."""

    row: gr.Row
    yes: gr.Button
    cancel: gr.Button
    status: gr.Markdown

    def wire(self, access: AdminAccess, ask: gr.Button) -> None:
        """``ask`` shows the question and cancel hides it, each for a logged-in operator only."""

        async def show(request: gr.Request):
            await access.require(request)
            return gr.update(visible=True)

        async def hide(request: gr.Request):
            await access.require(request)
            return gr.update(visible=False), ""

        ask.click(show, None, self.row, api_visibility="private")
        self.cancel.click(hide, None, [self.row, self.status], api_visibility="private")


def confirm_dialog(t: dict, *, question: str, elem_id: str, status_id: str) -> Confirm:
    """Lays out the hidden question row (``{elem_id}-confirm`` and ``{elem_id}-cancel`` its buttons) and the
    status line (``status_id``) where the caller's layout is; ``Confirm.wire`` then connects them."""
    with gr.Row(visible=False) as row:
        gr.Markdown(question)
        yes = gr.Button(t["reset_yes"], variant="stop", size="sm", elem_id=f"{elem_id}-confirm")
        cancel = gr.Button(t["cancel"], size="sm", elem_id=f"{elem_id}-cancel")
    status = gr.Markdown(elem_id=status_id)
    return Confirm(row, yes, cancel, status)
