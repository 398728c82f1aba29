"""The sidebar as a customer uses it: rename and delete a conversation (the next message then starts a new one),
long titles kept to two lines, and a topic published after the page opened offered when the picker opens."""

import uuid

from tests.helpers.attack import config, dependency
from tests.helpers.browser import DESKTOP, assert_tidy, screenshot
from tests.helpers.chat_page import ask, caption, clock, conversation, faults, open_chat, tag
from tests.helpers.waiting import wait_until


def test_rename_then_delete_and_the_next_message_starts_afresh(browser, server_url, db):
    page = open_chat(browser, server_url, DESKTOP)
    question = f"这是一个非常非常长的问题标题，用来看看侧栏里的标题会不会占满好几行文字，{tag()}"
    caption(page, ask(page, question, watch=False)).wait_for(timeout=120_000)
    conversation_id = conversation(db, question)[0]["conversation_id"]
    label = page.locator("#conversations label").filter(has_text=question[:10]).first
    label.wait_for(timeout=90_000)
    line_px = float(label.evaluate("l => parseFloat(getComputedStyle(l.querySelector('span')).lineHeight)"))
    assert label.locator("span").bounding_box()["height"] <= 2 * line_px + 1  # two lines at most

    title = f"我的退货 {tag()}"
    page.locator("#new-title textarea, #new-title input").first.fill(title)
    page.locator("#rename").click()
    page.locator("#conversations label").filter(has_text=title).wait_for(timeout=90_000)
    assert db["conversations"].get(conversation_id)["title"] == title
    assert_tidy(page)
    screenshot(page, "chat-renamed")

    asked = []  # deleting asks first: taken back, nothing is deleted
    page.once("dialog", lambda dialog: (asked.append((dialog.type, dialog.message)), dialog.dismiss()))
    page.locator("#delete").click()
    assert asked == [("confirm", "确定删除这段对话吗？删除后无法恢复。")]
    renamed = f"{title} 2"  # an event after it comes back: the delete, had it gone, went before it
    page.locator("#new-title textarea, #new-title input").first.fill(renamed)
    page.locator("#rename").click()
    page.locator("#conversations label").filter(has_text=renamed).wait_for(timeout=90_000)
    assert db["conversations"].get(conversation_id)["deleted_at"] is None
    page.once("dialog", lambda dialog: (asked.append((dialog.type, dialog.message)), dialog.accept()))
    page.locator("#delete").click()
    assert len(asked) == 2
    page.locator("#conversations label").filter(has_text=title).wait_for(state="detached", timeout=90_000)
    assert db["conversations"].get(conversation_id)["deleted_at"] is not None
    assert page.locator("#chatbot [data-testid=user]").count() == 0
    fresh = f"新的问题 {tag()}"
    caption(page, ask(page, fresh, watch=False)).wait_for(timeout=120_000)
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
    wait_until(lambda: option.count() == 1, 30, f"{name} among the topics")
    page.close()


def test_a_question_sent_right_after_new_starts_a_new_conversation(browser, server_url, db):
    """However slowly the server empties the page after New (its request held here for 3 s), the next question
    begins a new conversation, not the one on screen."""
    fresh = dependency(config(server_url), "fresh")["id"]
    page = browser.new_page(viewport=DESKTOP)
    page.add_init_script(HOLD_JS.replace("FRESH", str(fresh)))
    page = open_chat(browser, server_url, DESKTOP, page=page)
    first, second = f"运费多少？{tag()}", f"发票怎么开？{tag()}"
    caption(page, ask(page, first, watch=False)).wait_for(timeout=120_000)
    page.locator("#new-conversation").click()
    ask(page, second, watch=False)  # at once, while New is still on its way
    wait_until(lambda: db["messages"].count_where("role = 'user' and text = ?", [second]) == 1, 60,
               "the second question to be stored")
    assert page.evaluate("window.__pdHeld") == 1  # New's request was held
    assert conversation(db, second)[0]["conversation_id"] != conversation(db, first)[0]["conversation_id"]
    assert [r["text"] for r in conversation(db, first) if r["role"] == "user"] == [first]
    assert faults(page) == []
    page.close()


# Holds the page's request for one event (FRESH: its fn_index) for 3 s before it leaves.
HOLD_JS = """
(() => {
  const send = window.fetch.bind(window);
  window.__pdHeld = 0;
  window.fetch = async (url, options) => {
    try {
      if (String(url).includes('queue/join') && JSON.parse(options.body).fn_index === FRESH) {
        window.__pdHeld += 1;
        await new Promise(r => setTimeout(r, 3000));
      }
    } catch (e) {}
    return send(url, options);
  };
})();
"""


def test_the_sidebar_says_when_in_the_customers_own_time_as_captions_do(browser, server_url, db):
    # The sidebar showed UTC (08:03) beside captions in the customer's time (16:03): both are the browser's now.
    context = browser.new_context(viewport=DESKTOP, timezone_id="Asia/Shanghai")  # 8 hours from UTC, no summer time
    try:
        page = open_chat(browser, server_url, page=context.new_page())
        question = f"几点发货？{tag()}"
        caption(page, ask(page, question, watch=False)).wait_for(timeout=120_000)
        started = db["conversations"].get(conversation(db, question)[0]["conversation_id"])["created_at"]
        local = clock(page, started)
        assert local != started[11:16]  # Shanghai's clock is not UTC's
        label = page.locator("#conversations label").filter(has_text=question[:5]).first
        label.wait_for(timeout=90_000)
        page.wait_for_function("([q, start]) => [...document.querySelectorAll('#conversations label')]"
                               ".some(l => l.innerText.includes(q) && l.innerText.trim().startsWith(start))",
                               arg=[question[:5], f"{local} · "], timeout=90_000)
        assert "UTC" not in label.inner_text()
        assert faults(page) == []
    finally:
        context.close()
