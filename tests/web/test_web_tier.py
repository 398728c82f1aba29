"""PREFIXDESK_WEB_PROCESSES=2 as an operator starts it: two web processes behind Caddy on one port, each browser
kept with its process by Caddy's cookie, over ONE vllm serve that ``python -m app`` starts on loopback. Two
browsers land on different processes and each keeps its conversation through its answers; a killed process is
started again and its browser goes on; /v1 answers through the proxy.

Last, a web process of its own on the tier's engine is restarted under an open page: what customers meet when an
operator restarts the server."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import sqlite_utils
from playwright.sync_api import Error as PlaywrightError

from app.cluster.processes import check_ports
from app.cluster.tier import TierPlan, plan_tier
from app.settings import load_settings

from tests.helpers.browser import DESKTOP, screenshot
from tests.helpers.chat_page import ANSWERS, READY, caption, conversation, faults, open_chat, tag
from tests.helpers.cluster import free_port_run
from tests.helpers.servers import AppProcess, app_env
from tests.helpers.waiting import wait_until

ENGINE_KEY = "the tier's engine key 7"  # an operator's own (else the supervisor makes one up)
START_TIMEOUT_S = 600  # the engine, then one process (it migrates and warms), the other, the proxy: 2 cores


@dataclass(frozen=True)
class Tier:
    server: AppProcess  # the supervisor; its url is the proxy's
    data: Path
    plan: TierPlan  # where the product puts each process (the same settings plan the same ports)


@pytest.fixture(scope="module")
def tier(tmp_path_factory):
    """Two web processes behind Caddy over one vllm serve, in English, with the answers short; and its plan."""
    data = tmp_path_factory.mktemp("tier")
    env = app_env(data, web_processes=2, tier_port=free_port_run(4), ui_language="en", rate_limit_per_minute=0,
                  max_streams_per_client=0, max_connections_per_client=0, max_tokens=16, engine_api_key=ENGINE_KEY)
    server = AppProcess(env)
    plan = plan_tier(load_settings(environ=env), "model", processes=2, gpu_count=0, cpus=(0, 1))
    try:
        server.wait_ready(START_TIMEOUT_S)
        yield Tier(server, data, plan)
    finally:
        assert server.stop() == 0, server.log()
    check_ports(plan)  # the proxy, both processes, the engine and its KV events are gone: their ports are free


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
    server, db = tier.server, sqlite_utils.Database(tier.data / "prefixdesk.db")
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
    server, db = tier.server, sqlite_utils.Database(tier.data / "prefixdesk.db")
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
        lines = tier.plan.proxy.log_path.read_text().splitlines()
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

    def both_up() -> bool:
        try:
            return all(httpx.get(w.health_url, timeout=5).status_code == 200 for w in tier.plan.workers)
        except httpx.HTTPError:
            return False

    wait_until(both_up, START_TIMEOUT_S, "the killed process to serve again", poll_s=1)
    context.close()


def test_v1_answers_through_the_proxy(tier):
    server = tier.server
    body = {"model": "support-en", "messages": [{"role": "user", "content": f"Hello {tag()}"}], "max_tokens": 8}
    response = httpx.post(server.url + "v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    assert usage["completion_tokens"] > 0 and usage["prompt_tokens"] > usage["completion_tokens"]
    health = httpx.get(server.url + "healthz", timeout=10).json()
    assert (health["backend"], len(health["replicas"]), health["ready"]) == ("remote", 1, True)


def questions_shown(page) -> list[str]:
    return page.locator("#chatbot [data-testid=user]").all_inner_texts()


def test_a_restarted_server_breaks_nothing_on_an_open_page(tier, browser, tmp_path):
    """The page keeps what it shows and what is typed (Gradio reloads it once the server is back: the open
    conversation and the unsent text come back from the browser), an earlier conversation opens from the sidebar
    though the new server never listed it for this page, the next message continues the open conversation, and
    while the server is down the page says so in the customer's language. The server is ``python -m app`` on the
    tier's engine (a web process starts in seconds; the engine's own restart has tests/web/test_faults.py)."""
    engine_url = tier.plan.engine.url
    env = app_env(tmp_path, ui_language="zh", engine="remote", engine_url=engine_url, replica_urls=engine_url,
                  engine_api_key=ENGINE_KEY, warm_on_start=False)  # (nothing here needs a warm cache)
    server = AppProcess(env)
    try:
        server.wait_ready()
        page = open_chat(browser, server.url, DESKTOP)
        earlier, open_q = f"发票怎么开？{tag()}", f"退货运费谁出？{tag()}"
        db = sqlite_utils.Database(tmp_path / "prefixdesk.db")
        for question in (earlier, open_q):
            page.locator("#new-conversation").click()
            box = page.locator("#message textarea")
            box.fill(question)
            box.press("Enter")
            # This question alone on the page, then its caption: a busy page may still show the last conversation
            # (and its caption) for a while after the click, and the server must not stop before this answer ends.
            page.wait_for_function("(q) => [...document.querySelectorAll('#chatbot [data-testid=user]')]"
                                   ".map(m => m.innerText.trim()).join() === q", arg=question, timeout=90_000)
            caption(page, 0).wait_for(timeout=120_000)
            assert [(r["role"], r["status"]) for r in conversation(db, question)] == [("user", "ok"),
                                                                                     ("assistant", "ok")]
        box.press_sequentially("还有一个问题没发")
        assert server.stop() == 0

        # Down: sending keeps the text, and the page says so in Chinese, not Gradio's English.
        page.locator("#send").click()
        page.locator("[data-testid=toast-body]").filter(has_text="暂时连不上客服").wait_for(timeout=90_000)
        page.wait_for_function("document.querySelector('#message textarea').value === '还有一个问题没发'")
        screenshot(page, "chat-offline")

        # Gradio reloads the page once it reaches the server again: the open conversation and the text are back.
        # (Waited for as a navigation: the page from before the restart still shows the conversation.)
        with page.expect_navigation(timeout=240_000):
            server = AppProcess(env)
            server.wait_ready()
        page.wait_for_function(f"({READY}) && document.querySelectorAll('#chatbot [data-testid=user]').length",
                               timeout=120_000)
        page.wait_for_function("document.querySelector('#message textarea').value === '还有一个问题没发'",
                               timeout=90_000)
        assert questions_shown(page) == [open_q]
        assert page.locator("#conversations input:checked").count() == 1  # the open one is marked

        # The earlier conversation opens from the sidebar (the new server's Radio had no choices for this page).
        page.locator("#conversations label").filter(has_text=earlier).click()
        page.wait_for_function("(q) => [...document.querySelectorAll('#chatbot [data-testid=user]')]"
                               ".map(m => m.innerText.trim()).join() === q", arg=earlier, timeout=90_000)
        follow_up = f"要多久？{tag()}"
        box.fill(follow_up)
        box.press("Enter")
        caption(page, 1).wait_for(timeout=120_000)
        rows = conversation(db, earlier)
        assert [(r["role"], r["text"] if r["role"] == "user" else r["status"]) for r in rows] == [
            ("user", earlier), ("assistant", "ok"), ("user", follow_up), ("assistant", "ok")]
        assert questions_shown(page) == [earlier, follow_up]
        assert page.locator(ANSWERS).count() == 2
        seen = [f for f in faults(page) if "暂时连不上客服" not in f and "连接中断" not in f]
        assert seen == [], seen
        screenshot(page, "chat-after-restart")
        page.close()
    finally:
        server.stop()
