"""Raw calls to Gradio's public queue, as any browser (or attacker) can make them.

A Gradio session hash belongs to the cookie that first named it (app/web/sessions.py), and only a cookie a
page load handed out may name one, so a caller loads the page (or /config) first and keeps its cookies
across the join and the stream, as a browser does: one ``httpx.Client`` per caller.
"""

from __future__ import annotations

import json
import uuid

import httpx


def config(url: str) -> dict:
    return httpx.get(url + "config", timeout=30).json()


def dependency(cfg: dict, api_name: str) -> dict:
    return next(d for d in cfg["dependencies"] if d.get("api_name") == api_name)


def join(client: httpx.Client, url: str, dep: dict, data: list, session_hash: str) -> httpx.Response:
    """Queue ``dep``'s event in the session ``session_hash``; the response of the join itself. A client without
    the page's cookie loads the page's config first, as a browser loads the page."""
    if "pd_browser" not in client.cookies:
        client.get(url + "config")
    body = {"data": data, "fn_index": dep["id"], "trigger_id": (dep.get("targets") or [[None]])[0][0],
            "session_hash": session_hash, "event_data": None}
    return client.post(url + "gradio_api/queue/join", json=body)


def stream(client: httpx.Client, url: str, session_hash: str) -> list[dict]:
    """The messages of the session's queue stream, up to its event's end; [{"msg": "refused", ...}] on a refusal."""
    messages = []
    with client.stream("GET", url + "gradio_api/queue/data", params={"session_hash": session_hash}) as r:
        if r.status_code != 200:
            r.read()
            return [{"msg": "refused", "status": r.status_code, "body": r.json()}]
        for line in r.iter_lines():
            if not line.startswith("data:"):
                continue
            message = json.loads(line[5:])
            messages.append(message)
            if message.get("msg") in ("process_completed", "close_stream", "unexpected_error"):
                break
    return messages


def run(client: httpx.Client, url: str, dep: dict, data: list, session_hash: str) -> list[dict]:
    """Join and read the stream to the event's end: every message it streams."""
    joined = join(client, url, dep, data, session_hash)
    if joined.status_code != 200:
        return [{"msg": "join_refused", "status": joined.status_code, "body": joined.text}]
    return stream(client, url, session_hash)


def output(messages: list[dict]) -> list:
    """The data of the event's last output."""
    return next(m for m in reversed(messages) if m.get("msg") == "process_completed")["output"]["data"]


def call_event(url: str, fn_index: int, data: list, *, trigger_id: int | None = None, timeout: float = 60,
               headers: dict | None = None, cookies: dict | None = None) -> list[dict]:
    """Join Gradio's queue for event ``fn_index`` as any browser can (a fresh browser: its own cookie jar and
    session), and return every message it streams."""
    dep = {"id": fn_index, "targets": [[trigger_id]]}
    with httpx.Client(timeout=timeout, headers=headers, cookies=cookies) as client:
        return run(client, url, dep, data, uuid.uuid4().hex)
