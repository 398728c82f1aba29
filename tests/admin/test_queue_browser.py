"""The person queue calls: with the console open on any tab, a customer who asks for a person puts "(1)" in the
browser tab's title; with "Notify me" on (kept in this browser per operator) the page asked for notifications,
and each customer who starts waiting chimes once and shows one notification — not again at the next checks,
nor when one of them is taken; the header names the longest waiting first, each wait in minutes."""

from datetime import timedelta

import pytest

from admin.i18n import TEXT
from app.db import conversations as db_conversations
from app.db.models import Conversation, utcnow
from tests.helpers.browser import DESKTOP, assert_tidy, screenshot
from tests.helpers.servers import SecondServer, collect, operator

OPERATOR = ("op-queue", "the queue calls 7")
# Records every Notification the page constructs and every time it asks for permission (the real ones still run).
RECORD_JS = """(() => {
  const Real = window.Notification;
  window.__pdNotices = []; window.__pdAsked = 0;
  if (!Real) return;
  const Recorded = function (title, options) {
    window.__pdNotices.push([title, (options || {}).body || '', (options || {}).tag || '']);
    return new Real(title, options);
  };
  Recorded.requestPermission = (...args) => { window.__pdAsked++; return Real.requestPermission(...args); };
  Object.defineProperty(Recorded, 'permission', {get: () => Real.permission});
  window.Notification = Recorded;
})();"""
# Counts the page's checks and its chimes (the real chime still plays).
COUNT_JS = """() => {
  const q = window.pdQueue, chime = q.chime, update = q.update;
  q.chimes = 0; q.checks = 0;
  q.chime = (...args) => { q.chimes++; return chime(...args); };
  q.update = (...args) => { q.checks++; return update(...args); };
}"""


@pytest.fixture
def queue_server(services, engine_loop, tmp_path):
    """A server of its own: the queue it counts holds only this test's customers."""
    server = SecondServer(services, engine_loop, tmp_path)
    with server as url:
        yield server, url


def waiting_customer(aio, app, session_key: str) -> int:
    """A customer's conversation (one short answer), handed to a person as the chat's button does."""
    template = app.catalog.customer_facing()[0].name
    events = aio(collect(app.desk.answer(session_key=session_key, client="192.0.2.60", template_name=template,
                                         message="where is my parcel?", max_tokens=3, ignore_eos=True)))
    conversation_id = events[-1].message.conversation_id
    assert aio(app.desk.request_person(session_key=session_key, conversation_id=conversation_id))
    return conversation_id


def asked_ago(aio, app, conversation_id: int, minutes: int) -> None:
    """Back-date when the customer asked for a person (what a long wait looks like, without the wait)."""
    def set_at(s, *, conversation_id: int) -> None:
        s.get(Conversation, conversation_id).handoff_requested_at = utcnow() - timedelta(minutes=minutes)

    aio(app.db.write(set_at, conversation_id=conversation_id))


def wait_title(page, title: str) -> None:
    page.wait_for_function("(title) => document.title === title", arg=title, timeout=120_000)


def checks(page) -> int:
    return page.evaluate("window.pdQueue.checks")


def test_a_customer_who_asks_for_a_person_calls_the_console(browser, aio, queue_server):
    server, url = queue_server
    app = server.services
    t = TEXT[server.settings.ui_language]
    account = operator(app, *OPERATOR)
    context = browser.new_context(viewport=DESKTOP)
    context.grant_permissions(["notifications"], origin=url.rstrip("/"))
    context.add_init_script(RECORD_JS)
    page = context.new_page()
    page.goto(url + "admin")
    page.locator("#username").fill(account[0])
    page.locator("#password").fill(account[1])
    page.locator("button[type=submit]").click()
    page.wait_for_url(url + "admin/")
    page.wait_for_function("() => window.pdQueue && window.pdQueue.operator", timeout=120_000)  # the load's check
    assert page.title() == t["title"]  # nobody waits
    assert page.locator("#pd-queue").inner_text().strip() == ""
    page.evaluate(COUNT_JS)

    page.locator("#pd-notify input").check()  # the operator's click: the page asks for notifications
    page.wait_for_function("() => window.__pdAsked === 1", timeout=90_000)
    assert page.evaluate(f"localStorage.getItem('prefixdesk-notify:{OPERATOR[0]}')") == "on"

    first = waiting_customer(aio, app, "customer-queue-1")
    wait_title(page, f"(1) {t['title']}")
    assert page.evaluate("window.pdQueue.chimes") == 1
    assert page.evaluate("window.__pdNotices") == [
        [t["queue_notice_title"], t["queue_notice_body"].format(id=first), f"prefixdesk-{first}"]]
    seen = checks(page)
    page.wait_for_function(f"() => window.pdQueue.checks >= {seen + 2}", timeout=120_000)  # two more checks
    assert (page.title(), page.evaluate("window.pdQueue.chimes"), len(page.evaluate("window.__pdNotices"))) == (
        f"(1) {t['title']}", 1, 1)  # the same customer does not call again

    second = waiting_customer(aio, app, "customer-queue-2")
    asked_ago(aio, app, first, 3)
    asked_ago(aio, app, second, 10)  # the second has waited longest: named first
    wait_title(page, f"(2) {t['title']}")
    assert page.evaluate("window.pdQueue.chimes") == 2
    assert [n[1] for n in page.evaluate("window.__pdNotices")] == [
        t["queue_notice_body"].format(id=first), t["queue_notice_body"].format(id=second)]
    items = " · ".join([t["queue_item"].format(id=second, wait=t["queue_minutes"].format(m=10)),
                        t["queue_item"].format(id=first, wait=t["queue_minutes"].format(m=3))])
    expected = t["queue_line"].format(n=2, items=items).replace("**", "")
    page.wait_for_function("(line) => document.querySelector('#pd-queue').innerText.trim() === line",
                           arg=expected, timeout=90_000)
    assert_tidy(page)
    screenshot(page, "console-queue")

    aio(app.db.write(db_conversations.take, conversation_id=second, operator=OPERATOR[0]))
    wait_title(page, f"(1) {t['title']}")
    assert (page.evaluate("window.pdQueue.chimes"), len(page.evaluate("window.__pdNotices"))) == (2, 2)

    page.reload()  # the choice is this operator's in this browser: still on after a reload
    page.wait_for_function("() => window.pdQueue && window.pdQueue.operator", timeout=120_000)
    page.wait_for_function("() => document.querySelector('#pd-notify input').checked", timeout=90_000)
    assert page.title() == f"(1) {t['title']}"
    context.close()
