"""Every text a customer can read comes from the UI language's table, in plain words: the desk's refusals are
codes said there (zh and en alike), never English from the core or a number of tokens; a notice is shown as
it is, and a second one takes the place of the first."""

import re
import string
from pathlib import Path

import pytest

from app.core.refusals import ENGLISH
from app.chat.text import API_TEXT, GRADIO_LOCALES, TEXT, gradio_words, refusal_text
from tests.helpers.browser import DESKTOP, PHONE, assert_tidy, screenshot
from tests.helpers.chat_page import ANSWERS, faults, open_chat, tag, wait_for_status
from tests.helpers.chat_page import caption as caption_of  # a test here names its own caption

ENGINEERING = re.compile(r"token|prompt|cache|system prompt|tenant|engine|缓存|提示词|令牌|引擎|租户", re.I)
PYTHON_REPR = re.compile(r"<class |Traceback|\bValue: |\{'|\['|None\b|Error\b|\\n")


def customer_texts(language: str) -> list[str]:
    table = TEXT[language]
    return [v for k, v in table.items() if k != "refusals"] + list(table["refusals"].values())


def test_zh_and_en_say_the_same_things_and_every_refusal_has_its_words():
    assert TEXT["zh"].keys() == TEXT["en"].keys()
    assert TEXT["zh"]["refusals"].keys() == TEXT["en"]["refusals"].keys() == ENGLISH.keys()
    for language in TEXT:  # the same parameters in both languages' words
        for code, text in TEXT[language]["refusals"].items():
            named = {f for _, f, _, _ in string.Formatter().parse(text) if f}
            assert named <= {f for _, f, _, _ in string.Formatter().parse(ENGLISH[code]) if f}, (language, code)


@pytest.mark.parametrize("language", ["zh", "en"])
def test_no_customer_text_speaks_of_engineering_or_shows_a_python_value(language):
    for text in customer_texts(language):
        text = re.sub(r"\{[a-z_]+\}", "", text)  # the names of its parameters are no text anyone reads
        assert not ENGINEERING.search(text), text
        assert not PYTHON_REPR.search(text), text
    assert "⚠" not in "".join(customer_texts(language)) and "⏹" not in "".join(customer_texts(language))


def test_a_refusal_is_said_with_its_parameters_and_an_unknown_one_is_the_apology():
    assert refusal_text("rate", {"per_minute": 3, "wait_s": 12}, "zh") == "您发送得有点快，请等 12 秒后再发送。"
    assert refusal_text("message_chars", {"chars": 20001, "limit": 20000}, "en") == (
        "This message is too long (20001 characters; at most 20000). Please shorten it or send it in parts.")
    assert refusal_text("no such code", {}, "zh") == TEXT["zh"]["refusals"]["internal"]
    assert refusal_text("rate", {}, "en") == TEXT["en"]["refusals"]["internal"]  # a parameter missing
    assert API_TEXT["zh"].keys() == API_TEXT["en"].keys() == {"api_message", "api_template", "api_conversation",
                                                              "api_history", "api_tenant"}


def test_the_captions_speed_counts_characters_not_tokens():
    from datetime import UTC, datetime

    from app.db.rows import MessageRow
    from app.chat.text import caption_details

    def answer(text: str, output_tokens: int | None, rate: float | None) -> MessageRow:
        return MessageRow(id=1, conversation_id=1, role="assistant", text=text, status="ok", error=None,
                          template_version_id=1, prompt_tokens=None, num_cached_tokens=None, ttft_ms=None,
                          output_tokens=output_tokens, decode_tokens_per_s=rate, replica=None,
                          created_at=datetime(2026, 12, 2, tzinfo=UTC), first_visible_ms=850)

    # 120 characters in 40 tokens written at 4 tokens a second: 12 characters a second, not "4 字".
    assert caption_details(answer("退" * 120, 40, 4.0), "zh") == "首字显示 850 毫秒 · 每秒 12 字"
    assert caption_details(answer("a" * 300, 60, 20.0), "en") == (
        "first text on screen 850 ms · 100 characters per second")
    assert caption_details(answer("退" * 120, 1, 0.0), "zh") == "首字显示 850 毫秒"  # one token: no speed measured
    assert caption_details(answer("", None, None), "zh") == "首字显示 850 毫秒"


def notices(page) -> list[str]:
    return page.locator("#chatbot [data-testid=bot]").evaluate_all(
        "ms => ms.map(m => m.innerText.trim()).filter(t => t.startsWith('提示：') || t.startsWith('Note: '))")


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["desktop", "phone"])
def test_a_zh_customer_reads_refusals_in_plain_chinese_and_they_never_stack(browser, server_url, db, viewport):
    page = open_chat(browser, server_url, viewport)
    box = page.locator("#message textarea")
    for _ in range(3):  # empty sends: one notice, the latest, never three
        box.fill("   ")
        box.press("Enter")
    page.wait_for_function("document.querySelectorAll('#chatbot [data-testid=bot]').length > 0")
    assert notices(page) == ["提示：请输入问题后再发送。"]

    # A message too long for the model: stored, answered with a plain notice (no numbers of tokens), which
    # takes the place of the empty-send notice; the conversation reopened later says the same.
    long_question = f"{tag()} " + "我的订单有问题，" * 600
    box.fill(long_question)
    # With Send: Enter's own event may still be finishing the last refusal (its sidebar step), and Gradio drops
    # a trigger of an event still running (the box keeps the text); Send is an event of its own.
    page.locator("#send").click()
    row = wait_for_status(db, long_question.strip(), 0)
    assert (row["status"], row["error_code"]) == ("error", "message_too_long")
    assert "tokens" in row["error"]  # the operators' precise English stays in the record
    page.wait_for_function("() => [...document.querySelectorAll('#chatbot [data-testid=bot]')].some("
                           "m => m.innerText.includes('这条消息太长了'))", timeout=90_000)
    assert notices(page) == ["提示：这条消息太长了，请缩短后再发送。"]
    text = page.locator("#chatbot").inner_text()
    assert not ENGINEERING.search(text) and "⚠" not in text
    assert_tidy(page)
    screenshot(page, "chat-refusal-zh")
    assert faults(page) == []

    page.reload()
    page.wait_for_function("window.__pdGlyph && document.querySelector('#template input')?.value", timeout=90_000)
    if viewport == PHONE:
        page.locator("#pd-sidebar .toggle-button").click()
    page.locator("#conversations label").filter(has_text=long_question.strip()[:20]).first.click()
    page.locator(ANSWERS).first.wait_for(timeout=90_000)
    page.wait_for_function("() => document.querySelector('#chatbot').innerText.includes('这条消息太长了')")
    page.close()


def test_a_paste_longer_than_a_message_may_be_is_cut_and_the_page_says_so_with_the_limit(browser, server_url):
    # The box keeps 20,000 characters (the desk's limit): a longer paste was cut with no word said.
    context = browser.new_context(viewport=DESKTOP)
    try:
        context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server_url.rstrip("/"))
        page = open_chat(browser, server_url, page=context.new_page())
        box = page.locator("#message textarea")
        page.evaluate("t => navigator.clipboard.writeText(t)", "退" * 20_001)
        box.click()
        box.press("Control+V")
        note = page.locator("#pd-paste-cut")
        note.wait_for(timeout=90_000)
        assert note.inner_text() == "提示：粘贴的内容超过 20000 字的上限，只保留了前 20000 字。请缩短或分成几条发送。"
        assert box.input_value() == "退" * 20_000
        box.fill("")  # typing it shorter takes the note away
        note.wait_for(state="detached", timeout=90_000)
        page.evaluate("t => navigator.clipboard.writeText(t)", "退" * 19_999)  # one that fits says nothing
        box.press("Control+V")
        page.wait_for_function("() => document.querySelector('#message textarea').value.length === 19999",
                               timeout=90_000)
        assert note.count() == 0
        assert faults(page) == []
    finally:
        context.close()


def test_gradio_is_given_the_pages_words_in_every_language_it_may_pick():
    # Gradio's frontend picks a language of its own lang files by the browser's: each must carry the page's words.
    import gradio

    assets = Path(gradio.__file__).parent / "templates" / "frontend" / "assets"
    (core,) = assets.glob("core-*.js")
    assert sorted(GRADIO_LOCALES) == sorted(set(re.findall(r'"\./lang/([A-Za-z-]+)\.json"', core.read_text())))
    for language in ("zh", "en"):
        words = gradio_words(language)
        assert set(words) == set(GRADIO_LOCALES)
        assert all(table == words["en"] for table in words.values())
    assert gradio_words("zh")["en"]["chatbot.copy_message"] == "复制"
    assert gradio_words("en")["zh-CN"]["chatbot.copy_message"] == "Copy"
    assert gradio_words("zh")["fr"] == {
        "chatbot.copy_message": "复制", "chatbot.copied_message": "已复制", "chatbot.like": "有帮助",
        "chatbot.dislike": "没帮助", "chatbot.edit": "修改上一个问题", "chatbot.submit": "发送", "chatbot.cancel": "取消",
        "chatbot.retry": "重试", "chatbot.undo": "撤销", "chatbot.clear": "清空对话", "common.loading": "加载中"}


@pytest.mark.parametrize("locale", ["en-US", "fr-FR", "zh-CN"])
def test_the_zh_page_shows_gradios_buttons_in_chinese_whatever_the_browsers_language(browser, server_url, locale):
    context = browser.new_context(viewport=DESKTOP, locale=locale)
    try:
        page = open_chat(browser, server_url, page=context.new_page())
        assert page.evaluate("document.documentElement.lang") == "zh-CN"  # the page's, not the browser's
        page.locator("#message textarea").fill(f"运费怎么算？{tag()}")
        page.locator("#message textarea").press("Enter")
        page.locator(ANSWERS).first.locator(".thought-group").wait_for(timeout=120_000)
        labels = page.evaluate("() => [...document.querySelectorAll('#chatbot button[aria-label]')]"
                               ".map(b => b.getAttribute('aria-label'))")
        assert {"复制", "有帮助", "没帮助", "清空对话"} <= set(labels)
        assert not {"Copy message", "Like", "Dislike", "Clear", "Copier le message"} & set(labels)
        assert labels.count("复制") == 2  # the question's and the answer's
        # A thumb marked: Gradio's own "Liked" (none of its translations) in the page's words. Once the page's
        # measure of the first text is stored (the caption says it): its report redraws the chatbot.
        caption_of(page, 0).filter(has_text="秒内开始回复").wait_for(timeout=90_000)
        page.locator("#chatbot button[aria-label='有帮助']").first.click()
        page.locator("#chatbot button[aria-label='已标为有帮助']").wait_for(timeout=90_000)
        labels = page.evaluate("() => [...document.querySelectorAll('#chatbot button[aria-label]')]"
                               ".map(b => b.getAttribute('aria-label'))")
        assert "Liked" not in labels and "Disliked" not in labels
        assert faults(page) == []
    finally:
        context.close()


def test_a_thumb_given_while_the_first_text_report_is_on_its_way_stays_marked(browser, server_url):
    # The page's report of the answer's first text is held until the customer has given a 👍. Its answer used to
    # draw the chatbot again (the caption's new title), which unmarked the 👍: it now carries the shown state only,
    # and the page wrote the time into the caption itself.
    from tests.helpers.attack import config, dependency

    report = dependency(config(server_url), "report_first_visible")["id"]
    context = browser.new_context(viewport=DESKTOP)
    try:
        page = open_chat(browser, server_url, page=context.new_page())
        held = []

        def hold(route):
            if (route.request.post_data_json or {}).get("fn_index") == report:
                held.append(route)
            else:
                route.continue_()
        page.route("**/gradio_api/run/predict", hold)
        page.locator("#message textarea").fill(f"运费怎么算？{tag()}")
        page.locator("#message textarea").press("Enter")
        caption_of(page, 0).filter(has_text="秒内开始回复").wait_for(timeout=120_000)  # written by the page
        while not held:
            page.wait_for_timeout(50)  # (route handlers run while the page waits)
        page.locator("#chatbot button[aria-label='有帮助']").last.click()
        page.locator("#chatbot button[aria-label='已标为有帮助']").wait_for(timeout=90_000)
        with page.expect_response(lambda r: "run/predict" in r.url and
                                  (r.request.post_data_json or {}).get("fn_index") == report) as answered:
            held[0].continue_()
        assert answered.value.status == 200
        assert len(answered.value.json()["data"]) == 2  # the shown state and the report box: no chatbot drawn
        page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
        assert page.locator("#chatbot button[aria-label='已标为有帮助']").count() == 1
        assert faults(page) == []
    finally:
        context.close()
