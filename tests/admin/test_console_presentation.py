"""An operator sets what customers see of a topic in the console (its title, its suggested questions), the chat
of a page that opened before shows it, and a refused change says what to do and writes nothing."""

import uuid

import pytest

from tests.helpers.browser import DESKTOP, assert_tidy, admin_page, screenshot
from tests.helpers.chat_page import open_chat
from tests.helpers.servers import operator

OPERATOR = ("op-present", "present secret 42")


@pytest.fixture(scope="module")
def account(services):
    return operator(services, *OPERATOR)


def test_an_operator_titles_a_topic_and_suggests_its_questions(browser, server_url, console, aio, account, services):
    name = f"售后-{uuid.uuid4().hex[:6]}"
    aio(console.templates.create(name=name, text=f"{name}：七天无理由退货。", user="seed", language="zh"))
    aio(console.templates.publish(name=name, version=1, user="seed"))
    chat = open_chat(browser, server_url, DESKTOP)  # opened before the change

    page = admin_page(browser, server_url, account, **DESKTOP)
    page.locator("#templates-table").get_by_text(name, exact=True).last.wait_for(timeout=90_000)
    picker = page.locator("#edit-template input")
    picker.fill(name)
    picker.press("Enter")
    page.wait_for_function("t => document.querySelector('#template-text textarea').value.startsWith(t)", arg=name,
                           timeout=90_000)
    page.locator("#template-presentation").get_by_text("顾客看到的内容").click()
    title, examples = page.locator("#template-title textarea"), page.locator("#template-examples textarea")
    title.wait_for(timeout=10_000)
    assert (title.input_value(), examples.input_value()) == ("", "")
    status = page.locator("#template-status")
    examples.fill("\n".join(f"问题{i}？" for i in range(5)))
    page.locator("#present").click()
    status.get_by_text("⛔", exact=False).wait_for(timeout=90_000)
    assert "共 5 个推荐问题；空白对话最多显示 4 个。请只保留最好的几个。" in status.inner_text()  # the zh console's words
    assert services.catalog.get(name).examples == ()  # nothing written

    title.fill("退换货")
    examples.fill("七天能退吗？\n\n运费谁出？")
    page.locator("#present").click()
    status.get_by_text(f"已保存 '{name}' 对顾客显示的内容", exact=False).wait_for(timeout=90_000)
    assert (services.catalog.get(name).title, services.catalog.get(name).examples) == ("退换货", ("七天能退吗？", "运费谁出？"))
    assert_tidy(page)
    screenshot(page, "console-presentation")

    chat.locator("#template input").click()  # the page asks for the topics as published now
    chat.locator("#template [data-testid=dropdown-option]").filter(has_text="退换货").click()
    chat.wait_for_function("() => document.querySelectorAll('#chatbot button.example').length === 2",
                           timeout=10_000)
    assert [t.strip() for t in chat.locator("#chatbot button.example").all_inner_texts()] == ["七天能退吗？", "运费谁出？"]
    assert chat.locator("#chatbot [data-testid=dropdown-option]").count() == 0
    page.close()
    chat.close()
