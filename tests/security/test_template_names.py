"""Attack: a template whose name is markup, rendered in the console of every operator who opens it.

Before: a template named ``<img src=http://…>`` made the console fetch that image (and a Markdown
``![](http://…)`` name did the same) wherever the name was shown as Markdown: the status line, the
warmup summary, the editor's info line.
After: every name the console writes into Markdown or HTML is escaped as literal text
(admin/markup.py; the cache tree already escaped its HTML), and the page's
Content-Security-Policy would block a remote image anyway: this test looks for the element too.
"""

from __future__ import annotations

import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.helpers.browser import open_tab
from tests.helpers.servers import operator

ACCOUNT = ("op-names", "operator names 58")


@pytest.fixture(scope="module")
def remote_host():
    """A web server on 127.0.0.9 standing for the attacker's: the paths anything asked it for."""
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append(self.path)
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.9", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.9:{server.server_address[1]}", asked
    server.shutdown()


def test_a_template_named_with_markup_fetches_nothing_in_the_console(browser, server_url, services, console, aio,
                                                                    remote_host):
    remote, asked = remote_host
    tag = uuid.uuid4().hex[:4]
    names = [f'<img src="{remote}/html-{tag}.png">', f"![x]({remote}/md-{tag}.png)"]
    for name in names:
        aio(console.templates.create(name=name, text=f"Rules {tag} for {name}.", user="seed", language="en"))
        aio(console.templates.publish(name=name, version=1, user="seed"))
    operator(services, *ACCOUNT)
    context = browser.new_context()
    requests: list[str] = []
    context.on("request", lambda request: requests.append(request.url))
    page = context.new_page()
    page.goto(server_url + "admin")
    page.locator("#username").fill(ACCOUNT[0])
    page.locator("#password").fill(ACCOUNT[1])
    page.locator("button[type=submit]").click()
    table = page.locator("#templates-table")
    table.get_by_text(names[0], exact=True).last.wait_for(timeout=120_000)  # the name, shown as text
    for name in names:
        edit = page.locator("#edit-template input")
        edit.fill(name)
        edit.press("Enter")
        page.locator("#template-info").get_by_text("v1").first.wait_for(timeout=90_000)
        page.locator("#save").click()  # the status line names the template
        page.locator("#template-status").get_by_text(name, exact=False).wait_for(timeout=90_000)
    open_tab(page, "warmup")
    page.locator("#warm").click()  # warm all: the summary and the rows name every template
    page.locator("#warm-results").get_by_text(names[1], exact=True).last.wait_for(timeout=120_000)
    open_tab(page, "cache")
    page.wait_for_timeout(2500)
    open_tab(page, "audit")
    page.locator("#audit-table").get_by_text(names[0], exact=True).last.wait_for(timeout=90_000)
    assert page.locator(f"img[src^='{remote}']").count() == 0
    assert [u for u in requests if u.startswith(remote)] == []
    assert asked == []
    context.close()
    for name in names:
        aio(console.templates.delete(name=name, user="seed"))
