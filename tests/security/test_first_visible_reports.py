"""Attack: the page's private report of when an answer's first text reached the screen (app/chat/static/chat.js).

It is public input like any other: a browser could send any value for any conversation. Only a whole number of
milliseconds from 1 to 600,000, for the sender's own conversation's last answer, not reported before and no sooner
than the engine's first token of it, is stored; a forged value, another browser's conversation or a second report
stores nothing and shows no error."""

from __future__ import annotations

import math
import uuid

import httpx
import sqlite_utils

from tests.helpers.attack import config, dependency, output, run


def predict(client: httpx.Client, url: str, dep: dict, data: list, session: str) -> httpx.Response:
    """An event outside the queue (run/predict), as the page sends it."""
    return client.post(url + "gradio_api/run/predict", json={
        "data": data, "fn_index": dep["id"], "trigger_id": dep["targets"][0][0], "session_hash": session,
        "event_data": None})


def test_only_a_plausible_report_of_ones_own_last_answer_is_kept(server_url, settings):
    db = sqlite_utils.Database(settings.database_url.removeprefix("sqlite:///"))
    cfg = config(server_url)
    load, send, report = (dependency(cfg, name) for name in ("on_load", "send", "report_first_visible"))
    owner, stranger = httpx.Client(timeout=120), httpx.Client(timeout=120)
    for client in (owner, stranger):
        assert client.get(server_url).status_code == 200
    session, other = uuid.uuid4().hex, uuid.uuid4().hex
    key = output(run(owner, server_url, load, ["", None], session))[0]
    foreign_key = output(run(stranger, server_url, load, ["", None], other))[0]
    question = f"发票 {uuid.uuid4().hex[:8]}"
    answered = output(run(owner, server_url, send, [question, "电商客服", None, key, None], session))
    conversation_id = answered[2]
    shown = answered[1]
    (answer,) = db.query("select id, first_visible_ms, ttft_ms from messages where conversation_id = ? "
                         "and role = 'assistant'", [conversation_id])
    assert answer["first_visible_ms"] is None

    # (The box's own preprocessing makes text of a number, so 12 and " 12" are a plausible "12": not forged.)
    forged = ["-5", "0", "600001", "1e3", "12.5", "１２", "NaN", "0x10", None, True, ["12"], {"ms": 12}, "9" * 50,
              str(math.ceil(answer["ttft_ms"]) - 1)]  # before the engine's first token: no page can have seen it
    for value in forged:
        r = predict(owner, server_url, report, [value, conversation_id, key, shown], session)
        assert r.status_code in (200, 422), (value, r.status_code, r.text[:200])
    r = predict(stranger, server_url, report, ["800", conversation_id, foreign_key, shown], other)
    assert r.status_code == 200
    assert db["messages"].get(answer["id"])["first_visible_ms"] is None  # nothing forged, nothing foreign kept

    r = predict(owner, server_url, report, ["951", conversation_id, key, shown], session)
    assert r.status_code == 200
    assert db["messages"].get(answer["id"])["first_visible_ms"] == 951.0
    reloaded = output(run(owner, server_url, load, [key, conversation_id], session))[3]  # the chatbot, stored
    messages = reloaded["value"] if isinstance(reloaded, dict) else reloaded
    assert messages[-1]["metadata"]["title"].startswith("1.0 秒内开始回复")
    predict(owner, server_url, report, ["20", conversation_id, key, shown], session)  # the first report counts
    assert db["messages"].get(answer["id"])["first_visible_ms"] == 951.0
