"""Attack: the reloaded page's follow of an answer still being written (answers.follow, a timer's event outside the
queue). It is public input like any other: only a key this server issued, for a conversation of that browser's,
reads anything; a forged key, another browser's conversation or a value of the wrong type reads nothing of it."""

from __future__ import annotations

import json
import uuid

import httpx

from tests.helpers.attack import config, dependency, output, run


def predict(client: httpx.Client, url: str, dep: dict, data: list, session: str) -> httpx.Response:
    return client.post(url + "gradio_api/run/predict", json={
        "data": data, "fn_index": dep["id"], "trigger_id": dep["targets"][0][0], "session_hash": session,
        "event_data": None})


def test_only_the_owner_follows_a_conversation_and_bad_values_read_nothing(server_url):
    cfg = config(server_url)
    load, send, follow = (dependency(cfg, name) for name in ("on_load", "send", "follow"))
    owner, stranger = httpx.Client(timeout=120), httpx.Client(timeout=120)
    for client in (owner, stranger):
        assert client.get(server_url).status_code == 200
    session, other = uuid.uuid4().hex, uuid.uuid4().hex
    key = output(run(owner, server_url, load, ["", None], session))[0]
    foreign_key = output(run(stranger, server_url, load, ["", None], other))[0]
    question = f"退货 {uuid.uuid4().hex[:8]}"
    conversation_id = output(run(owner, server_url, send, [question, "电商客服", None, key, None], session))[2]

    # The owner, once the answer is stored: the conversation, and the timer stopped.
    r = predict(owner, server_url, follow, [conversation_id, key, None], session)
    assert r.status_code == 200 and question in json.dumps(r.json(), ensure_ascii=False)
    # A stranger with its own key, a forged key, values of the wrong type: nothing of the conversation.
    for data in ([conversation_id, foreign_key, None], [conversation_id, "b.forged.key", None],
                 [str(conversation_id), key, None], [True, key, None], [conversation_id, ["k"], None],
                 [-1, key, None], [2**63, key, None]):
        r = predict(stranger, server_url, follow, data, other)
        assert r.status_code in (200, 422), (data, r.status_code)
        assert question not in json.dumps(r.json(), ensure_ascii=False), data
