"""``python -m bench.slow_clients``: one host opens many connections that never finish sending a request.

Starts ``python -m app`` on loopback (the per-client rate limits off, everything else as configured, and
the soft file limit ``--server-nofile``), measures /healthz from 127.0.0.1 for a control window, then
opens ``--connections`` half-sent requests from 127.0.0.2 and keeps them open, and prints: how many the
server closed at once, the file descriptors it holds, /healthz while they are held, how many lines its
log grew by, and how many of the held ones were answered 408 once PREFIXDESK_REQUEST_ARRIVAL_TIMEOUT_S
passed. ``--json PATH`` writes the same numbers.

    python -m bench.slow_clients --connections 5000 --server-nofile 2048
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HALF_REQUEST = b"GET /healthz HTTP/1.1\r\nHost: desk\r\nUser-Agent: slow"  # the headers never end


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.slow_clients", description=__doc__.split("\n\n")[0])
    p.add_argument("--connections", type=int, default=5000, help="half-sent requests from 127.0.0.2")
    p.add_argument("--server-nofile", type=int, default=2048, help="the server's soft RLIMIT_NOFILE at start")
    p.add_argument("--wait-timeout", action="store_true", help="also wait for the arrival timeout (20 s)")
    p.add_argument("--json", type=Path, help="write the numbers here")
    args = p.parse_args(argv)
    server = _Server(args.server_nofile)
    try:
        fds_before, log_before = server.num_fds(), len(server.log_text())
        control = _health_ms(server.url)
        opened = time.monotonic()
        socks, failed = [], 0
        for _ in range(args.connections):
            s = socket.socket()
            try:
                s.bind(("127.0.0.2", 0))
                s.settimeout(5)
                s.connect(("127.0.0.1", server.port))
                s.sendall(HALF_REQUEST)
                socks.append(s)
            except OSError:
                failed += 1
                s.close()
        open_s = time.monotonic() - opened
        closed = _closed_within(socks, 5.0)
        held = [s for s in socks if s not in closed]
        for s in closed:
            s.close()
        during = _health_ms(server.url)
        result = {"connections": args.connections, "connect_failed": failed, "open_s": round(open_s, 1),
                  "closed_at_once": len(closed), "held": len(held), "server_fds_before": fds_before,
                  "server_fds_held": server.num_fds(), "healthz_p50_ms_before": _p50(control),
                  "healthz_p50_ms_during": _p50(during), "healthz_failed_during": sum(x is None for x in during),
                  "log_lines_added": server.log_text()[log_before:].count("\n"),
                  "log_bytes_added": len(server.log_text()) - log_before,
                  "tracebacks_added": server.log_text()[log_before:].count("Traceback")}
        if args.wait_timeout:
            answered = 0
            for s in held:
                s.settimeout(40)
                try:
                    answered += s.recv(64).startswith(b"HTTP/1.1 408 ")
                except OSError:
                    pass
            result["answered_408"] = answered
            result["waited_s"] = round(time.monotonic() - opened, 1)
        for s in held:
            s.close()
    finally:
        server.stop()
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


def _health_ms(url: str, n: int = 20) -> list[float | None]:
    out = []
    for _ in range(n):
        started = time.monotonic()
        try:
            with urllib.request.urlopen(url + "healthz", timeout=10) as r:
                r.read()
            out.append((time.monotonic() - started) * 1000)
        except OSError:
            out.append(None)
        time.sleep(0.05)
    return out


def _p50(values: list[float | None]) -> float | None:
    ok = [v for v in values if v is not None]
    return round(statistics.median(ok), 1) if ok else None


def _closed_within(socks: list[socket.socket], seconds: float) -> set[socket.socket]:
    """The sockets the server closed (a reset or an end of stream) within ``seconds``."""
    by_fd = {s.fileno(): s for s in socks}
    poller = select.poll()  # select() stops at descriptor 1,024
    for fd in by_fd:
        poller.register(fd, select.POLLIN)
    closed, deadline = set(), time.monotonic() + seconds
    while len(closed) < len(socks) and (left_s := deadline - time.monotonic()) > 0:
        for fd, _ in poller.poll(left_s * 1000):
            closed.add(by_fd[fd])
            poller.unregister(fd)
    return closed


class _Server:
    def __init__(self, nofile: int):
        import resource

        self.data_dir = Path(tempfile.mkdtemp(prefix="prefixdesk-slow-"))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFIXDESK_")}
        env.update(PREFIXDESK_DATA_DIR=str(self.data_dir), PREFIXDESK_PORT=str(self.port),
                   PREFIXDESK_RATE_LIMIT_PER_MINUTE="0", PREFIXDESK_RATE_LIMIT_PER_ADDRESS_PER_MINUTE="0",
                   GRADIO_ANALYTICS_ENABLED="False", PYTHONUNBUFFERED="1")
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        self.log_path = self.data_dir / "server.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "app"], env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     process_group=0,
                                     preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, hard)))
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"slow_clients: the server exited; see {self.log_path}")
            try:
                with urllib.request.urlopen(self.url + "healthz", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        sys.exit("slow_clients: the server did not start in 240 s")

    def num_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
        self._log.close()
        shutil.rmtree(self.data_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
