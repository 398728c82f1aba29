"""Shared fixtures: the real vLLM (CPU build) engine with the demo model, started once per session,
a real SQLite file, and a real server on a free port. No mocks of vLLM or of the database. What
tests import lives in ``tests.helpers``, never here.

vLLM's AsyncLLM binds to the event loop of its first request, so everything that talks to the
engine — direct test calls and the uvicorn server alike — runs on one loop in a background thread;
tests hand it coroutines through ``aio``.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Coroutine

import pytest
from _pytest.nodeid import coerce_node_id

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tests.helpers.browser import CHROMIUM, CHROMIUM_ARGS  # noqa: E402  (after the environment above)
from tests.helpers.servers import (EDGE_LIMITS, EDGE_OPERATOR, OUTPUT_DIR, SERVER_START_S, AppProcess,  # noqa: E402
                                   SecondServer, app_env, serving, settings_for, start_services)
from tests.helpers.waiting import wait_until  # noqa: E402

collect_ignore = ["real_model"]  # `make test-real-model` runs those, on the real model it prepares

# `make test` runs two pytest-xdist workers (pyproject.toml's addopts: `-n 2 --dist loadgroup`): a third of a run's
# time the two cores stood idle while one test waited for a timeout, a paced answer or a restart, and the other
# worker's tests take that time. Each work unit below goes to one worker whole, so a module's fixtures start once,
# and so do the expensive session fixtures that several modules share (each worker has its own session engine,
# server and browser).
SHARED_FIXTURES = ("cluster", "tiny_models", "edge", "proxied", "limited")
# The longest units go out first (the scheduler hands units out in collection order, two to each worker, then one
# whenever a worker is nearly done), so that no long unit starts last while the other worker sits idle.
LONGEST_FIRST = ("cluster", "tiny_models", "tests/web/test_web_tier.py", "tests/web/test_faults.py", "edge",
                 "tests/bench/test_bench.py", "tests/engine/test_eviction.py", "proxied")


def pytest_collection_modifyitems(config, items):
    used: dict[str, set[str]] = {}  # module -> the shared fixtures its tests use
    for item in items:
        used.setdefault(item.module.__name__, set()).update(set(item.fixturenames) & set(SHARED_FIXTURES))
    unit = {item: next((name for name in SHARED_FIXTURES if name in used[item.module.__name__]),
                       item.nodeid.split("::")[0]) for item in items}
    for item in items:
        item.add_marker(pytest.mark.xdist_group(unit[item]))
        if getattr(config.option, "loadgroup", False):
            # pytest-xdist 3.8 names a test's unit by suffixing its node id ("…::test@unit") through
            # ``item._nodeid``, which pytest 9.2 no longer reads (it keeps ``_id``): every test was its own unit,
            # so a module's tests, and the cluster's, were spread over both workers, each starting its own copy.
            item._id = coerce_node_id(f"{item.nodeid}@{unit[item]}")
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(unit[item], len(rank)))  # stable: each module's order is kept
    _LAST_USER.update({name: item.nodeid for item in items for name in SHARED_FIXTURES if name in item.fixturenames})


# Servers that session fixtures start for a few modules stop when the last test of the run that uses them ends, not
# with the session: an idle server's Gradio queues and timers take a few percent of a core for the rest of the run.
# A worker runs its unit's tests in collection order, and each shared fixture's tests are in one unit.
_LAST_USER: dict[str, str] = {}  # fixture -> the node id of the last test that uses it
_STOP_AFTER_LAST_USE: dict[str, Callable[[], None]] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    for name in [name for name in _STOP_AFTER_LAST_USE if _LAST_USER.get(name) == item.nodeid]:
        _STOP_AFTER_LAST_USE.pop(name)()


def _stopped_after_last_use(name: str, stop: Callable[[], None]) -> Callable[[], None]:
    """``stop``, run once: after the last test that uses the fixture ``name``, or at the fixture's own end."""
    stopped = []

    def once() -> None:
        if not stopped:
            stopped.append(True)
            stop()

    _STOP_AFTER_LAST_USE[name] = once
    return once


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
    return settings_for(tmp_path_factory.mktemp("prefixdesk"))


@pytest.fixture(scope="session")
def services(settings):
    services = start_services(settings)
    yield services
    services.close()


@pytest.fixture(scope="session")
def engine(services):
    return services.engine


@pytest.fixture
def held_answers(monkeypatch, services):
    """Every answer of the session's engine held after its first text until the test releases it (at its end if
    not before): tests/helpers/desks.py."""
    from tests.helpers.desks import HeldAnswers

    held = HeldAnswers(monkeypatch, services.engine)
    yield held
    held.release()


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


@pytest.fixture(scope="session")
def server_url(services, engine_loop):
    """A real uvicorn server for the app, on the engine's loop, on a free port."""
    import uvicorn

    from app.server import create_app, uvicorn_config

    config = uvicorn_config(create_app(services), services.settings, timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    future = asyncio.run_coroutine_threadsafe(server.serve(), engine_loop)
    wait_until(lambda: serving(server, future, services), SERVER_START_S, "the server to start")
    yield f"http://127.0.0.1:{services.settings.port}/"
    server.should_exit = True
    future.result(timeout=30)


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
        yield PatientBrowser(browser)
        browser.close()


@pytest.fixture(autouse=True)
def pages_closed_after_each_test(request):
    """Every page and context a test opened in the session's browser is closed when it ends, passed or failed: a
    failed test left its page open (streaming a long answer, polling), and on a machine busy with other work the
    pages a run had piled up starved the browser until a later test's visible button took 90 s to answer. The
    answers of its closed pages end before the next test begins."""
    if "browser" not in request.fixturenames:
        yield
        return
    browser = request.getfixturevalue("browser")
    before = {id(getattr(c, "_impl_obj", c)) for c in browser.contexts}  # a module's own page stays open
    yield
    for context in browser.contexts:
        if id(getattr(context, "_impl_obj", context)) not in before:
            context.close()
    # An answer whose page closed is still written to its end (app/core/answering.py): the next test starts on a
    # quiet engine with every answer stored (one that reads the engine's figures or counts the stored answers would
    # count this test's).
    services = request.getfixturevalue("services")
    wait_until(lambda: services.engine.num_unfinished_requests() == 0 and services.desk.answers_in_progress() == 0,
               600, "the answers of the test's closed pages to end")


PATIENCE_MS = 90_000  # a wait that names no timeout, on a 2-core machine with two busy loops beside the suite


class PatientBrowser:
    """The browser, whose pages and contexts wait PATIENCE_MS where a call names no timeout (Playwright's own
    30 s ran out for a plain locator on a machine starved by other work: a wait is for a state, not a time)."""

    def __init__(self, browser):
        self._browser = browser

    def __getattr__(self, name):
        return getattr(self._browser, name)

    def new_context(self, **options):
        context = self._browser.new_context(**options)
        context.set_default_timeout(PATIENCE_MS)
        return context

    def new_page(self, **options):
        page = self._browser.new_page(**options)
        page.set_default_timeout(PATIENCE_MS)
        return page


@pytest.fixture(scope="session")
def console(services):
    """The console's services, as the server builds them (templates, access, meter)."""
    from admin.access import AdminAccess
    from admin.context import build_admin_context

    access = AdminAccess(services.db, ttl_s=3600, free_attempts=5)
    return build_admin_context(settings=services.settings, db=services.db, engine=services.engine, desk=services.desk,
                         catalog=services.catalog, access=access)


# -- servers as an attacker meets them (tests/security) -------------------------------------------------


@pytest.fixture(scope="session")
def proxied(services, engine_loop, tmp_path_factory):
    """A server behind a trusted reverse proxy on 127.0.0.1 that names tenants in X-Tenant, with an operator."""
    yield from _served_until_last_use("proxied", SecondServer(
        services, engine_loop, tmp_path_factory.mktemp("proxied"), trusted_proxies="127.0.0.1",
        tenant_header="X-Tenant", admin_password="operator passphrase 9", admin_login_attempts=3))


@pytest.fixture(scope="session")
def limited(services, engine_loop, tmp_path_factory):
    """A server with the per-client limits an operator would set: 3 messages a minute, 2 streams at once."""
    yield from _served_until_last_use("limited", SecondServer(
        services, engine_loop, tmp_path_factory.mktemp("limited"), rate_limit_per_minute=3, max_streams_per_client=2,
        max_tokens=600))


def _served_until_last_use(name: str, server: SecondServer):
    """The URL of ``server`` (a SecondServer, entered here) for the fixture ``name``, stopped after its last test."""
    url = server.__enter__()
    stop = _stopped_after_last_use(name, lambda: server.__exit__(None, None, None))
    try:
        yield url
    finally:
        stop()


@pytest.fixture(scope="session")
def edge(tmp_path_factory):
    """``python -m app`` as an operator starts it (a process of its own, so its file descriptors and its log
    can be counted), started with a soft file limit of 1,024, with an operator and tight connection limits."""
    server = AppProcess(app_env(tmp_path_factory.mktemp("edge"), admin_password=EDGE_OPERATOR[1],
                                **{k: str(v) for k, v in EDGE_LIMITS.items()}), nofile_soft=1024)
    stop = _stopped_after_last_use("edge", server.stop)
    try:
        server.wait_ready()
        yield server
    finally:
        stop()


# -- the Baichuan2 plugin's tests ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def baichuan_plugin(tmp_path_factory) -> None:
    """The plugin's entry point, visible to this process and every process it starts."""
    from tests.helpers.baichuan import make_plugin_visible

    make_plugin_visible(tmp_path_factory.mktemp("plugin-dist"))


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """The tiny checkpoint of each kind ("7b": RoPE, safetensors; "13b": ALiBi, pytorch .bin)."""
    from tests.helpers.baichuan import build_tiny_models

    return build_tiny_models(tmp_path_factory.mktemp("tiny-baichuan"))
