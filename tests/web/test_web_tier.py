"""PREFIXDESK_WEB_PROCESSES=2 as an operator starts it: two web processes behind Caddy on one port, each browser
kept with its process by Caddy's cookie, over ONE vllm serve that ``python -m app`` starts on loopback. Two
browsers land on different processes and each keeps its conversation through its answers; a killed process is
started again and its browser goes on; /v1 answers through the proxy."""

from __future__ import annotations

import os
import signal

import httpx
import pytest
import sqlite_utils
from playwright.sync_api import Error as PlaywrightError

from tests.helpers.browser import DESKTOP
from tests.helpers.chat_page import ANSWERS, caption, conversation, open_chat, tag
from tests.helpers.cluster import free_port_run
from tests.helpers.servers import AppProcess, app_env
from tests.helpers.waiting import wait_until

START_TIMEOUT_S = 600  # the engine, then one process (it migrates and warms), the other, the proxy: 2 cores


@pytest.fixture(scope="module")
def tier(tmp_path_factory):
    data = tmp_path_factory.mktemp("tier")
    env = app_env(data, web_processes=2, tier_port=free_port_run(4), ui_language="en", rate_limit_per_minute=0,
                  max_streams_per_client=0, max_connections_per_client=0, max_tokens=16)
    server = AppProcess(env)
    try:
        server.wait_ready(START_TIMEOUT_S)
        yield server, data
    finally:
        assert server.stop() == 0, server.log()
    base = int(env["PREFIXDESK_TIER_PORT"])
    for port in (server.port, base, base + 1, base + 2):  # the proxy, both processes and the engine are gone
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{port}/", timeout=5)


def process_of(page) -> int:
    """The web process that serves this browser (its cookie), as /livez through the proxy names it."""
    return page.evaluate("fetch('/livez').then(r => r.json()).then(j => j.process)")


def chat_twice(page, db) -> tuple[list[tuple[str, str]], list[str]]:
    """Two questions in one conversation: the stored conversation as (role, text or status), and the questions."""
    first, second = f"Where is my parcel? {tag()}", f"And the invoice? {tag()}"
    for i, question in enumerate((first, second)):
        box = page.locator("#message textarea")
        box.fill(question)
        box.press("Enter")
        caption(page, i).wait_for(timeout=120_000)
    rows = conversation(db, first)
    return [(r["role"], r["text"] if r["role"] == "user" else r["status"]) for r in rows], [first, second]


def test_two_browsers_land_on_different_processes_and_each_keeps_its_conversation(tier, browser):
    server, data = tier
    db = sqlite_utils.Database(data / "prefixdesk.db")
    pages, processes = [], set()
    for _ in range(4):  # a browser without the cookie goes to the next process in turn
        context = browser.new_context(viewport=DESKTOP)
        page = open_chat(browser, server.url, DESKTOP, page=context.new_page())
        if (pid := process_of(page)) not in processes:
            processes.add(pid)
            pages.append(page)
        if len(pages) == 2:
            break
    assert len(processes) == 2
    for page in pages:
        pid = process_of(page)
        rows, (first, second) = chat_twice(page, db)
        assert rows == [("user", first), ("assistant", "ok"), ("user", second), ("assistant", "ok")]
        assert process_of(page) == pid  # the whole conversation went through one process
        assert page.locator(ANSWERS).count() == 2
        page.context.close()


def test_a_killed_process_is_started_again_and_its_browser_goes_on(tier, browser):
    server, data = tier
    db = sqlite_utils.Database(data / "prefixdesk.db")
    context = browser.new_context(viewport=DESKTOP)
    page = open_chat(browser, server.url, DESKTOP, page=context.new_page())
    first, second = f"Where is my parcel? {tag()}", f"And the invoice? {tag()}"
    box = page.locator("#message textarea")
    box.fill(first)
    box.press("Enter")
    caption(page, 0).wait_for(timeout=120_000)
    killed = process_of(page)
    restarts = server.log().count("exited with")
    os.kill(killed, signal.SIGKILL)
    # The next question goes to the other process (the proxy's health check took the dead one out), which
    # continues the open conversation: the page keeps it, and the session key opens it there too.
    box.fill(second)
    box.press("Enter")
    try:
        caption(page, 1).wait_for(timeout=120_000)
    except PlaywrightError:  # what the page and the proxy saw, for a failure on a machine one cannot watch
        lines = (data / "web" / "proxy.log").read_text().splitlines()
        warned = [line[:300] for line in lines if '"level":"warn"' in line or '"level":"error"' in line]
        pytest.fail(f"no answer after the kill; the page: {page.locator('#chatbot').inner_text()!r}; "
                    f"the proxy's last warnings: {warned[-5:]}")
    rows = conversation(db, first)
    assert [(r["role"], r["text"] if r["role"] == "user" else r["status"]) for r in rows] == [
        ("user", first), ("assistant", "ok"), ("user", second), ("assistant", "ok")]
    assert process_of(page) != killed
    assert page.locator("#chatbot [data-testid=user]").all_inner_texts() == [first, second]
    # The supervisor started the killed process again: both processes serve behind the proxy once more.
    wait_until(lambda: server.log().count("exited with") > restarts, 60, "the supervisor to see the process exit")
    ports = [int(server.env["PREFIXDESK_TIER_PORT"]) + i for i in range(2)]

    def both_up() -> bool:
        try:
            return all(httpx.get(f"http://127.0.0.1:{p}/healthz", timeout=5).status_code == 200 for p in ports)
        except httpx.HTTPError:
            return False

    wait_until(both_up, START_TIMEOUT_S, "the killed process to serve again", poll_s=1)
    context.close()


def test_v1_answers_through_the_proxy(tier):
    server, _ = tier
    body = {"model": "support-en", "messages": [{"role": "user", "content": f"Hello {tag()}"}], "max_tokens": 8}
    response = httpx.post(server.url + "v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    assert usage["completion_tokens"] > 0 and usage["prompt_tokens"] > usage["completion_tokens"]
    health = httpx.get(server.url + "healthz", timeout=10).json()
    assert (health["backend"], len(health["replicas"]), health["ready"]) == ("remote", 1, True)
