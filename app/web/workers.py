"""Several web processes on one port: ``PREFIXDESK_WEB_PROCESSES=N`` with the remote engine.

One Python process streams a few thousand tokens a second before its event loop, not the GPU, is
the limit. With the engine behind HTTP (vllm serve replicas and their router), the web tier holds no
engine state, so N copies of ``python -m app --worker`` bind the same port (SO_REUSEPORT: the
kernel spreads connections over them) and share the database. The loops that must run once per
deployment (cache sampler, keep-warm) take a lease in the database (app/db/leases.py).

This process only supervises: it starts the workers, passes SIGINT/SIGTERM on (each worker stores
its answers in progress as stopped, as a single server does) and exits 0 when they all did.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

from app.settings import Settings

START_INTERVAL_S = 0.5  # workers start one after another: the first one migrates the database


def supervise(settings: Settings, *, worker_args: list[str] | None = None) -> int:
    """Run ``settings.web_processes`` workers (``python -m app --worker`` plus ``worker_args``) until a
    signal or a worker's death; returns the exit code."""
    workers: list[subprocess.Popen] = []
    stopping = False

    def stop(signum, _frame) -> None:
        nonlocal stopping
        stopping = True
        for w in workers:
            if w.poll() is None:
                w.send_signal(signum)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    _share_metrics(settings)
    for _ in range(settings.web_processes):
        workers.append(subprocess.Popen([sys.executable, "-m", "app", "--worker", *(worker_args or [])]))
        time.sleep(START_INTERVAL_S)
    print(f"prefixdesk: {len(workers)} web processes on http://{settings.host}:{settings.port}", flush=True)
    while not stopping and all(w.poll() is None for w in workers):
        time.sleep(0.5)
    if not stopping:  # a worker died: take the others down with it, so the deployment restarts whole
        print("prefixdesk: a web process exited; stopping the others", file=sys.stderr, flush=True)
        stop(signal.SIGTERM, None)
    codes = [w.wait() for w in workers]
    return 0 if stopping and all(c == 0 for c in codes) else 1


def _share_metrics(settings: Settings) -> None:
    """Have the workers keep their /metrics counts in files that any of them adds up when scraped: an empty
    settings.metrics_dir (counts of an earlier run would be added too), named to prometheus_client in the
    workers' environment, which it reads as they import it."""
    folder = settings.metrics_dir
    assert folder is not None, "one web process keeps its counts in memory"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(folder.resolve())
