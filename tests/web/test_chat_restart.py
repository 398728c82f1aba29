"""A server restart under an open page, as customers met it: the page keeps what it shows and what is typed
(Gradio reloads it once the server is back: the open conversation and the unsent text come back from the
browser), an earlier conversation opens from the sidebar though the new server never listed it for this page,
the next message continues the open conversation, and while the server is down the page says so in the
customer's language."""

import sqlite_utils

from tests.helpers.browser import DESKTOP, screenshot
from tests.helpers.chat_page import ANSWERS, READY, caption, conversation, faults, open_chat, tag
from tests.helpers.servers import AppProcess, app_env


def questions_shown(page) -> list[str]:
    return page.locator("#chatbot [data-testid=user]").all_inner_texts()


def test_a_restarted_server_breaks_nothing_on_an_open_page(browser, tmp_path):
    env = app_env(tmp_path, ui_language="zh", warm_on_start=False)  # (nothing here needs a warm cache)
    server = AppProcess(env)
    try:
        server.wait_ready()
        page = open_chat(browser, server.url, DESKTOP)
        earlier, open_q = f"发票怎么开？{tag()}", f"退货运费谁出？{tag()}"
        for question in (earlier, open_q):
            page.locator("#new-conversation").click()
            box = page.locator("#message textarea")
            box.fill(question)
            box.press("Enter")
            caption(page, 0).wait_for(timeout=120_000)
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
        rows = conversation(sqlite_utils.Database(tmp_path / "prefixdesk.db"), earlier)
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
