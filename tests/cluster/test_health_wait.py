"""The launcher waits for each process's health check until it answers 200, whatever answers before.

Before: a busy run's tier stopped while starting ("exited with 1": http.client's BadStatusLine, "GET /health
HTTP/1.1"). Before the engine listened, the launcher's poll got the engine's port as its own source port, connected
to itself (TCP's simultaneous open) and read its own request back; only OSError was taken as "not yet".
After: any answer that is not HTTP is polled again. Here the process's first answer is the request itself, as a
self-connected poll reads it.
"""

from __future__ import annotations

import sys

from app.cluster.processes import Cluster
from app.cluster.spec import ProcessSpec
from tests.helpers.servers import free_port
from tests.helpers.waiting import wait_until

ECHO_ONCE_THEN_OK = """
import socket, sys, time
server = socket.create_server(("127.0.0.1", int(sys.argv[1])))
for answer in ("echoed", "answered"):
    conn, _ = server.accept()
    request = conn.recv(65536)
    conn.sendall(request if answer == "echoed" else b"HTTP/1.0 200 OK\\r\\nContent-Length: 0\\r\\n\\r\\n")
    conn.close()
    print(answer, flush=True)
time.sleep(120)
"""


def test_a_health_poll_that_reads_its_own_request_back_is_polled_again(tmp_path):
    port = free_port()
    spec = ProcessSpec(name="echo", argv=(sys.executable, "-c", ECHO_ONCE_THEN_OK, str(port)), env=(),
                       health_url=f"http://127.0.0.1:{port}/health", log_path=tmp_path / "echo.log")
    processes = Cluster(None)  # (launch, wait_healthy and stop read only .procs)
    processes.launch(spec)
    try:
        processes.wait_healthy(spec, 120)
        wait_until(lambda: spec.log_path.read_text().split() == ["echoed", "answered"], 30,
                   lambda: f"the process to log both answers, not {spec.log_path.read_text()!r}")
        assert processes.exited() == []
    finally:
        processes.stop()
