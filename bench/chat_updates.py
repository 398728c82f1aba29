"""``python -m bench.chat_updates``: what one streamed chat update costs the server in Gradio itself.

A Blocks app of the chat's own components (chatbot, message box, template picker, session key, the
server-side states and the sidebar) with one streaming event per way of sending an update, served by
uvicorn in a process of its own; a client joins each event's queue and reads its SSE stream to the
end. The events yield ``--updates`` updates as fast as Gradio takes them, so the server's CPU time
(its own threads, from /proc) over the stream, divided by the updates, is Gradio's cost per update:

* ``skips``: the chat before (app/chat/page.py): six outputs, the five besides the chatbot skipped
  with ``gr.skip()``, messages as ``{"role", "content"}`` that Gradio postprocesses;
* ``values``: four outputs (chatbot, two states skipped, the session key's value), messages
  already in the chatbot's format, Gradio's postprocessing off: the chat now.

    python -m bench.chat_updates --updates 2000 --history 0,40
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid

WAYS = ("skips", "values")


def build(history: int):
    """The app: one event per way, on the chat's components."""
    import gradio as gr

    from app.chat.render import _message

    def logical(i: int) -> list[dict]:
        old = [{"role": "user" if j % 2 == 0 else "assistant", "content": "历史消息" * 20} for j in range(history)]
        return old + [{"role": "user", "content": "退货怎么办？"}, {"role": "assistant", "content": "好的" * (i + 1)}]

    wire_history = [_message(m["role"], m["content"]) for m in logical(0)[:-1]]

    with gr.Blocks() as demo:
        key = gr.BrowserState("")
        conversation = gr.State(None)
        shown = gr.State([])
        conversations = gr.Radio([], label="history")
        template = gr.Dropdown(["电商客服"], value="电商客服")
        chatbot = gr.Chatbot()
        box = gr.Textbox()
        count = gr.Number(visible=False)

        async def skips(n):
            for i in range(int(n)):
                yield logical(i), gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()

        async def values(n):
            for i in range(int(n)):
                yield wire_history + [_message("assistant", "好的" * (i + 1))], gr.skip(), gr.skip(), "k" * 32

        private = {"api_visibility": "private", "show_progress": "hidden", "concurrency_limit": None}
        count.change(skips, [count], [chatbot, shown, conversation, key, conversations, box], api_name="skips",
                     **private)
        count.change(values, [count], [chatbot, shown, conversation, key], api_name="values", postprocess=False,
                     **private)
        del template
    demo.queue(default_concurrency_limit=None)
    return demo


def serve(port: int, history: int) -> None:
    import uvicorn
    from fastapi import FastAPI

    import gradio as gr

    app = gr.mount_gradio_app(FastAPI(), build(history), path="", ssr_mode=False)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def cpu_s(pid: int) -> float:
    """The process's own user + system CPU seconds (children not included)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stream(url: str, fn_index: int, n: int) -> tuple[int, int]:
    """Join event ``fn_index`` with ``n`` and read its stream to the end: (updates, bytes)."""
    import httpx

    session = uuid.uuid4().hex[:11]
    httpx.post(url + "gradio_api/queue/join", json={"data": [n], "event_data": None, "fn_index": fn_index,
                                                     "trigger_id": None, "session_hash": session}).raise_for_status()
    updates = size = 0
    with httpx.stream("GET", url + "gradio_api/queue/data", params={"session_hash": session}, timeout=600) as r:
        for line in r.iter_lines():
            size += len(line)
            if '"process_generating"' in line:
                updates += 1
            if '"close_stream"' in line:
                break
    return updates, size


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.chat_updates", description=__doc__.split("\n\n")[0])
    p.add_argument("--updates", type=int, default=2000, help="updates per stream")
    p.add_argument("--history", default="0,40", help="comma list: earlier messages in the conversation")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # internal: serve on this port
    p.add_argument("--serve-history", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        serve(args.serve, args.serve_history)
        return 0
    import httpx

    from bench.servers import free_port

    results = []
    for history in (int(h) for h in args.history.split(",")):
        port = free_port()
        env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False")
        server = subprocess.Popen([sys.executable, "-m", "bench.chat_updates", "--serve", str(port),
                                   "--serve-history", str(history)], env=env, process_group=0)
        try:
            url = f"http://127.0.0.1:{port}/"
            for _ in range(600):
                try:
                    config = httpx.get(url + "config", timeout=2).json()
                    break
                except httpx.HTTPError:
                    time.sleep(0.1)
            index = {d.get("api_name"): d["id"] for d in config["dependencies"]}
            stream(url, index["values"], 50)  # first calls load code: not measured
            stream(url, index["skips"], 50)
            for _ in range(args.repeats):
                for way in WAYS:
                    before, started = cpu_s(server.pid), time.perf_counter()
                    updates, size = stream(url, index[way], args.updates)
                    cpu, wall = cpu_s(server.pid) - before, time.perf_counter() - started
                    results.append({"way": way, "history": history, "updates": updates, "cpu_s": cpu, "wall_s": wall,
                                    "cpu_us_per_update": cpu / updates * 1e6, "bytes_per_update": size / updates})
                    print(f"{way:<7} history {history:>3}: {updates} updates, server CPU {cpu * 1e6 / updates:7.0f} us "
                          f"per update ({updates / wall:5.0f} updates/s), {size / updates:6.0f} bytes each", flush=True)
        finally:
            server.terminate()
            server.wait(10)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
