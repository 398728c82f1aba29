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
    from app.server import build_services

    services = build_services(settings)
    yield services
    services.close()


@pytest.fixture(scope="session")
def engine(services):
    return services.engine


@pytest.fixture(scope="session")
def server_url(services, engine_loop):
    """A real uvicorn server for the app, on the engine's loop, on a free port."""
    import time

    import uvicorn

    from app.server import create_app

    config = uvicorn.Config(create_app(services), host="127.0.0.1", port=services.settings.port,
                            log_level="warning", lifespan="on", timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    future = asyncio.run_coroutine_threadsafe(server.serve(), engine_loop)
    deadline = time.monotonic() + 30
    while not server.started:
        if future.done():
            future.result()
        assert time.monotonic() < deadline, "server did not start in 30 s"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{services.settings.port}/"
    server.should_exit = True
    future.result(timeout=30)


async def collect(stream) -> list:
    return [event async for event in stream]
