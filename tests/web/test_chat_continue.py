"""An answer cut off at its length says so and goes on with Continue: the same answer, one stored row with the
whole text, the prompt ending with the answer so far (no new question) — on a desktop and on a phone; and it is
not offered while a person has the conversation."""

import pytest

from app.core.prompts import Turn
from tests.helpers.browser import DESKTOP, PHONE, assert_tidy, screenshot
from tests.helpers.chat_page import ANSWERS, ask, caption, conversation, database_of, faults, open_chat, tag
from tests.helpers.servers import SecondServer
from tests.helpers.waiting import wait_until


@pytest.fixture(scope="module")
def short_answers(services, engine_loop, tmp_path_factory):
    """A chat whose every answer runs to a budget of 24 tokens: each one is cut off."""
    server = SecondServer(services, engine_loop, tmp_path_factory.mktemp("short-answers"), ignore_eos=True,
                          max_tokens=24, ui_language="zh")
    with server as url:
        yield url, database_of(server)


def test_a_continuation_prompt_ends_with_the_answer_so_far(services):
    prompts = services.prompts
    history = [Turn("user", "运费多少？")]
    asked = prompts.build("规则", history, "再说说退货")
    going_on = prompts.build_continuation("规则", history, "运费是十元，")
    tokenizer = prompts.tokenizer
    rendered = tokenizer.decode(going_on.token_ids)
    assert rendered.endswith("<|im_start|>assistant\n运费是十元，")  # no end of turn, no new question
    assert "再说说退货" in tokenizer.decode(asked.token_ids)
    assert going_on.prefix_tokens == asked.prefix_tokens  # the template's shared prefix, as for any question


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["desktop", "phone"])
def test_continue_goes_on_with_a_cut_off_answer_as_the_same_answer(browser, short_answers, viewport):
    url, db = short_answers
    page = open_chat(browser, url, viewport)
    question = f"请详细介绍退货流程 {tag()}"
    caption(page, ask(page, question, watch=False)).wait_for(timeout=120_000)
    (user, answer) = conversation(db, question)
    assert (answer["status"], answer["finish_reason"]) == ("ok", "length")
    caption(page, 0).filter(has_text="回答较长，已截断").wait_for(timeout=90_000)
    go_on = page.locator("#continue")
    go_on.wait_for(state="visible", timeout=90_000)
    assert_tidy(page)
    screenshot(page, "chat-cut-off")

    go_on.click()
    grown = wait_until(lambda: (r := db["messages"].get(answer["id"]))["status"] == "ok"
                       and len(r["text"]) > len(answer["text"]) and r, 60, "the continued answer to be stored")
    assert grown["text"].startswith(answer["text"])  # the same answer, gone on with
    assert [r["id"] for r in conversation(db, question)] == [user["id"], answer["id"]]  # no new rows
    page.wait_for_function("([n, length]) => { const g = document.querySelectorAll('#chatbot .message.bot');"
                           " return g.length === n && g[n - 1].querySelector('.thought-group')"
                           " && g[n - 1].innerText.length > length; }", arg=[1, len(answer["text"])], timeout=90_000)
    assert page.locator(ANSWERS).count() == 1
    assert page.locator("#chatbot [data-testid=user]").count() == 1
    assert faults(page) == []
    screenshot(page, "chat-continued")
    page.close()


def test_continue_is_not_offered_while_a_person_has_the_conversation(browser, short_answers):
    url, db = short_answers
    page = open_chat(browser, url, PHONE)
    question = f"我要投诉，订单一直没发货 {tag()}"
    caption(page, ask(page, question, watch=False)).wait_for(timeout=120_000)
    page.locator("#continue").wait_for(state="visible", timeout=90_000)  # a cut-off answer may go on
    page.locator("#person").click()
    page.wait_for_function("() => document.querySelector('#chatbot').innerText.includes('已为您转接人工客服')",
                           timeout=90_000)
    page.locator("#continue").wait_for(state="hidden", timeout=90_000)
    buttons = [page.locator(s).bounding_box() for s in ("#send", "#stop", "#retry")]
    assert len({round(b["y"]) for b in buttons}) == 1  # the composer's buttons share one line on a phone
    assert all(b["x"] + b["width"] <= PHONE["width"] for b in buttons)
    assert_tidy(page)
    screenshot(page, "chat-person-cut-off")
    assert wait_until(lambda: next(db["conversations"].rows_where(
        "id = ?", [conversation(db, question)[0]["conversation_id"]]))["handoff"], 30, "the handoff") == "waiting"
    assert faults(page) == []
    page.close()
