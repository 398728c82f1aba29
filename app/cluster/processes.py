"""Starting, health-waiting and stopping the processes of a ``ClusterPlan``.

Each process runs in a session (process group) of its own, so stopping one takes its children
along (vLLM's API servers and engine cores, the router's workers), and writes its output to its
log under ``<data_dir>/cluster/``. A process that exits while being waited for stops the start
with the end of its log in the message.
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from app.cluster.spec import ClusterError, ClusterPlan, ProcessSpec

HEALTH_POLL_S = 0.5
STOP_TIMEOUT_S = 30.0


def check_ports(plan: ClusterPlan) -> None:
    """Raise ClusterError naming the option to change when a port of ``plan`` is taken."""
    for use in plan.ports:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("" if plan.host in ("0.0.0.0", "::") else plan.host, use.port))
            except OSError:
                raise ClusterError(f"port {use.port} ({use.what}) is taken on {plan.host}; stop what uses it or "
                                   f"choose another with {use.option}") from None


class Cluster:
    """The running processes of a plan; ``start`` in order, ``stop`` in reverse."""

    def __init__(self, plan: ClusterPlan):
        self.plan = plan
        self.procs: dict[str, subprocess.Popen] = {}
        self._logs: list = []

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self, *, timeout_s: float = 600.0, on_ready=None) -> None:
        """Start the replicas together, then the router, then the app, each once the previous answer
        their health check; raises ClusterError (after stopping what started) when one does not."""
        try:
            replicas = [r.process for r in self.plan.replicas]
            for spec in replicas:
                self.launch(spec)
            for spec in replicas:
                self.wait_healthy(spec, timeout_s)
                on_ready and on_ready(spec)
            for spec in self.plan.processes[len(replicas):]:
                self.launch(spec)
                self.wait_healthy(spec, timeout_s)
                on_ready and on_ready(spec)
        except BaseException:
            self.stop()
            raise

    def launch(self, spec: ProcessSpec) -> subprocess.Popen:
        """Start one process of the plan (again, if it was stopped), its output appended to its log."""
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(spec.log_path, "ab")
        self._logs.append(log)
        env = {**os.environ, **dict(spec.env), "PYTHONUNBUFFERED": "1"}
        # A process group of its own (Ctrl-C reaches the launcher alone, which stops the plan in order), in the
        # launcher's session: a new session would be a scheduling group of its own under Linux's autogroup, and
        # replicas busy streaming would then starve the launcher, the router and the app on a small machine.
        proc = subprocess.Popen(spec.argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                process_group=0)
        self.procs[spec.name] = proc
        return proc

    def wait_healthy(self, spec: ProcessSpec, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        proc = self.procs[spec.name]
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ClusterError(f"{spec.name} exited with {proc.returncode} while starting; its log "
                                   f"{spec.log_path} ends:\n{tail(spec.log_path)}")
            try:
                with urllib.request.urlopen(spec.health_url, timeout=2) as response:
                    if response.status == 200:
                        return
            except (OSError, http.client.HTTPException):
                # Not listening yet. Or, before it listens, a poll whose source port is the health port connected to
                # itself (TCP's simultaneous open, within the ephemeral range) and read its own request back.
                pass
            time.sleep(HEALTH_POLL_S)
        raise ClusterError(f"{spec.name} did not answer {spec.health_url} within {timeout_s:.0f} s; its log "
                           f"{spec.log_path} ends:\n{tail(spec.log_path)}")

    def exited(self) -> list[str]:
        """The processes that have exited (empty while all run)."""
        return [name for name, p in self.procs.items() if p.poll() is not None]

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to a process's whole group (a replica's API server and engine core together)."""
        try:
            os.killpg(self.procs[name].pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM every group, newest first; SIGKILL what is left after ``timeout_s``."""
        names = list(self.procs)[::-1]
        for name in names:
            self.kill(name, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for name in names:
            try:
                self.procs[name].wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for name in names:
            # Children (an engine core, API servers) may outlive their parent; the group takes them along.
            self.kill(name, signal.SIGKILL)
            try:
                self.procs[name].wait(5)
            except subprocess.TimeoutExpired:
                pass
        for log in self._logs:
            log.close()
        self._logs.clear()


def tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"
