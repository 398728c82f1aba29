"""The chat's topics and questions as a customer meets them in chromium: the topic picker by the title (a phone
shows it too) with each topic's title, its suggested questions on an empty chat (a click asks one as if typed),
the last question edited and asked again, the thumbs still marked after a reload, the time each answer began in
the customer's own clock."""

from datetime import datetime, timezone
from zoneinfo import ZoneInfo

import pytest

from tests.helpers.browser import DESKTOP, PHONE, above_the_fold, assert_tidy, screenshot
from tests.helpers.chat_page import ANSWERS, READY, ask, caption, conversation, faults, open_chat, tag
from tests.helpers.waiting import wait_until

SUGGESTED = {"购物咨询": ["签收后还能无理由退货吗？", "买完就降价了，可以申请价保吗？", "电子发票多久能收到？"],
             "手机电脑数码": ["手机屏幕碎了能保修吗？", "电脑激活以后还能退货吗？"]}


def suggestions(page) -> list[str]:
    return [t.strip() for t in page.locator("#chatbot button.example").all_inner_texts()]


def asked(db, question: str) -> int:
    return db["messages"].count_where("role = 'user' and text = ? and status = 'ok'", [question])


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["desktop", "phone"])
def test_an_empty_chat_suggests_its_topics_questions_and_a_click_asks_one(browser, server_url, db, viewport):
    page = open_chat(browser, server_url, viewport)
    assert page.locator("#template input").input_value() == "购物咨询"  # the topic's title, not its name
    assert above_the_fold(page, "#template")  # by the title, on a phone too (its sidebar starts closed)
    page.locator("#chatbot button.example").first.wait_for(timeout=90_000)
    assert suggestions(page) == SUGGESTED["购物咨询"]
    assert_tidy(page)
    screenshot(page, "chat-suggested")

    question = SUGGESTED["购物咨询"][1]
    before = asked(db, question)
    page.locator("#chatbot button.example").nth(1).click()
    caption(page, 0).wait_for(timeout=120_000)
    assert page.locator("#chatbot [data-testid=user]").all_inner_texts() == [question]
    wait_until(lambda: asked(db, question) == before + 1, 30, "the suggested question to be stored")
    assert page.locator("#chatbot button.example").count() == 0  # a chat with messages suggests nothing
    page.wait_for_function("window.__pdGlyph.measured.length === 1", timeout=90_000)  # its first text was timed

    page.locator("#template input").click()
    page.locator("#template [data-testid=dropdown-option]").filter(has_text="手机电脑数码").click()
    page.wait_for_function("n => document.querySelectorAll('#chatbot button.example').length === n",
                           arg=len(SUGGESTED["手机电脑数码"]), timeout=90_000)
    assert suggestions(page) == SUGGESTED["手机电脑数码"]  # another topic: a new conversation, its own questions
    assert page.locator(ANSWERS).count() == 0

    # Its suggestion, then a typed follow-up: one conversation, the follow-up with the first as context.
    page.locator("#chatbot button.example").first.click()
    caption(page, 0).wait_for(timeout=120_000)
    follow_up = f"那电池呢？{tag()}"
    caption(page, ask(page, follow_up, watch=False)).wait_for(timeout=120_000)
    rows = conversation(db, follow_up)
    assert [r["text"] for r in rows if r["role"] == "user"] == [SUGGESTED["手机电脑数码"][0], follow_up]
    # Opening the picker and leaving it without a pick keeps the conversation on screen.
    page.locator("#template input").click()
    page.locator("#pd-header").click()
    page.wait_for_timeout(1500)
    assert page.locator("#chatbot [data-testid=user]").all_inner_texts() == [SUGGESTED["手机电脑数码"][0], follow_up]
    caption(page, ask(page, f"还有别的吗？{tag()}", watch=False)).wait_for(timeout=120_000)
    assert len([r for r in conversation(db, follow_up) if r["role"] == "user"]) == 3  # and the next continues it
    assert faults(page) == []
    page.close()


def test_the_last_question_is_edited_and_asked_again_and_thumbs_survive_a_reload(browser, server_url, db):
    page = open_chat(browser, server_url, DESKTOP)
    first, second, edited = f"运费怎么算？{tag()}", f"几天到货？{tag()}", f"偏远地区几天到货？{tag()}"
    caption(page, ask(page, first, watch=False)).wait_for(timeout=120_000)
    caption(page, ask(page, second, watch=False)).wait_for(timeout=120_000)
    old = conversation(db, second)
    page.locator(ANSWERS).first.hover()
    page.locator("#chatbot .message-buttons-left").first.locator("button[aria-label=没帮助]").click()
    wait_until(lambda: db["ratings"].count_where("message_id = ?", [old[1]["id"]]) == 1, 30, "the thumbs down")
    pencils = page.locator("#chatbot button[aria-label=修改上一个问题]")
    assert [p.is_visible() for p in pencils.all()] == [False, True]  # only the last question can be edited

    page.locator("#chatbot .message.user").last.hover()
    pencils.last.click()
    page.locator("#chatbot .edit-textarea").fill(edited)
    # The ✓ that sends the edit is in the Send button's colour, its ✗ the quiet grey of the other icons.
    colour = "b => getComputedStyle(b).color"
    send = page.locator("#send").evaluate("b => getComputedStyle(b).backgroundColor")
    assert page.locator("#chatbot button[aria-label=发送]").evaluate(colour) == send
    assert page.locator("#chatbot button[aria-label=取消]").evaluate(colour) != send
    screenshot(page, "chat-editing")
    page.locator("#chatbot button[aria-label=发送]").click()
    page.wait_for_function("q => [...document.querySelectorAll('#chatbot [data-testid=user]')].some("
                           "m => m.innerText.trim() === q)", arg=edited, timeout=90_000)
    def answered() -> list[dict] | None:  # (the page shows the question before the desk has stored it)
        rows = conversation(db, edited) if asked(db, edited) else []
        return rows if rows and rows[-1]["role"] == "assistant" and rows[-1]["status"] == "ok" else None

    stored = wait_until(answered, 60, "the edited question's answer")
    statuses = [(r["role"], r["text"] if r["role"] == "user" else "", r["status"]) for r in stored]
    assert statuses == [("user", first, "ok"), ("assistant", "", "ok"), ("user", second, "replaced"),
                        ("assistant", "", "replaced"), ("user", edited, "ok"), ("assistant", "", "ok")]
    caption(page, 1).wait_for(timeout=90_000)
    page.wait_for_function("window.__pdGlyph.measured.length === 3", timeout=90_000)  # the edit's answer was timed
    assert page.locator("#chatbot [data-testid=user]").all_inner_texts() == [first, edited]

    page.reload()
    page.wait_for_function(READY, timeout=90_000)
    page.wait_for_function("document.querySelectorAll('#chatbot .message.bot').length === 2", timeout=90_000)
    assert page.locator("#chatbot [data-testid=user]").all_inner_texts() == [first, edited]
    thumbs = "button[aria-label$=有帮助], button[aria-label$=没帮助], button[aria-label^=Like], button[aria-label^=Dislike]"
    marks = [g.locator(thumbs).evaluate_all("bs => bs.map(b => b.getAttribute('aria-label'))")
             for g in page.locator("#chatbot .message-buttons-left").all()]
    # The first answer's 👎 (marked, in the page's words, not Gradio's "Disliked"), the new answer unrated.
    assert marks == [["已标为没帮助", "有帮助"], ["没帮助", "有帮助"]]
    assert faults(page) == []
    page.close()


def test_each_caption_says_when_the_answer_began_in_the_customers_own_clock(browser, server_url, db):
    context = browser.new_context(viewport=DESKTOP, timezone_id="Asia/Shanghai")
    page = open_chat(browser, server_url, DESKTOP, page=context.new_page())
    question = f"发票怎么开？{tag()}"
    caption(page, ask(page, question, watch=False)).wait_for(timeout=120_000)
    answer = wait_until(lambda: (r := conversation(db, question)[1])["status"] == "ok" and r, 30, "the answer")
    began = _utc(answer["created_at"]).astimezone(ZoneInfo("Asia/Shanghai"))
    today = page.evaluate("new Date().getDate()")  # the page's own day, in its zone
    said = f"{began:%H:%M}" if began.day == today else f"{began:%m-%d %H:%M}"
    page.wait_for_function("c => document.querySelector('#chatbot .thought-group .title').innerText.endsWith(c)",
                           arg=f" · {said}", timeout=90_000)
    assert "UTC" not in caption(page, 0).inner_text()
    context.close()


def _utc(stored: str) -> datetime:
    return datetime.fromisoformat(stored).replace(tzinfo=timezone.utc)
