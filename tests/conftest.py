"""Shared fixtures: the real vLLM (CPU build) engine with the demo model, started once per session,
a real SQLite file, and a real server on a free port. No mocks of vLLM or of the database.

vLLM's AsyncLLM binds to the event loop of its first request, so everything that talks to the
engine — direct test calls and the uvicorn server alike — runs on one loop in a background thread;
tests hand it coroutines through ``aio``.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parent.parent
collect_ignore = ["real_model"]  # `make test-real-model` runs those, on the real model it prepares
OUTPUT_DIR = ROOT / "test-output"  # screenshots and other artefacts a person may want to look at


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_settings(data_dir: Path, **overrides):
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
        keep_warm_interval_s=0,
    )
    values.update(overrides)
    return load_settings(environ={}, **values)


@pytest.fixture(scope="session")
def engine_loop():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="engine-loop", daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=5)


@pytest.fixture(scope="session")
def aio(engine_loop) -> Callable[[Coroutine], object]:
    def run(coro: Coroutine, timeout: float = 120):
        return asyncio.run_coroutine_threadsafe(coro, engine_loop).result(timeout)

    return run


@pytest.fixture(scope="session")
def settings(tmp_path_factory):
    return test_settings(tmp_path_factory.mktemp("prefixdesk"))


@pytest.fixture(scope="session")
def services(settings):
    services = start_services(settings)
    yield services
    services.close()


@pytest.fixture(scope="session")
def engine(services):
    return services.engine


@pytest.fixture(scope="module")
def client(server_url):
    """A gradio_client on the chat app (one browser session per test module)."""
    from gradio_client import Client

    return Client(server_url, verbose=False)


@pytest.fixture(scope="module")
def db(settings):
    """The session database, opened with sqlite-utils to check what was stored."""
    import sqlite_utils

    return sqlite_utils.Database(settings.database_url.removeprefix("sqlite:///"))


@pytest.fixture(scope="session")
def block_size(engine) -> int:
    return engine.info.block_size


def full_blocks(n_tokens: int, block_size: int) -> int:
    """Tokens of ``n_tokens`` that fill whole KV blocks: what a prefix cache can hold of them."""
    return n_tokens // block_size * block_size


def operator(services, name: str, password: str) -> tuple[str, str]:
    """An operator account in the session database (created or reset)."""
    from admin import operators

    operators.set_password(services.db, name=name, password=password)
    return name, password


@pytest.fixture(scope="session")
def server_url(services, engine_loop):
    """A real uvicorn server for the app, on the engine's loop, on a free port."""
    import time

    import uvicorn

    from app.server import create_app, uvicorn_config

    config = uvicorn_config(create_app(services), services.settings, timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    future = asyncio.run_coroutine_threadsafe(server.serve(), engine_loop)
    deadline = time.monotonic() + 30
    while not server.started or not (services.ready and services.ready.is_set()):
        if future.done():
            future.result()
        assert time.monotonic() < deadline, "server did not start in 30 s"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{services.settings.port}/"
    server.should_exit = True
    future.result(timeout=30)


def start_services(settings):
    """build_services in a thread of its own: vLLM's AsyncLLM attaches to any event loop running in
    the thread that creates it (Playwright's sync API keeps one in the main thread), and this one
    must attach to the engine loop on its first request instead."""
    from concurrent.futures import ThreadPoolExecutor

    from app.server import build_services

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(build_services, settings).result()


async def collect(stream) -> list:
    return [event async for event in stream]


from app.bench.browser import CHROMIUM, CHROMIUM_ARGS  # noqa: E402  (after the environment set above; shared with the benchmark)


@pytest.fixture(scope="session")
def browser(services):
    """Debian's chromium driven by Playwright (no browser download).

    It depends on ``services`` so the session engine exists first: Playwright runs its own event
    loop, and an engine created after it would bind to that loop instead of the engine loop.
    """
    from playwright.sync_api import sync_playwright

    OUTPUT_DIR.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()


class AppProcess:
    """``python -m app`` as a child process, as an operator would start it."""

    def __init__(self, env: dict[str, str]):
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
        self.proc = subprocess.Popen([sys.executable, "-m", "app"], cwd=ROOT, env=env,
                                     stdout=self._log, stderr=subprocess.STDOUT, process_group=0)

    def wait_ready(self, timeout: float = 180) -> None:
        import time
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(self.url + "healthz", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"server not ready in {timeout} s:\n{self.log()}")

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


def app_env(data_dir: Path, **settings) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFIXDESK_")}
    env.update({"PREFIXDESK_DATA_DIR": str(data_dir), "PREFIXDESK_PORT": str(free_port()),
                "PREFIXDESK_KV_CACHE_MIB": "64", "PREFIXDESK_MAX_TOKENS": "48",
                "PREFIXDESK_MAX_MODEL_LEN": "2048", "GRADIO_ANALYTICS_ENABLED": "False",
                "PYTHONUNBUFFERED": "1"})
    env.update({f"PREFIXDESK_{k.upper()}": str(v) for k, v in settings.items()})
    return env


class SecondServer:
    """Another app on the session's engine (no second engine start): its own data dir and settings,
    served by uvicorn on the engine loop. Use as ``with SecondServer(services, engine_loop, tmp_path, ...) as url``."""

    def __init__(self, services, loop: asyncio.AbstractEventLoop, data_dir: Path, **overrides):
        self.settings = test_settings(data_dir, **overrides)
        self.base = services
        self.loop = loop
        self.services = None
        self._server = None
        self._future = None

    def __enter__(self) -> str:
        import time
        from concurrent.futures import ThreadPoolExecutor

        import uvicorn

        from app.server import build_services, create_app, uvicorn_config

        with ThreadPoolExecutor(1) as pool:
            self.services = pool.submit(build_services, self.settings, engine=self.base.engine).result()
        self._server = uvicorn.Server(uvicorn_config(create_app(self.services), self.settings,
                                                     timeout_graceful_shutdown=2))
        self._future = asyncio.run_coroutine_threadsafe(self._server.serve(), self.loop)
        deadline = time.monotonic() + 60
        while not self._server.started or not (self.services.ready and self.services.ready.is_set()):
            if self._future.done():
                self._future.result()
            assert time.monotonic() < deadline, "second server did not start in 60 s"
            time.sleep(0.05)
        return f"http://127.0.0.1:{self.settings.port}/"

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._future.result(timeout=30)
        self.services.db.close()  # the engine is the session's: it stays



@pytest.fixture(scope="session")
def console(services):
    """The console's services, as the server builds them (templates, access, meter)."""
    from admin.access import ConsoleAccess
    from admin.console import build_console

    access = ConsoleAccess(services.db, ttl_s=3600, free_attempts=5)
    return build_console(settings=services.settings, db=services.db, engine=services.engine, desk=services.desk,
                         catalog=services.catalog, access=access)


def console_page(browser, server_url: str, account: tuple[str, str], *, width: int = 1366, height: int = 900):
    """A browser page logged in to the console through its login page."""
    page = browser.new_page(viewport={"width": width, "height": height})
    page.goto(server_url + "admin")
    page.locator("#username").fill(account[0])
    page.locator("#password").fill(account[1])
    page.locator("button[type=submit]").click()
    page.wait_for_url(server_url + "admin/")
    page.locator("#templates-table").wait_for(timeout=60_000)
    return page


# -- servers as an attacker meets them (tests/security) -------------------------------------------------


@pytest.fixture(scope="session")
def proxied(services, engine_loop, tmp_path_factory):
    """A server behind a trusted reverse proxy on 127.0.0.1 that names tenants in X-Tenant, with an operator."""
    with SecondServer(services, engine_loop, tmp_path_factory.mktemp("proxied"), trusted_proxies="127.0.0.1",
                      tenant_header="X-Tenant", admin_password="operator passphrase 9",
                      admin_login_attempts=3) as url:
        yield url


@pytest.fixture(scope="session")
def limited(services, engine_loop, tmp_path_factory):
    """A server with the per-client limits an operator would set: 3 messages a minute, 2 streams at once."""
    with SecondServer(services, engine_loop, tmp_path_factory.mktemp("limited"), rate_limit_per_minute=3,
                      max_streams_per_client=2, max_tokens=600) as url:
        yield url
