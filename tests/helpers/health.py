"""/healthz latency while an attack runs, against a control window of the same run, and a process's memory."""

from __future__ import annotations

import statistics
import threading
import time

import httpx


class HealthWindows:
    """Polls /healthz from a thread; ``window(name)`` starts a new window of samples (ms)."""

    def __init__(self, url: str, interval_s: float = 0.05):
        self.url, self.interval_s = url, interval_s
        self.ms: dict[str, list[float]] = {}
        self._current: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self.window("before")
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def window(self, name: str) -> None:
        self._current = self.ms[name] = []

    def quantile(self, name: str, q: float) -> float:
        """The ``q`` quantile (0-1) of the window's latencies, in ms."""
        ms = sorted(self.ms[name])
        return ms[min(len(ms) - 1, int(q * len(ms)))]

    def summary(self, name: str) -> str:
        ms = self.ms[name]
        return (f"{name}: p50 {statistics.median(ms):.0f} ms, p90 {self.quantile(name, 0.9):.0f} ms, "
                f"max {max(ms):.0f} ms over {len(ms)} probes")

    def _run(self):
        with httpx.Client() as client:
            while not self._stop.is_set():
                started = time.monotonic()
                client.get(self.url + "healthz", timeout=30)
                self._current.append((time.monotonic() - started) * 1000)
                time.sleep(self.interval_s)


def rss_mib(pid: int) -> float:
    """The resident memory of process ``pid`` (VmRSS), in MiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for process {pid}")
