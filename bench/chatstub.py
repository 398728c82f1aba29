"""A server that speaks the chat page's Gradio queue protocol with canned answers: the load generator's
yardstick (``python -m bench.chatload --self-check``), never a stand-in for the product.

It serves what ``bench.chatpage`` reads, shaped as Gradio 6 sends it (app/chat/page.py's events, seen on
the wire): ``/config`` with a page-load event and the message box's submit event; ``queue/join``; and
per session the SSE ``queue/data`` stream — estimation, process_starts, then for the send event a first
``process_generating`` with the whole chatbot value, diffs appending the answer ``updates`` times
``interval_ms`` apart, the caption, ``process_completed`` with the whole value, and ``close_stream``;
then the sidebar's refresh, chained after the send outside the queue (``run/predict``).
It does no other work, so whatever lags is the client.

    python -m bench.chatstub --port 7999 --updates 20 --interval-ms 50
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
import urllib.request
import uuid

TEMPLATE = "电商客服"
CACHED_TOKENS, PROMPT_TOKENS, ENGINE_TTFT_MS = 1056, 1065, 13
CHUNK = "您好，退货请在订单页申请。"
CAPTION_TITLE = f"⚡ {ENGINE_TTFT_MS} 毫秒开始回答 · 客服手册已在缓存中"
CAPTION = (f"缓存命中 {CACHED_TOKENS} / {PROMPT_TOKENS} 个提示 token · 引擎首 token {ENGINE_TTFT_MS} ms · "
           f"浏览器首字 <span class=\"pd-glyph\">—</span> ms · 300 token/s")
# Component ids and the two events, as the chat page declares them (types and order of inputs/outputs).
COMPONENTS = [(1, "textbox", "message"), (2, "dropdown", "template"), (3, "state", None), (4, "browserstate", None),
              (5, "state", None), (6, "chatbot", "chatbot"), (7, "radio", "conversations"), (0, "form", None)]
SEND = {"id": 0, "targets": [[1, "submit"]], "inputs": [1, 2, 3, 4, 5], "outputs": [6, 5, 3, 4, 7, 1]}
LOAD = {"id": 1, "targets": [[0, "load"]], "inputs": [4], "outputs": [4, 2, 7]}
SIDEBAR = {"id": 2, "targets": [[None, "then"]], "inputs": [4], "outputs": [7], "queue": False, "trigger_after": 0}


def answer(updates: int) -> str:
    """The canned answer: ``updates`` chunks."""
    return CHUNK * updates


def config() -> dict:
    return {"components": [{"id": i, "type": kind, "props": {"elem_id": elem} if elem else {}}
                           for i, kind, elem in COMPONENTS],
            "dependencies": [dict(SEND, api_visibility="private"), dict(LOAD, api_visibility="private"),
                             dict(SIDEBAR, api_visibility="private")]}


def _message(text: str, title: str | None = None, role: str = "assistant") -> dict:
    return {"role": role, "metadata": {"title": title, "status": "done"} if title else None,
            "content": [{"text": text, "type": "text"}], "options": None}


def _data(msg: str, event_id: str, **fields) -> bytes:
    return b"data: " + json.dumps({"msg": msg, "event_id": event_id, **fields}, ensure_ascii=False).encode() + b"\n\n"


async def _load_event(session_hash: str, event_id: str, queue: asyncio.Queue) -> None:
    key = uuid.uuid4().hex
    await queue.put(_data("estimation", event_id, rank=0, queue_size=1, rank_eta=0.0))
    await queue.put(_data("process_starts", event_id, eta=0.0))
    out = [key, {"choices": [[TEMPLATE, TEMPLATE]], "value": TEMPLATE, "__type__": "update"},
           {"choices": [], "label": "还没有历史对话", "value": None, "__type__": "update"}]
    await queue.put(_data("process_completed", event_id, output={"data": out, "is_generating": False}, success=True))
    await queue.put(None)


async def _send_event(data: list, event_id: str, queue: asyncio.Queue, updates: int, interval_s: float) -> None:
    question, key = data[0], data[3]
    skip = {"__type__": "update"}
    await queue.put(_data("estimation", event_id, rank=0, queue_size=1, rank_eta=0.0))
    await queue.put(_data("process_starts", event_id, eta=0.0))

    def generating(chatbot) -> bytes:
        return _data("process_generating", event_id, output={"data": [chatbot, [], [], [], [], []],
                                                             "is_generating": True}, success=True)

    user = _message(question, role="user")
    await queue.put(_data("process_generating", event_id, output={"data": [[user], None, None, key, skip, ""],
                                                                   "is_generating": True}, success=True))
    for i in range(updates):
        await asyncio.sleep(interval_s)
        if i == 0:
            await queue.put(generating([["add", [1], _message(CHUNK)]]))
        else:
            await queue.put(generating([["append", [1, "content", 0, "text"], CHUNK]]))
    await queue.put(generating([["add", [2], _message(CAPTION, CAPTION_TITLE)]]))
    final = [user, _message(answer(updates)), _message(CAPTION, CAPTION_TITLE)]
    await queue.put(_data("process_completed", event_id, output={"data": [final, None, None, key, skip, skip],
                                                                  "is_generating": False}, success=True))
    await queue.put(None)


def build_app(*, updates: int, interval_ms: float):
    from aiohttp import web

    sessions: dict[str, asyncio.Queue] = {}
    tasks: set[asyncio.Task] = set()

    async def get_config(_request):
        return web.json_response(config())

    async def join(request):
        body = await request.json()
        session_hash, event_id = body["session_hash"], uuid.uuid4().hex
        queue = sessions.setdefault(session_hash, asyncio.Queue())
        if body["fn_index"] == LOAD["id"]:
            job = _load_event(session_hash, event_id, queue)
        elif body["fn_index"] == SEND["id"]:
            job = _send_event(body["data"], event_id, queue, updates, interval_ms / 1000)
        else:
            return web.json_response({"detail": "no such event"}, status=400)
        task = asyncio.ensure_future(job)
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return web.json_response({"event_id": event_id})

    async def predict(request):
        body = await request.json()
        if body["fn_index"] != SIDEBAR["id"]:
            return web.json_response({"detail": "no such event"}, status=400)
        choices = [[f"12-01 10:12 · {uuid.uuid4().hex[:6]}", 1]]
        return web.json_response({"data": [{"choices": choices, "value": None, "__type__": "update"}],
                                  "is_generating": False})

    async def data(request):
        session_hash = request.query.get("session_hash", "")
        queue = sessions.get(session_hash)
        if queue is None:
            return web.json_response({"detail": "Not Found"}, status=404)
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        while (chunk := await queue.get()) is not None:
            await response.write(chunk)
        sessions.pop(session_hash, None)
        await response.write(_data("close_stream", None))
        await response.write_eof()
        return response

    app = web.Application()
    app.add_routes([web.get("/config", get_config), web.post("/gradio_api/queue/join", join),
                    web.get("/gradio_api/queue/data", data), web.post("/gradio_api/run/predict", predict)])
    return app


def start_process(port: int, *, updates: int, interval_ms: float) -> subprocess.Popen:
    """This stub in a process of its own (and process group of this session's), serving on ``port``."""
    return subprocess.Popen([sys.executable, "-m", "bench.chatstub", "--port", str(port), "--updates", str(updates),
                             "--interval-ms", str(interval_ms)], process_group=0)


def wait_serving(url: str, proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the chat stub exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "config", timeout=2):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"the chat stub did not serve {url} within {timeout_s:.0f} s")


def main(argv: list[str]) -> int:
    from aiohttp import web

    from bench.clients import run_loop

    p = argparse.ArgumentParser(prog="python -m bench.chatstub", description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--updates", type=int, default=20)
    p.add_argument("--interval-ms", type=float, default=50.0)
    args = p.parse_args(argv)

    async def serve() -> None:
        runner = web.AppRunner(build_app(updates=args.updates, interval_ms=args.interval_ms), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", args.port, backlog=4096).start()
        await asyncio.Event().wait()

    run_loop(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
