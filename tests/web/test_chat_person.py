"""What a customer of any chat expects beyond answers: 👍/👎 on an answer with an optional reason (stored with
the answer, its conversation and template version), a copy button, and a way to a person — the conversation
waits for one and says so, the model stops answering it, the page polls (only then) and shows the person's
replies marked as theirs, and the model answers again once the operator hands it back."""

import pytest

from app.core.desk import asks_for_person
from app.db import conversations as db_conversations
from tests.helpers.browser import DESKTOP, PHONE, assert_tidy, screenshot
from tests.helpers.chat_page import ask, caption, conversation, faults, open_chat, tag, wait_ready
from tests.helpers.waiting import wait_until


def test_an_answer_that_asks_for_a_person_is_told_apart():
    assert asks_for_person("这个问题需要人工处理【转人工】") and asks_for_person("[[person]]")
    assert not asks_for_person("您可以点“转人工”找人工客服。")


def bot_texts(page) -> list[str]:
    return page.locator("#chatbot [data-testid=bot]").all_inner_texts()


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["desktop", "phone"])
def test_thumbs_with_a_reason_are_stored_with_the_answer(browser, server_url, db, viewport):
    page = open_chat(browser, server_url, viewport)
    question = f"七天无理由退货怎么算？{tag()}"
    caption(page, ask(page, question, watch=False)).wait_for(timeout=120_000)
    answer = conversation(db, question)[1]
    assert page.locator("#chatbot button[aria-label='复制']").count() == 2  # the question's, the answer's
    page.locator("#chatbot button[aria-label='没帮助']").first.click()
    page.locator("#pd-reason").wait_for(state="visible", timeout=90_000)
    rating = wait_until(lambda: next(db["ratings"].rows_where("message_id = ?", [answer["id"]]), None), 30,
                        "the thumbs to be stored")
    assert (rating["thumbs"], rating["reason"], rating["conversation_id"], rating["template_version_id"]) == (
        -1, "", answer["conversation_id"], answer["template_version_id"])
    page.locator("#pd-reason textarea").fill("没有回答我的问题")
    assert_tidy(page)
    screenshot(page, "chat-thumbs-reason")
    thanks = page.locator("#pd-thanks")
    assert not thanks.is_visible()
    page.locator("#reason-send").click()
    page.locator("#pd-reason").wait_for(state="hidden", timeout=90_000)
    thanks.wait_for(state="visible", timeout=90_000)  # the customer is thanked for the reason
    assert thanks.inner_text().strip() == "谢谢您的反馈！"
    assert wait_until(lambda: next(db["ratings"].rows_where("message_id = ?", [answer["id"]]))["reason"], 30,
                      "the reason") == "没有回答我的问题"
    assert_tidy(page)
    page.locator("#chatbot button[aria-label='有帮助']").first.click()  # rating again replaces it
    wait_until(lambda: next(db["ratings"].rows_where("message_id = ?", [answer["id"]]))["thumbs"] == 1, 30,
               "the thumbs up")
    thanks.wait_for(state="hidden", timeout=90_000)  # a new rating takes the old thanks away
    assert db["ratings"].count_where("message_id = ?", [answer["id"]]) == 1
    assert faults(page) == []
    page.close()


def test_a_customer_gets_a_person_and_the_model_answers_again_after(browser, server_url, db, services, aio):
    page = open_chat(browser, server_url, DESKTOP)
    question = f"我要投诉快递员 {tag()}"
    caption(page, ask(page, question, watch=False)).wait_for(timeout=120_000)
    conversation_id = conversation(db, question)[0]["conversation_id"]

    page.locator("#person").click()
    page.wait_for_function("() => document.querySelector('#chatbot').innerText.includes('已为您转接人工客服')",
                           timeout=90_000)
    assert db["conversations"].get(conversation_id)["handoff"] == "waiting"
    page.locator("#person").wait_for(state="hidden", timeout=90_000)  # not offered again while a person has it
    page.reload()  # a reopened page says so too
    wait_ready(page)
    page.wait_for_function("() => document.querySelector('#chatbot').innerText.includes('已为您转接人工客服')",
                           timeout=90_000)
    page.locator("#person").wait_for(state="hidden", timeout=90_000)
    waiting = f"快点处理 {tag()}"
    ask(page, waiting, watch=False)  # stored, not answered by the model: the page says who has it
    wait_until(lambda: len(conversation(db, question)) == 3, 30, "the question to be stored")
    assert [r["role"] for r in conversation(db, question)] == ["user", "assistant", "user"]

    aio(services.db.write(db_conversations.take, conversation_id=conversation_id, operator="王芳"))
    aio(services.db.write(db_conversations.person_reply, conversation_id=conversation_id, operator="王芳",
                          text="您好，我是王芳，马上为您处理。"))
    page.wait_for_function("() => document.querySelector('#chatbot').innerText.includes('马上为您处理')",
                           timeout=15_000)  # the page's poll, every 3 s
    titles = page.locator("#chatbot .thought-group .title")
    assert titles.filter(has_text="人工客服 · ").count() == 1  # a person's, not the operator's login name
    assert not any("王芳" in title for title in titles.all_inner_texts())
    assert_tidy(page)
    screenshot(page, "chat-person")

    aio(services.db.write(db_conversations.release, conversation_id=conversation_id, operator="王芳"))
    page.wait_for_function("() => document.querySelector('#chatbot').innerText.includes('人工客服已结束接待')",
                           timeout=15_000)
    page.locator("#person").wait_for(state="visible", timeout=90_000)  # offered again once the person has finished
    after = f"那运费呢？{tag()}"
    ask(page, after, watch=False)
    wait_until(lambda: (rows := conversation(db, question))[-1]["role"] == "assistant"
               and rows[-1]["status"] == "ok" and rows[-2]["text"] == after, 60, "the model's answer")
    assert "人工客服 · " in "".join(page.locator("#chatbot .thought-group .title").all_inner_texts())
    assert faults(page) == []
    assert not any("⚠" in t for t in bot_texts(page))
    page.close()


def test_the_composer_is_free_again_after_each_message_a_person_has(browser, server_url, db, services, aio):
    # Each message sent while a person has the conversation is stored and answered by a notice; the second notice
    # says what the first said, and the page took it for no answer at all: Stop stayed lit, Retry dimmed. And each
    # message added the same notice again: the chat shows one, the last word under the customer's last message.
    page = open_chat(browser, server_url, DESKTOP)
    question = f"我的包裹丢了 {tag()}"
    caption(page, ask(page, question, watch=False)).wait_for(timeout=120_000)
    conversation_id = conversation(db, question)[0]["conversation_id"]
    page.locator("#person").click()
    page.wait_for_function("() => document.querySelector('#chatbot').innerText.includes('已为您转接人工客服')",
                           timeout=90_000)
    aio(services.db.write(db_conversations.take, conversation_id=conversation_id, operator="王芳"))
    asked = []
    for n in (1, 2, 3):
        asked.append(f"还在吗？第 {n} 次 {tag()}")
        ask(page, asked[-1], watch=False)
        page.wait_for_function(ONE_NOTICE_LAST_JS, arg=[len(asked) + 1, WITH_PERSON_NOTICE], timeout=90_000)
        page.wait_for_function("() => !document.querySelector('#pd-composer').classList.contains('pd-streaming')",
                               timeout=90_000)
        assert said(page)[-2:] == [["user", asked[-1]], ["bot", WITH_PERSON_NOTICE]]
        assert [text for _, text in said(page) if text.startswith("提示：")] == [WITH_PERSON_NOTICE]
    assert [text for who, text in said(page) if who == "user"] == [question, *asked]
    assert [r["role"] for r in conversation(db, question)] == ["user", "assistant", "user", "user", "user"]
    page.reload()  # the conversation as stored says it once too
    wait_ready(page)
    page.wait_for_function(ONE_NOTICE_LAST_JS, arg=[4, WITH_PERSON_NOTICE], timeout=90_000)
    assert [text for _, text in said(page) if text.startswith("提示：")] == [WITH_PERSON_NOTICE]
    assert faults(page) == []
    page.close()


WITH_PERSON_NOTICE = "提示：人工客服正在处理这段对话，回复会显示在这里。"
# The chat's last message is the notice, after ``questions`` of the customer's.
ONE_NOTICE_LAST_JS = """([questions, notice]) => {
  const said = [...document.querySelectorAll('#chatbot [data-testid=user], #chatbot [data-testid=bot]')];
  const last = said[said.length - 1];
  return document.querySelectorAll('#chatbot [data-testid=user]').length === questions && !!last
    && last.dataset.testid === 'bot' && last.innerText.trim() === notice;
}"""


def said(page) -> list[list[str]]:
    """Every message of the chat in order: ["user" or "bot", its text]."""
    return page.evaluate("() => [...document.querySelectorAll('#chatbot [data-testid=user], #chatbot [data-testid=bot]')]"
                         ".map(m => [m.dataset.testid, m.innerText.trim()])")
