"""Stop, many times over, as an impatient customer presses it: in one page one answer after another, and across
pages. Each Stop keeps the partial answer (stored as stopped, shown with its mark), lists the conversation in the
sidebar at once, and leaves the page working: no "Error" badge, no toast, the box and the buttons usable. Only Stop
ends an answer: a reload mid-answer follows it to its end."""

import time

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from app.core.desk import STOPPED
from tests.helpers.browser import DESKTOP, PHONE, screenshot
from tests.helpers.chat_page import (ANSWERS, caption, conversation, database_of, events_of_gone_pages, faults,
                                     long_answers_server, open_chat, tag, wait_ready)
from tests.helpers.waiting import wait_until

STOPS_IN_ONE_PAGE = 20
PAGES = 10  # one Stop each, then a second page in the same browser context reopens it
# The first answer's text is on screen, and its caption is not: it is still being written.
UNCAPTIONED_TEXT = """() => {
    const g = document.querySelector('#chatbot .message.bot');
    return !!g && !g.querySelector('.thought-group') && g.innerText.trim().length > 0;
}"""


@pytest.fixture(scope="module")
def long_answers(services, engine_loop, tmp_path_factory):
    server = long_answers_server(services, engine_loop, tmp_path_factory.mktemp("stops"))
    with server as url:
        yield url, database_of(server), server


def stop_one(page, db, question: str, index: int, *, at_once: bool = False) -> dict:
    """Ask, press Stop at the answer's first text (``at_once``: right after Enter, while the question is on its
    way), and check what the page and the database then hold."""
    box = page.locator("#message textarea")
    box.fill(question)
    box.press("Enter")
    if at_once:
        page.locator("#chatbot [data-testid=user]").nth(index).wait_for(timeout=90_000)
    else:
        try:
            page.wait_for_function("""(i) => {
                const g = document.querySelectorAll('#chatbot .message.bot')[i];
                return g && !g.querySelector('.thought-group') && g.innerText.trim().length > 0;
            }""", arg=index, polling=20, timeout=120_000)
        except PlaywrightTimeoutError as error:  # what was lost on the way: the question, its answer, or the page
            shown = page.evaluate("""() => ({user: document.querySelectorAll('#chatbot [data-testid=user]').length,
                bot: [...document.querySelectorAll('#chatbot .message.bot')].map(g => g.innerText.slice(0, 80))})""")
            try:
                stored = [(r["role"], r["status"]) for r in conversation(db, question)]
            except ValueError:  # the question itself never stored
                stored = []
            raise AssertionError(f"Stop {index}: no first text in 120 s; the page shows {shown}, stores {stored}, "
                                 f"faults {faults(page)}") from error
    page.locator("#stop").click(force=True)
    caption(page, index).filter(has_text="Stopped").wait_for(timeout=120_000)  # once the stop is stored
    rows = conversation(db, question)
    assert rows[-2]["text"] == question
    row = rows[-1]
    page.locator("#conversations label").first.wait_for(timeout=90_000)
    assert faults(page) == [], f"after Stop {index}: {faults(page)}"
    return row


def test_thirty_stops_never_break_the_page(browser, long_answers, engine, held_answers):
    # Each answer is held at its first text (held_answers): every Stop comes before its end, however slow the machine.
    url, db, _ = long_answers
    started = time.monotonic()
    page = open_chat(browser, url, DESKTOP)
    first = f"Tell me everything about returns. {tag()}"
    for i in range(STOPS_IN_ONE_PAGE):
        question = first if i == 0 else f"And then? {i} {tag()}"
        row = stop_one(page, db, question, i, at_once=i % 2 == 1)
        assert (row["status"], row["error"]) == ("stopped", STOPPED)
        assert page.locator(ANSWERS).count() == i + 1
    # One conversation, every question in it, every answer stopped; the sidebar lists it once.
    rows = conversation(db, first)
    assert [(r["role"], r["status"]) for r in rows] == [("user", "ok"), ("assistant", "stopped")] * STOPS_IN_ONE_PAGE
    assert page.locator("#conversations label").count() == 1
    assert page.locator("#chatbot [data-testid=user]").count() == STOPS_IN_ONE_PAGE
    screenshot(page, "chat-many-stops")
    page.close()

    for n in range(PAGES):
        viewport = PHONE if n % 2 else DESKTOP
        page = open_chat(browser, url, viewport)
        question = f"Explain the warranty, step by step. {n} {tag()}"
        row = stop_one(page, db, question, 0, at_once=n % 2 == 1)
        assert (row["status"], row["error"]) == ("stopped", STOPPED)
        page.close()
    wait_until(lambda: engine.num_unfinished_requests() == 0, 30, "vLLM to drop the last request")
    print(f"{STOPS_IN_ONE_PAGE + PAGES} stops in {time.monotonic() - started:.1f} s")


def test_a_reload_mid_answer_follows_the_answer_to_its_end_and_never_stops_it(browser, long_answers, held_answers):
    # Only Stop ends an answer: a page reloaded while its answer streams shows the answer going on (held at its first
    # text until the server has seen the old page go), then the answer as stored, whole.
    url, db, server = long_answers
    page = open_chat(browser, url)
    question = f"Explain the warranty, step by step. reload {tag()}"
    box = page.locator("#message textarea")
    box.fill(question)
    box.press("Enter")
    page.wait_for_function(UNCAPTIONED_TEXT, timeout=120_000)
    page.reload()
    wait_ready(page)
    page.wait_for_function(UNCAPTIONED_TEXT, timeout=120_000)  # the answer so far, followed
    assert page.locator("#chatbot [data-testid=user]").all_inner_texts() == [question]
    # The server knows the old page has gone while the answer is held: its next update closes the old page's event.
    wait_until(lambda: events_of_gone_pages(server.app) == 1, 60, "the server to see the old page go")
    assert [r["status"] for r in conversation(db, question)] == ["ok", "generating"]
    held_answers.release()
    caption(page, 0).filter(has_text="Answered").wait_for(timeout=120_000)  # the answer as stored
    rows = conversation(db, question)
    assert [(r["role"], r["status"], r["error"]) for r in rows] == [("user", "ok", None), ("assistant", "ok", None)]
    assert rows[1]["output_tokens"] == 750  # whole
    assert page.locator(ANSWERS).count() == 1
    assert faults(page) == []
    page.close()
