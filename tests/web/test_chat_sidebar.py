"""The sidebar as a customer uses it: rename and delete a conversation (the next message then starts a new one),
long titles kept to two lines, and a topic published after the page opened offered when the picker opens."""

import uuid

from tests.helpers.browser import DESKTOP, assert_tidy, screenshot
from tests.helpers.chat_page import ask, caption, conversation, faults, open_chat, tag
from tests.helpers.waiting import wait_until


def test_rename_then_delete_and_the_next_message_starts_afresh(browser, server_url, db):
    page = open_chat(browser, server_url, DESKTOP)
    question = f"这是一个非常非常长的问题标题，用来看看侧栏里的标题会不会占满好几行文字，{tag()}"
    caption(page, ask(page, question, watch=False)).wait_for(timeout=60_000)
    conversation_id = conversation(db, question)[0]["conversation_id"]
    label = page.locator("#conversations label").filter(has_text=question[:10]).first
    label.wait_for(timeout=10_000)
    line_px = float(label.evaluate("l => parseFloat(getComputedStyle(l.querySelector('span')).lineHeight)"))
    assert label.locator("span").bounding_box()["height"] <= 2 * line_px + 1  # two lines at most

    title = f"我的退货 {tag()}"
    page.locator("#new-title textarea, #new-title input").first.fill(title)
    page.locator("#rename").click()
    page.locator("#conversations label").filter(has_text=title).wait_for(timeout=10_000)
    assert db["conversations"].get(conversation_id)["title"] == title
    assert_tidy(page)
    screenshot(page, "chat-renamed")

    page.locator("#delete").click()
    page.locator("#conversations label").filter(has_text=title).wait_for(state="detached", timeout=10_000)
    assert db["conversations"].get(conversation_id)["deleted_at"] is not None
    assert page.locator("#chatbot [data-testid=user]").count() == 0
    fresh = f"新的问题 {tag()}"
    caption(page, ask(page, fresh, watch=False)).wait_for(timeout=60_000)
    assert conversation(db, fresh)[0]["conversation_id"] != conversation_id
    assert faults(page) == []
    page.close()


def test_a_topic_published_after_the_page_opened_is_offered(browser, server_url, console, aio):
    page = open_chat(browser, server_url, DESKTOP)
    name = f"售后-{uuid.uuid4().hex[:6]}"
    aio(console.templates.create(name=name, text=f"{name}：七天无理由退货。", user="op", language="zh"))
    aio(console.templates.publish(name=name, version=1, user="op"))
    page.locator("#template input").click()
    option = page.locator("#template [data-testid=dropdown-option]").filter(has_text=name)
    wait_until(lambda: option.count() == 1, 10, f"{name} among the topics")
    page.close()
