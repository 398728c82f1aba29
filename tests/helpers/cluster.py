"""``python -m app.cluster --no-app`` as an operator starts it, on free loopback ports, for the cluster
tests and the attacks on the cluster's sockets."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from app.cluster.spec import ClusterOptions

from tests.helpers.servers import ROOT, settings_for
from tests.helpers.waiting import wait_until

STARTUP_TIMEOUT_S = 240
API_KEY = "cluster key for the replicas 5"  # tests/cluster's cluster asks for it (PREFIXDESK_ENGINE_API_KEY)
BEARER = {"Authorization": f"Bearer {API_KEY}"}
RESTART_TIMEOUT_S = 150  # a killed replica, started again by the launcher


def free_port_run(n: int) -> int:
    """The first of ``n`` consecutive free ports on loopback."""
    for base in range(21000 + os.getpid() % 997 * 20, 60000, 50):
        socks = []
        try:
            for port in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no run of free ports")


class RunningCluster:
    """The launcher with ``replicas`` demo-model replicas (one core each) and the router, and what it printed.

    ``env`` adds PREFIXDESK_* settings the launcher reads (e.g. PREFIXDESK_ENGINE_API_KEY)."""

    def __init__(self, data_dir: Path, *, replicas: int = 2, env: dict[str, str] | None = None):
        base = free_port_run(2 * replicas + 2)
        self.options = ClusterOptions(replicas=replicas, device="cpu", cores_per_replica=1, replica_port=base,
                                      kv_events_port=base + replicas, router_port=base + 2 * replicas,
                                      router_metrics_port=base + 2 * replicas + 1, start_app=False)
        # The app's settings for this cluster: its API key, if the launcher was given one.
        self.settings = settings_for(data_dir, engine_api_key=(env or {}).get("PREFIXDESK_ENGINE_API_KEY", ""))
        launcher_env = {k: v for k, v in os.environ.items() if not k.startswith("PREFIXDESK_")}
        launcher_env.update({"PREFIXDESK_DATA_DIR": str(data_dir), "PREFIXDESK_KV_CACHE_MIB": "64",
                             "PREFIXDESK_MAX_MODEL_LEN": "2048", "PREFIXDESK_MAX_TOKENS": "48",
                             "PREFIXDESK_TEMPLATES_DIR": str(ROOT / "templates"), "PYTHONUNBUFFERED": "1",
                             "PREFIXDESK_ENGINE_STEP_DELAYS": "true",  # answers that ask may pause (slow_answers)
                             **(env or {})})
        o = self.options
        self.argv = [sys.executable, "-m", "app.cluster", "--no-app", "--device", "cpu", "--replicas", str(replicas),
                     "--cores-per-replica", "1", "--replica-port", str(o.replica_port), "--kv-events-port",
                     str(o.kv_events_port), "--router-port", str(o.router_port), "--router-metrics-port",
                     str(o.router_metrics_port)]
        self.out_path = data_dir / "launcher.out"
        self._out = open(self.out_path, "wb")
        # A process group of its own, in the test's session: a new session is a scheduling group of its own
        # (autogroup), and on 2 cores the cluster's would starve the test (see AppProcess in tests/helpers/servers.py).
        self.proc = subprocess.Popen(self.argv, cwd=ROOT, env=launcher_env, stdout=self._out, stderr=subprocess.STDOUT,
                                     process_group=0)
        self.router_url = f"http://127.0.0.1:{o.router_port}"
        self.replica_urls = [f"http://127.0.0.1:{o.replica_port + i}" for i in range(replicas)]
        # Where each replica publishes its KV-cache events (it binds the launcher's --host, 127.0.0.1).
        self.kv_events = {u: f"tcp://127.0.0.1:{o.kv_events_port + i}" for i, u in enumerate(self.replica_urls)}

    def wait_ready(self) -> float:
        started = time.monotonic()
        wait_until(self._ready, STARTUP_TIMEOUT_S, lambda: f"the cluster to be ready:\n{self.output()}", poll_s=0.5)
        return time.monotonic() - started

    def _ready(self) -> bool:
        assert self.proc.poll() is None, f"the launcher exited with {self.proc.returncode}:\n{self.output()}"
        return "Ctrl-C stops everything" in self.output()

    def output(self) -> str:
        return self.out_path.read_text(errors="replace")

    def process_group(self, url: str) -> int:
        """The process group serving ``url``: its API server and engine core."""
        import psutil

        port = int(url.rsplit(":", 1)[1])
        pid = next(c.pid for c in psutil.net_connections("tcp") if c.laddr and c.laddr.port == port
                   and c.status == psutil.CONN_LISTEN)
        return os.getpgid(pid)

    def listening(self) -> list[tuple[str, str, int]]:
        """Every socket a process of the cluster listens on: (process name, address, port)."""
        import psutil

        pids = {p.pid: p.name() for p in psutil.Process(self.proc.pid).children(recursive=True)}
        return sorted((pids[c.pid], c.laddr.ip, c.laddr.port) for c in psutil.net_connections("inet")
                      if c.pid in pids and c.laddr and (c.status == psutil.CONN_LISTEN or c.type == socket.SOCK_DGRAM))

    def kill_replica(self, url: str) -> None:
        """SIGKILL the replica serving ``url``, as a crash would."""
        os.killpg(self.process_group(url), signal.SIGKILL)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self._out.close()
