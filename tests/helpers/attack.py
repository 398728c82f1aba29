"""Raw calls to Gradio's public queue, as any browser (or attacker) can make them."""

from __future__ import annotations

import json
import uuid

import httpx


def config(url: str) -> dict:
    return httpx.get(url + "config", timeout=30).json()


def call_event(url: str, fn_index: int, data: list, *, trigger_id: int | None = None, timeout: float = 60,
               headers: dict | None = None, cookies: dict | None = None) -> list[dict]:
    """Join Gradio's queue for event ``fn_index`` as any browser can, and return every message it streams."""
    session = uuid.uuid4().hex
    body = {"data": data, "fn_index": fn_index, "trigger_id": trigger_id, "session_hash": session,
            "event_data": None}
    joined = httpx.post(url + "gradio_api/queue/join", json=body, timeout=timeout, headers=headers, cookies=cookies)
    if joined.status_code != 200:
        return [{"msg": "join_refused", "status": joined.status_code, "body": joined.text}]
    messages = []
    with httpx.stream("GET", url + "gradio_api/queue/data", params={"session_hash": session},
                      timeout=timeout, cookies=cookies) as r:
        for line in r.iter_lines():
            if not line.startswith("data:"):
                continue
            message = json.loads(line[5:])
            messages.append(message)
            if message.get("msg") in ("process_completed", "close_stream", "unexpected_error"):
                break
    return messages
