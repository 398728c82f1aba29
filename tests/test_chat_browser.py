"""A customer in a real browser: chat, see the caption, restart the server, reopen the conversation."""

import re

import sqlite_utils

from conftest import OUTPUT_DIR, AppProcess, app_env


def test_customer_chats_and_reopens_the_conversation_after_a_restart(browser, tmp_path):
    env = app_env(tmp_path)
    server = AppProcess(env)
    try:
        server.wait_ready()
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(server.url)
        page.get_by_text("当前使用内置演示模型").wait_for()
        box = page.locator("#message textarea")
        box.fill("我刚买的手机屏幕碎了能退吗？")
        box.press("Enter")
        caption = page.get_by_text(re.compile(r"缓存命中 \d+ / \d+ 个提示 token")).first
        caption.wait_for(timeout=60_000)
        box.fill("那价格保护怎么申请？")
        box.press("Enter")
        page.get_by_text(re.compile(r"缓存命中 \d+ / \d+ 个提示 token")).nth(1).wait_for(timeout=60_000)
        page.screenshot(path=str(OUTPUT_DIR / "chat.png"), full_page=True)
        shown = [c.inner_text() for c in page.get_by_text(re.compile(r"缓存命中")).all()]
    finally:
        assert server.stop() == 0

    db = sqlite_utils.Database(tmp_path / "prefixdesk.db")
    rows = list(db["messages"].rows_where(order_by="id"))
    assert [(r["role"], r["status"]) for r in rows] == [("user", "ok"), ("assistant", "ok")] * 2
    assert len({r["conversation_id"] for r in rows}) == 1
    # The caption in the page is the stored row's numbers.
    second = rows[3]
    assert f"缓存命中 {second['num_cached_tokens']} / {second['prompt_tokens']} 个提示 token" in shown[-1]
    # The second turn starts with the whole first prompt, so at least its full blocks were reused.
    assert second["num_cached_tokens"] >= rows[1]["prompt_tokens"] // 32 * 32

    server = AppProcess(env)
    try:
        server.wait_ready()
        page.reload()
        page.locator("#conversations label").first.wait_for()
        page.locator("#conversations label").first.click()
        page.get_by_text("那价格保护怎么申请？").wait_for()
        page.get_by_text(f"缓存命中 {second['num_cached_tokens']} / {second['prompt_tokens']}").wait_for()
        page.screenshot(path=str(OUTPUT_DIR / "chat-reopened.png"), full_page=True)
        assert page.locator("#chatbot").get_by_text("我刚买的手机屏幕碎了能退吗？").count() == 1
    finally:
        assert server.stop() == 0


def test_html_and_script_in_a_message_render_inert(browser, server_url):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(server_url)
    attack = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script><b>bold?</b>'
    box = page.locator("#message textarea")
    box.fill(attack)
    box.press("Enter")
    page.get_by_text(re.compile(r"缓存命中 \d+ / \d+ 个提示 token")).first.wait_for(timeout=60_000)
    assert page.evaluate("window.__xss") is None  # neither the handler nor the script ran
    assert page.locator("#chatbot script").count() == 0
    assert page.locator("#chatbot img[onerror]").count() == 0
    page.screenshot(path=str(OUTPUT_DIR / "chat-xss.png"), full_page=True)
