"""The queue's check answers only an operator: a page whose session ended (or a request with none, or a forged
cookie) gets nothing of the queue — no count, no ids — and no error for its timer to show every few seconds."""

import json

import gradio as gr

from admin.access import SESSION_COOKIE
from admin.queue_ui import build_queue
from tests.helpers.servers import operator

SKIP = {"__type__": "update"}  # gr.skip(): the page keeps what it shows


class Caller:
    def __init__(self, token: str):
        self.cookies = {SESSION_COOKIE: token}


def test_a_check_reads_the_queue_only_for_a_live_session(console, services, aio):
    with gr.Blocks():
        check, outputs, _ = build_queue(console)
    assert len(outputs) == 2
    name, password = operator(services, "op-queue-check", "queue check passphrase 3")
    token, _ = aio(console.access.login(name=name, password=password, client="192.0.2.70"))
    line, data = aio(check(Caller(token)))
    payload = json.loads(data)
    assert (payload["operator"], type(payload["count"]), type(line)) == (name, int, str)
    aio(console.access.logout(token))
    for request in (None, Caller(token), Caller("forged" * 8), Caller("")):
        assert aio(check(request)) == (SKIP, SKIP)
