"""Real servers and settings for tests: free ports, the app in a child process, a second app on the
session's engine, and the small helpers every layer's tests share."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from tests.helpers.waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent.parent
OUTPUT_DIR = ROOT / "test-output"  # screenshots and other artefacts a person may want to look at
# The session's ``edge`` server (tests/conftest.py): an operator and tight connection limits.
EDGE_OPERATOR = ("admin", "operator passphrase 9")
EDGE_LIMITS = {"max_connections_per_client": 16, "max_connections": 48, "request_arrival_timeout_s": 20,
               "connections_reserved_percent": 0}  # the reserved share has a test of its own


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def settings_for(data_dir: Path, **overrides):
    """Settings for a test: nothing from the environment, everything under ``data_dir``."""
    from app.settings import load_settings

    values = dict(
        data_dir=str(data_dir),
        templates_dir=str(ROOT / "templates"),
        kv_cache_mib=64,
        max_tokens=48,
        max_model_len=2048,
        port=free_port(),
        # Every test client connects from 127.0.0.1: per-client limits are tested on desks of their own.
        rate_limit_per_minute=0,
        max_streams_per_client=0,
        rate_limit_per_address_per_minute=0,
        max_streams_per_address=0,
        max_connections_per_client=0,
        person_waiting_per_client=0,
        person_waiting_per_session=0,
        person_waiting_max=0,
        feedback_per_client=0,
        feedback_per_session=0,
        session_claims_per_minute=0,
        keep_warm_interval_s=0,
        engine_step_delays=True,  # so that a server on the session's engine can take slow_answers()
        # A step is never 30 s on a quiet machine, but one starved by other work held a tiny Baichuan2's that long and
        # the watchdog restarted its engine under a test: the tests of the watchdog set their own timeouts.
        engine_stall_timeout_s=600,
    )
    values.update(overrides)
    return load_settings(environ={}, **values)


STEP_DELAY_MS = 20


def slow_answers(max_tokens: int = 750) -> dict:
    """Settings under which every answer is certainly still streaming when a test acts on its first text: each
    engine step pauses STEP_DELAY_MS (app/engine/step_delay.py) and every answer runs to ``max_tokens``, so the
    default 750 tokens take 15 s or more however loaded the machine."""
    return dict(engine_step_delays=True, step_delay_ms=STEP_DELAY_MS, max_tokens=max_tokens, ignore_eos=True)


def full_blocks(n_tokens: int, block_size: int) -> int:
    """Tokens of ``n_tokens`` that fill whole KV blocks: what a prefix cache can hold of them."""
    return n_tokens // block_size * block_size


def operator(services, name: str, password: str) -> tuple[str, str]:
    """An operator account in the session database (created or reset)."""
    from admin import operators

    operators.set_password(services.db, name=name, password=password)
    return name, password


def start_services(settings):
    """build_services in a thread of its own: vLLM's AsyncLLM attaches to any event loop running in
    the thread that creates it (Playwright's sync API keeps one in the main thread), and this one
    must attach to the engine loop on its first request instead."""
    from concurrent.futures import ThreadPoolExecutor

    from app.server import build_services

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(build_services, settings).result()


# A server is ready once its start-up warm-up has computed every template: a bound that returns as soon as it is,
# not a time it must keep (two busy loops beside the suite held a tiny Baichuan2's warm-up past 60 s).
SERVER_START_S = 600


def serving(server, future, services, *, ready: bool = True) -> bool:
    """Whether a uvicorn ``server`` run as ``future`` is up and (``ready``) ``services`` are ready; raises what it
    died of."""
    if future.done():
        future.result()
    return server.started and (not ready or services.ready is not None and services.ready.is_set())


async def collect(stream) -> list:
    return [event async for event in stream]


class AppProcess:
    """``python -m app`` as a child process, as an operator would start it."""

    def __init__(self, env: dict[str, str], *, nofile_soft: int | None = None):
        """``nofile_soft``: start it with this soft RLIMIT_NOFILE (the server raises it to the hard limit)."""
        import resource
        import subprocess
        import sys

        self.env = env
        self.port = int(env["PREFIXDESK_PORT"])
        self.url = f"http://127.0.0.1:{self.port}/"
        self.log_path = Path(env["PREFIXDESK_DATA_DIR"]) / f"server-{self.port}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        # A process group of its own (stop() kills the whole tree with it), but the test's session, not a new
        # one: Linux's autogroup scheduler gives each session a group of its own that shares the CPU with the
        # others as a whole. In its own session, a server streaming answers on a busy 2-core machine took
        # both cores, and the test's process, its gradio_client threads and its watcher subprocess stood
        # runnable but unscheduled for 10-40 s at a time: requests meant to run at once reached the server
        # one after another, and a signal meant for answers in progress came after they had ended.
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        limit = (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile_soft, hard))) if nofile_soft else None
        self.proc = subprocess.Popen([sys.executable, "-m", "app"], cwd=ROOT, env=env, stdout=self._log,
                                     stderr=subprocess.STDOUT, process_group=0, preexec_fn=limit)

    def wait_ready(self, timeout: float = 600) -> None:
        # A bound, not a wait: it returns as soon as /healthz answers. Under load (two busy loops and four other
        # test runs beside it) a server took 2 min 9 s from seeding its templates to vLLM's first log line, and
        # had not answered after 180 s.
        wait_until(self._healthy, timeout, lambda: f"the server to answer /healthz:\n{self.log()}", poll_s=0.5)

    def _healthy(self) -> bool:
        import http.client
        import urllib.request

        if self.proc.poll() is not None:
            raise AssertionError(f"server exited with {self.proc.returncode}:\n{self.log()}")
        try:
            with urllib.request.urlopen(self.url + "healthz", timeout=2) as r:
                return r.status == 200
        except (OSError, http.client.HTTPException):  # not listening yet, or a poll connected to itself
            return False

    def stop(self, sig=None, timeout: float = 60) -> int:
        import os
        import signal

        if self.proc.poll() is None:
            self.proc.send_signal(sig or signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except Exception:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        # A worker whose engine process was killed can outlive the server for a while, spinning on
        # the core the next engine binds to; the server's process group takes it along.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._log.close()
        return self.proc.returncode

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def log_lines(self) -> list[str]:
        """Every line of its log so far."""
        return self.log_path.read_text(errors="replace").splitlines()

    def lines_logged_by(self, action, *, timeout_s: float = 60) -> list[str]:
        """The lines its log gained while ``action()`` ran, up to a mark logged after it: however late the log is
        written, a line ``action`` caused comes before the mark, so no fixed wait for it is needed. The mark is a
        request to a route the server refuses and logs in one line; it and ``action`` each go a second after the
        line before, since such refusals are logged one a second at most (a lower bound: load only lengthens it)."""
        import time
        import uuid

        import httpx

        time.sleep(1.1)
        before = len(self.log_lines())
        action()
        time.sleep(1.1)
        mark = f"/gradio_api/log-mark-{uuid.uuid4().hex[:12]}"
        assert httpx.get(self.url.rstrip("/") + mark, timeout=30).status_code == 404

        def up_to_the_mark() -> list[str] | None:
            lines = self.log_lines()[before:]
            return lines if any(mark in line for line in lines) else None

        lines = wait_until(up_to_the_mark, timeout_s, f"the log line of {mark}")
        return lines[:next(i for i, line in enumerate(lines) if mark in line)]

    def num_fds(self) -> int:
        """File descriptors the server process holds now."""
        import os

        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))


def app_env(data_dir: Path, **settings) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFIXDESK_")}
    env.update({"PREFIXDESK_DATA_DIR": str(data_dir), "PREFIXDESK_PORT": str(free_port()),
                "PREFIXDESK_KV_CACHE_MIB": "64", "PREFIXDESK_MAX_TOKENS": "48",
                "PREFIXDESK_MAX_MODEL_LEN": "2048", "GRADIO_ANALYTICS_ENABLED": "False",
                # Every test client opens its pages from 127.0.0.1 (tests/security/test_closed_sessions.py limits it).
                "PREFIXDESK_SESSION_CLAIMS_PER_MINUTE": "0",
                "PYTHONUNBUFFERED": "1"})
    env.update({f"PREFIXDESK_{k.upper()}": str(v) for k, v in settings.items()})
    return env


class SecondServer:
    """Another app on the session's engine (no second engine start): its own data dir and settings,
    served by uvicorn on the engine loop. Use as ``with SecondServer(services, engine_loop, tmp_path, ...) as url``."""

    def __init__(self, services, loop: asyncio.AbstractEventLoop, data_dir: Path, *, admin_clock=None,
                 wait_ready: bool = True, **overrides):
        """``wait_ready``: entering waits for /healthz's readiness (the start-up warm-up done), else only for the
        server to listen."""
        self.settings = settings_for(data_dir, **overrides)
        self.wait_ready = wait_ready
        self.admin_clock = admin_clock  # the time of its console sessions and login delays (a ManualClock)
        self.base = services
        self.loop = loop
        self.services = None
        self._server = None
        self._future = None
        self.app = None  # the app it serves, once started

    def __enter__(self) -> str:
        from concurrent.futures import ThreadPoolExecutor

        import uvicorn

        from app.server import build_services, create_app, uvicorn_config

        with ThreadPoolExecutor(1) as pool:
            self.services = pool.submit(build_services, self.settings, engine=self.base.engine).result()
        app = self.app = create_app(self.services, admin_clock=self.admin_clock)
        self._server = uvicorn.Server(uvicorn_config(app, self.settings, timeout_graceful_shutdown=2))
        self._future = asyncio.run_coroutine_threadsafe(self._server.serve(), self.loop)
        wait_until(lambda: serving(self._server, self._future, self.services, ready=self.wait_ready), SERVER_START_S,
                   "the second server to start")
        return f"http://127.0.0.1:{self.settings.port}/"

    def idle(self) -> bool:
        """Whether no request is in progress (each has ended, its log lines written)."""
        return not self._server.server_state.tasks

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._future.result(timeout=30)
        self.services.db.close()  # the engine is the session's: it stays
