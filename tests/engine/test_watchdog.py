"""The engine's watchdog watches the engine, not the readers: answers whose readers stop reading for twice the
stall timeout, while the engine keeps computing them, restart nothing. (A core that stops computing is still
reported and restarted: tests/web/test_faults.py.)"""

import json
import re
import socket
import time
import urllib.request

from tests.helpers.servers import AppProcess, app_env

STALL_TIMEOUT_S = 2.0
MAX_TOKENS = 6000  # seconds of generating on this CPU: the engine computes all through the readers' pause
READERS = 3


def health(url: str) -> dict:
    try:
        with urllib.request.urlopen(url + "healthz", timeout=5) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return json.loads(exc.read())


class UnreadStream:
    """A streamed /v1 answer whose reader reads its first event, then nothing until ``finish``. Its socket's
    receive buffer is tiny, so the server's writes back up and the app's handler stops taking the engine's
    output: from the app's side, a slow or vanished reader."""

    def __init__(self, port: int, question: str):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)  # before connect: a small window
        self.sock.connect(("127.0.0.1", port))
        body = json.dumps({"model": "电商客服", "messages": [{"role": "user", "content": question}], "stream": True,
                           "max_tokens": MAX_TOKENS, "ignore_eos": True,
                           "stream_options": {"include_usage": True}}).encode()
        self.sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                          b"\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        self.received = b""
        while b"data: " not in self.received:
            self.received += self._recv()

    def finish(self) -> int:
        """Read to the end; the answer's completion tokens, from its usage."""
        while b"data: [DONE]" not in self.received:
            self.received += self._recv()
        self.sock.close()
        return int(re.findall(rb'"completion_tokens":\s*(\d+)', self.received)[-1])

    def _recv(self) -> bytes:
        chunk = self.sock.recv(65536)
        assert chunk, f"the server closed the stream: {self.received[-300:]!r}"
        return chunk


def test_answers_nobody_reads_for_twice_the_stall_timeout_restart_nothing(tmp_path):
    server = AppProcess(app_env(tmp_path, max_tokens=MAX_TOKENS, max_model_len=8192,
                                engine_stall_timeout_s=STALL_TIMEOUT_S))
    try:
        server.wait_ready()
        readers = [UnreadStream(server.port, f"请详细介绍退货流程 {i}") for i in range(READERS)]
        seen = []
        paused_until = time.monotonic() + 2 * STALL_TIMEOUT_S + 1.0
        while time.monotonic() < paused_until:  # nobody reads; the engine keeps computing the three answers
            h = health(server.url)
            seen.append((h["ok"], h["restarts"], h["reason"]))
            time.sleep(0.25)
        assert set(seen) == {(True, 0, "")}
        assert [r.finish() for r in readers] == [MAX_TOKENS] * READERS  # every answer ran to its end
        assert (health(server.url)["restarts"], server.proc.poll()) == (0, None)
        assert "restarting it" not in server.log()
    finally:
        assert server.stop() == 0
