"""Attack: forge lines in the server's log with control characters in what a client sends.

Before: a newline in a value that reached a log line — the path a FileData value names, a request
path, a header — started a line of the attacker's own in the log (a fake ERROR, a fake login).
After: the server's log formatter writes every record's message with control characters escaped
(``\\n``, ``\\r``, ``\\x1b`` …; one helper, app/log_text.py), our own lines pass client values
through the same helper, and the chat refuses a file-shaped value before Gradio reads it, so no
traceback names it either.
"""

from __future__ import annotations

import httpx

from tests.helpers.attack import call_event, config

FORGED = "\r\n2026-12-01 09:00:00,000 ERROR admin.access: operator admin logged in from 10.0.0.1"


def new_lines(edge, action) -> list[str]:
    return edge.lines_logged_by(action)


def test_a_path_with_newlines_is_one_log_line(edge):
    lines = new_lines(edge, lambda: httpx.get(edge.url + "gradio_api/x%0d%0a2026-12-01%2009:00:00,000%20ERROR"
                                              "%20admin.access:%20operator%20admin%20logged%20in"))
    assert len(lines) == 1, lines
    assert "/gradio_api/x\\r\\n2026-12-01 09:00:00,000 ERROR admin.access: operator admin logged in" in lines[0]


def test_a_file_path_with_newlines_in_a_chat_event_forges_no_line(edge):
    cfg = config(edge.url)
    [index] = [i for i, d in enumerate(cfg["dependencies"]) if d.get("api_name") == "chat"]
    dep = cfg["dependencies"][index]
    value = {"path": "/tmp/x" + FORGED, "orig_name": "a.txt", "meta": {"_type": "gradio.FileData"}}
    messages: list = []
    lines = new_lines(edge, lambda: messages.extend(call_event(edge.url, dep.get("id", index),
                                                               [value, None, "电商客服", None, None],
                                                               trigger_id=(dep["targets"] or [[None]])[0][0])))
    assert [line for line in lines if line.startswith("2026-12-01 09:00:00")] == []
    assert messages == [{"msg": "join_refused", "status": 400,
                         "body": '{"detail":"This chat accepts no files: send your question as text."}'}]
    assert len(lines) <= 1, lines

