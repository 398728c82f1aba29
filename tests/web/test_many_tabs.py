"""Many tabs of one browser: a browser speaking HTTP/1.1 holds six connections per host, and each open page held
one (Gradio's heartbeat stream), so with six tabs open (chat or console) a seventh stayed on "loading" until two
were closed. The pages now say they are alive in short requests (app/web/sessions.py): eight tabs, chat and
console, load and answer, each page's session is known alive, and one closed says so at once."""

from __future__ import annotations

from starlette.routing import Mount

from tests.helpers.browser import DESKTOP, admin_page
from tests.helpers.chat_page import caption, faults, open_chat, tag
from tests.helpers.servers import SecondServer, operator
from tests.helpers.waiting import wait_until

CHAT_TABS, CONSOLE_TABS = 6, 2


def test_eight_tabs_of_one_browser_load_answer_and_a_closed_one_says_so(browser, services, engine_loop, tmp_path):
    second = SecondServer(services, engine_loop, tmp_path)
    with second as url:
        chat = next(r.app for r in second.app.routes if isinstance(r, Mount) and r.path == "").blocks
        context = browser.new_context(viewport=DESKTOP)
        try:
            account = operator(second.services, "tabs-op", "the operator's tabs 8")
            consoles = [admin_page(browser, url, account, context=context, **DESKTOP)]
            for _ in range(CONSOLE_TABS - 1):  # logged in already: the console opens at once
                consoles.append(context.new_page())
                consoles[-1].goto(url + "admin/")
                consoles[-1].locator("#templates-table").wait_for(timeout=120_000)
            pages = [open_chat(browser, url, DESKTOP, page=context.new_page()) for _ in range(CHAT_TABS)]
            for page in (pages[0], pages[-1]):  # the first tab and the eighth both answer
                box = page.locator("#message textarea")
                box.fill(f"Where is my parcel? {tag()}")
                box.press("Enter")
                caption(page, 0).wait_for(timeout=120_000)
                assert faults(page) == []
            assert len(consoles) == CONSOLE_TABS and all(c.locator("#templates-table").count() for c in consoles)
            hashes = [page.evaluate("window.__gradio_session_hash__") for page in pages]
            assert len(set(hashes)) == CHAT_TABS and all(h in chat.state_holder.session_data for h in hashes)
            pages[0].close(run_before_unload=True)
            wait_until(lambda: hashes[0] not in chat.state_holder.session_data, 60, "the closed tab's session to end")
            assert all(h in chat.state_holder.session_data for h in hashes[1:])
        finally:
            context.close()
