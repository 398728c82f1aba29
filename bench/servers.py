"""The web servers a benchmark measures: the real app in the benchmark's process (``http``), and the
app as an operator runs it, ``python -m app`` in front of a remote engine (``remote``).

``AppProcess`` starts ``python -m app`` (``--api-only`` where Gradio is not installed) with the
benchmark's settings as PREFIXDESK_* variables, in a process group of its own, and waits until
every one of its ``PREFIXDESK_WEB_PROCESSES`` workers says it serves and /healthz answers 200.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

SERVING_LINE = b"prefixdesk: serving on"
ROOT = Path(__file__).resolve().parent.parent.parent


class AppStartError(RuntimeError):
    """The app did not start or died; the message ends with its log."""


def settings_env(settings, **overrides) -> dict[str, str]:
    """Every setting as its PREFIXDESK_* variable (``overrides`` win), so a child app runs with the
    benchmark's exact settings."""
    from app.settings import SETTINGS

    env = {}
    for s in SETTINGS:
        value = overrides[s.name] if s.name in overrides else getattr(settings, s.name)
        if isinstance(value, bool):
            value = "true" if value else "false"
        env[s.env] = "" if value is None else str(value)
    return env


class AppProcess:
    """``python -m app`` with ``env`` on top of this process's environment (minus other PREFIXDESK_*)."""

    def __init__(self, env: dict[str, str], *, log_path: Path, web_processes: int, api_only: bool):
        self.env, self.log_path, self.web_processes, self.api_only = env, log_path, web_processes, api_only
        self.port = int(env["PREFIXDESK_PORT"])
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        base = {k: v for k, v in os.environ.items() if not k.startswith("PREFIXDESK_")}
        env = {**base, **self.env, "PYTHONUNBUFFERED": "1", "GRADIO_ANALYTICS_ENABLED": "False"}
        argv = [sys.executable, "-m", "app", *(["--api-only"] if self.api_only else [])]
        with open(self.log_path, "ab") as log:
            # Its own process group, this session: a new session is a scheduling group of its own (autogroup),
            # and a server streaming on a small machine would starve the clients that measure it.
            self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, process_group=0)
        print(f"bench: started {' '.join(argv[1:])} with {self.web_processes} web processes on {self.url}",
              flush=True)

    async def wait_ready(self, timeout_s: float) -> None:
        """Until every worker printed its serving line and /healthz answers 200; raises AppStartError."""
        import httpx

        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(timeout=5) as client:
            while time.monotonic() < deadline:
                self.check_alive()
                if self._serving() >= self.web_processes:
                    try:
                        if (await client.get(f"{self.url}/healthz")).status_code == 200:
                            print(f"bench: the app is ready on {self.url}", flush=True)
                            return
                    except httpx.HTTPError:
                        pass
                await asyncio.sleep(0.5)
        raise AppStartError(f"the app did not get ready within {timeout_s:.0f} s; {self.log_path} ends:\n{self.tail()}")

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise AppStartError(f"the app exited with {self.proc.returncode}; {self.log_path} ends:\n{self.tail()}")

    def stop(self) -> None:
        """SIGTERM the app's group (workers store what they were answering), SIGKILL after 20 s."""
        if self.proc is None:
            return
        for sig, wait_s in ((signal.SIGTERM, 20), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(wait_s)
            except subprocess.TimeoutExpired:
                continue
        try:  # workers outliving the supervisor go with the group
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def _serving(self) -> int:
        try:
            return self.log_path.read_bytes().count(SERVING_LINE)
        except OSError:
            return 0


class InProcessServer:
    """uvicorn serving an ASGI app on this event loop (the engine's), for the ``http`` path."""

    def __init__(self) -> None:
        self._servers: list[tuple[object, asyncio.Task]] = []

    async def serve(self, app, port: int) -> str:
        """Serve ``app`` at 127.0.0.1:``port``; returns its base URL once it accepts connections."""
        import uvicorn

        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on",
                                timeout_keep_alive=600, backlog=4096, timeout_graceful_shutdown=5)
        server = uvicorn.Server(config)
        task = asyncio.create_task(server.serve())
        deadline = time.monotonic() + 60
        while not server.started:
            if task.done():
                task.result()
            if time.monotonic() > deadline:
                raise RuntimeError(f"the benchmark's HTTP server did not start on port {port} in 60 s")
            await asyncio.sleep(0.05)
        self._servers.append((server, task))
        return f"http://127.0.0.1:{port}"

    async def close(self) -> None:
        for server, task in self._servers:
            server.should_exit = True
            await asyncio.gather(task, return_exceptions=True)
        self._servers.clear()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
