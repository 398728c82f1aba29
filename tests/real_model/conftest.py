"""Fixtures for the real demo model (``make test-real-model``): the prepared Qwen2.5-0.5B folder, the
app's engine on it, and a report of the measured timings at the end of the run.

These tests are kept out of ``make test`` (the top-level conftest ignores this folder) because they
need `make demo-model` first and about two minutes of CPU. They run on their own, without the
top-level conftest and its session engine:

    .venv/bin/python -m pytest tests/real_model -v -p no:cacheprovider -c /dev/null --rootdir=tests/real_model --confcutdir=tests/real_model

As in tests/conftest.py, vLLM's AsyncLLM binds to the event loop of its first request, so requests
run on one loop in a background thread, and the engine is created in a worker thread.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[2]
ALIAS = "qwen2.5-0.5b-demo"

REPORT = pytest.StashKey[list[str]]()


@pytest.fixture(scope="session")
def report(pytestconfig) -> Callable[[str], None]:
    """Adds a line to the "real model" section printed after the results (numbers, not assertions)."""
    lines = pytestconfig.stash.setdefault(REPORT, [])
    return lines.append


def pytest_terminal_summary(terminalreporter, config):
    lines = config.stash.get(REPORT, [])
    if lines:
        terminalreporter.section("real model: measured on this machine")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def prepared(report):
    """The model folder `make demo-model` prepared in the configured data dir (a no-op re-check here)."""
    from app.engine.models.fetch import prepare_model
    from app.settings import load_settings

    data_dir = ROOT / load_settings().data_dir  # where `make demo-model` put it (PREFIXDESK_DATA_DIR or var/)
    result = prepare_model(ALIAS, data_dir=data_dir, log=lambda line: None)
    report(f"prepare_model on an already prepared folder: {result.seconds * 1000:.0f} ms "
           f"(already_prepared={result.already_prepared}, {result.size_bytes:,} bytes in {result.path})")
    return result


@pytest.fixture(scope="session")
def data_dir(prepared, tmp_path_factory) -> Path:
    """A fresh data dir whose models/ links to the prepared folder, as an operator's copy would."""
    data_dir = tmp_path_factory.mktemp("real-model")
    (data_dir / "models").mkdir()
    (data_dir / "models" / ALIAS).symlink_to(prepared.path, target_is_directory=True)
    return data_dir


@pytest.fixture(scope="session")
def settings(data_dir):
    from app.settings import load_settings

    # Defaults otherwise (max_model_len 4096, kv_cache_mib 256); greedy, so answers repeat.
    return load_settings(environ={}, model=ALIAS, data_dir=str(data_dir), templates_dir=str(ROOT / "templates"),
                         max_tokens=48, temperature=0.0)


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
    def run(coro: Coroutine, timeout: float = 300):
        return asyncio.run_coroutine_threadsafe(coro, engine_loop).result(timeout)

    return run


@pytest.fixture(scope="session")
def engine(settings, report):
    """The app's engine on the real model, created in a worker thread (see the module docstring)."""
    from app.engine import build_engine

    started = time.perf_counter()
    with ThreadPoolExecutor(1) as pool:
        engine = pool.submit(build_engine, settings).result()
    report(f"engine start (build_engine): {time.perf_counter() - started:.1f} s; kv_cache_mib {settings.kv_cache_mib} "
           f"= {engine.info.num_blocks} blocks of {engine.info.block_size} tokens")
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
def prompts(engine, settings):
    from app.core.prompts import PromptBuilder
    from app.engine import resolve_model_path

    return PromptBuilder(resolve_model_path(settings), max_model_len=settings.max_model_len,
                         max_tokens=settings.max_tokens, drop_oldest_turns=settings.drop_oldest_turns)
