"""The web tier's Caddy, as app/cluster/tier.py configures it, in front of two processes: one that reads a POST's
whole body and then dies without answering (what a killed web process does to Gradio's ``queue/join`` on a
kept-alive connection), and one that answers. Every POST reaches the live one with its body whole; none is a 502.
Without ``request_buffers`` Caddy retried the POST with a body already spent on the dead connection and answered
502: the page showed Gradio's "Error" and the customer's question was lost."""

from __future__ import annotations

import socket
import socketserver
import struct
import subprocess
import threading

import httpx
import pytest

from app.cluster.tier import caddy_binary, caddyfile
from app.settings import load_settings
from tests.helpers.servers import free_port
from tests.helpers.waiting import wait_until

LIVE = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"


class Upstream(socketserver.ThreadingTCPServer):
    """A web process on loopback: /livez answers; a POST is answered with its own body, or, when ``dies``, read
    to its last byte and then the connection is reset with no answer."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, dies: bool):
        self.dies, self.posts = dies, []
        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"


class Handler(socketserver.StreamRequestHandler):
    def handle(self):
        server: Upstream = self.server  # type: ignore[assignment]
        request = self.rfile.readline()
        headers = {}
        while (line := self.rfile.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        if not request.startswith(b"POST"):
            self.wfile.write(LIVE)
            return
        body = self.rfile.read(int(headers.get("content-length", "0")))
        server.posts.append(body)
        if server.dies:  # a reset, not a close: the round trip breaks after the request was sent
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return
        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))


@pytest.fixture
def proxy(tmp_path):
    dead, live = Upstream(dies=True), Upstream(dies=False)
    port = free_port()
    settings = load_settings({}, host="127.0.0.1", port=port, data_dir=str(tmp_path))
    config = tmp_path / "Caddyfile"
    config.write_text(caddyfile(settings, [dead.address, live.address]))
    env = {"XDG_DATA_HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    log = (tmp_path / "caddy.log").open("w")
    caddy = subprocess.Popen([caddy_binary(), "run", "--config", str(config), "--adapter", "caddyfile"],
                             env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert caddy.poll() is None, (tmp_path / "caddy.log").read_text()
        try:
            return httpx.get(f"{url}/livez", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(up, 60, "Caddy to answer")
        yield url, dead, live
    finally:
        caddy.terminate()
        caddy.wait(30)
        log.close()
        dead.shutdown()
        live.shutdown()


def test_a_post_a_process_died_under_reaches_the_other_process_with_its_whole_body(proxy):
    url, dead, live = proxy
    bodies = [(f'{{"data": ["Where is my parcel? {i}"], "session_hash": "s{i}"}}' + " " * 3000).encode()
              for i in range(6)]
    answers = []
    for body in bodies:  # no cookie: each POST goes to the next process in turn until the dead one is marked down
        with httpx.Client() as client:
            answers.append(client.post(f"{url}/gradio_api/queue/join", content=body, timeout=30))
    assert [(a.status_code, a.content) for a in answers] == [(200, body) for body in bodies]
    assert len(dead.posts) >= 1  # the dead process was tried: the retry, not luck, saved the POST
    assert live.posts == bodies
