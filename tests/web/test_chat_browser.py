"""A customer in a real browser: chat with Enter and Send, watch the answer stream, read the caption and its
numbers, stop, retry a reopened conversation, close the tab mid-answer, pick a freshly published template —
on a desktop and on a phone."""

import uuid

import pytest

from app.core.desk import STOPPED
from tests.helpers.browser import DESKTOP, PHONE, VIEWPORTS, above_the_fold, assert_tidy, resize, screenshot
from tests.helpers.chat_page import (ANSWERS, READY, ask, caption, clock, conversation, database_of,
                                     events_of_gone_pages, faults, long_answers_server, open_chat, wait_for_status)
from tests.helpers.servers import SecondServer
from tests.helpers.waiting import wait_until


@pytest.fixture(scope="module")
def long_answers(services, engine_loop, tmp_path_factory):
    """An English chat whose answers stream for 15 s or more (750 tokens); a test that acts on an answer's first
    text holds it there (held_answers) until it lets it go."""
    server = long_answers_server(services, engine_loop, tmp_path_factory.mktemp("long-answers"))
    with server as url:
        yield url, database_of(server), server


def first_visible(db, message_id: int) -> float:
    """The answer's stored first-text time, once the page has reported it."""
    return wait_until(lambda: db["messages"].get(message_id)["first_visible_ms"], 30,
                      f"the page to report answer {message_id}'s first text")


def seconds(ms: float) -> str:
    tenths = max(1, -(-int(round(ms)) // 100))
    return f"{tenths // 10}.{tenths % 10}"


def test_a_customer_sees_the_answer_stream_and_the_caption_holds_the_stored_numbers(browser, server_url, db,
                                                                                     held_answers):
    page = open_chat(browser, server_url)
    tag = uuid.uuid4().hex[:6]
    questions = [f"我刚买的手机屏幕碎了能退吗？{tag}", f"那价格保护怎么申请？{tag}"]
    for i, question in enumerate(questions):
        assert ask(page, question, send_button=i == 1) == i  # the first with Enter, the second with Send
        # Streamed: the answer's first text is on the page while the rest is held, stored as still being written,
        # with no caption yet (a stalled machine could otherwise deliver a short answer in one update).
        page.wait_for_function("window.__pdStream.lengths.length > 0", polling=50, timeout=120_000)
        assert (held_answers.held, conversation(db, question)[-1]["status"]) == (i + 1, "generating")
        assert page.evaluate("window.__pdStream.captioned") is False
        held_answers.release()
        caption(page, i).wait_for(timeout=120_000)
        held_answers.hold_again()  # the next answer is held too (this one has ended: its caption is drawn)

    rows = conversation(db, questions[0])
    assert [(r["role"], r["status"], r["text"] if r["role"] == "user" else "") for r in rows] == [
        ("user", "ok", questions[0]), ("assistant", "ok", ""), ("user", "ok", questions[1]), ("assistant", "ok", "")]
    glyphs = page.evaluate("window.__pdGlyph.byAnswer")
    for i, row in enumerate(rows[1::2]):
        # The caption's title is when the first text reached this screen, as this page measured it and stored it.
        glyph_ms = glyphs[str(i)]
        assert isinstance(glyph_ms, int) and glyph_ms >= row["ttft_ms"]  # no glyph before the first token
        assert first_visible(db, row["id"]) == glyph_ms
        page.wait_for_function("([i, text]) => document.querySelectorAll('#chatbot .message.bot')[i]"
                               "?.querySelector('.thought-group .title')?.innerText.trim() === text",
                               arg=[i, f"{seconds(glyph_ms)} 秒内开始回复"
                                       + (" · 回答较长，已截断" if row["finish_reason"] == "length" else "")
                                       + f" · {clock(page, row['created_at'])}"],
                               timeout=90_000)
        caption(page, i).click()
        details = page.locator(ANSWERS).nth(i).locator(".thought-group .content")
        # The server's figures, in plain words; a customer is told the share of the template's 1,024 reused.
        wait_until(lambda: details.inner_text() == (
            f"首字显示 {glyph_ms} 毫秒 · 服务器开始回复 {row['ttft_ms']:.0f} 毫秒 · "
            f"已读资料复用 {min(row['num_cached_tokens'], 1024) * 100 // 1024}%"
            + (f" · 每秒 {row['decode_tokens_per_s'] * len(row['text']) / row['output_tokens']:.0f} 字" if row["decode_tokens_per_s"] else "")),  # measured
            30, lambda: f"details {details.inner_text()!r}")
    assert faults(page) == []
    assert_tidy(page)
    screenshot(page, "chat-caption")
    page.close()


def test_an_answer_after_a_notice_reports_its_own_first_text(browser, services, engine_loop, tmp_path):
    """"Talk to a person" on an empty chat shows a notice at once; the question asked next is answered in the
    notice's place, and the first text the page reports is the answer's, not the notice's: never sooner than the
    engine's first token (here at least one 1 s step pause after the question), and the caption says what is stored."""
    server = SecondServer(services, engine_loop, tmp_path, step_delay_ms=1000, max_tokens=3, ignore_eos=True)
    with server as url:
        db = database_of(server)
        page = open_chat(browser, url)
        page.locator("#person").click()
        page.wait_for_function("() => document.querySelector('#chatbot').innerText.includes('请先描述您的问题')",
                               timeout=90_000)
        question = f"发票可以开公司抬头吗？{uuid.uuid4().hex[:6]}"
        ask(page, question, watch=False)
        caption(page, 0).wait_for(timeout=120_000)  # the answer has taken the notice's place
        answer = conversation(db, question)[1]
        assert (answer["status"], answer["output_tokens"], answer["finish_reason"]) == ("ok", 3, "length")
        glyph_ms = first_visible(db, answer["id"])
        assert glyph_ms >= answer["ttft_ms"] >= 1000, (glyph_ms, answer["ttft_ms"])  # the answer's text, not the notice
        assert page.evaluate("window.__pdGlyph.byAnswer") == {"0": glyph_ms}
        page.wait_for_function("(text) => document.querySelector('#chatbot .message.bot .thought-group .title')"
                               "?.innerText.trim() === text",
                               arg=f"{seconds(glyph_ms)} 秒内开始回复 · 回答较长，已截断 · {clock(page, answer['created_at'])}",
                               timeout=90_000)
        caption(page, 0).click()
        details = page.locator(ANSWERS).nth(0).locator(".thought-group .content")
        wait_until(lambda: details.inner_text().startswith(
            f"首字显示 {glyph_ms:.0f} 毫秒 · 服务器开始回复 {answer['ttft_ms']:.0f} 毫秒 · "), 30,
            lambda: f"details {details.inner_text()!r}")
        assert faults(page) == []
        page.close()


@pytest.mark.parametrize("viewport", VIEWPORTS.values(), ids=VIEWPORTS.keys())
def test_the_page_fits_the_screen_with_no_control_over_another(browser, server_url, viewport):
    page = open_chat(browser, server_url, viewport)
    name = f"chat-{'phone' if viewport == PHONE else 'desktop'}"
    for selector in ("#message textarea", "#send"):
        assert above_the_fold(page, selector), f"{selector} is below the fold"
    assert_tidy(page)
    screenshot(page, f"{name}-empty")
    question = f"订单什么时候发货？{uuid.uuid4().hex[:6]}"
    caption(page, ask(page, question, watch=False)).wait_for(timeout=120_000)
    caption(page, 0).filter(has_text="秒内开始回复").wait_for(timeout=90_000)
    caption(page, 0).click()
    for selector in ("#message textarea", "#send"):
        assert above_the_fold(page, selector), f"{selector} is below the fold after an answer"
    assert_tidy(page)
    screenshot(page, name)
    if viewport == PHONE:  # the open sidebar fills the screen: its close button is whole and on it, over nothing
        page.locator("#pd-sidebar .toggle-button").click()
        page.wait_for_function("document.querySelector('#pd-sidebar').getBoundingClientRect().left >= 0")
        resize(page, PHONE)  # settled once the slide has ended
        assert above_the_fold(page, "#pd-sidebar .toggle-button")
        assert page.locator("#chatbot .scroll-down-button-container").evaluate_all(
            "els => els.filter(e => getComputedStyle(e).visibility === 'visible').length") == 0
        assert_tidy(page)
        screenshot(page, f"{name}-sidebar")
    page.close()


def while_streaming(browser, url: str, db, question: str, viewport: dict, held) -> tuple:
    """Open a page, ask, and wait for the answer's first text: the answer is held there (``held``, HeldAnswers)
    until the test releases it, so it is certainly still being written while the test acts. Returns the page and
    the question."""
    page = open_chat(browser, url, viewport)
    asked = f"{question} {uuid.uuid4().hex[:6]}"
    ask(page, asked)
    page.wait_for_function("window.__pdStream.lengths.length > 0", polling=50, timeout=120_000)
    assert (held.held, conversation(db, asked)[-1]["status"]) == (1, "generating")
    return page, asked


def test_stop_keeps_the_partial_answer_as_stopped_and_frees_the_engine(browser, long_answers, engine, held_answers):
    url, db, _ = long_answers
    page, question = while_streaming(browser, url, db, "Tell me everything about returns and refunds.", DESKTOP,
                                     held_answers)
    assert_tidy(page)  # no progress timer drawn over anything while an answer streams
    page.locator("#stop").click(force=True)  # at once: a busy page may not be "stable" for a while
    row = wait_for_status(db, question, 0, timeout=120)
    assert (row["status"], row["error"], row["output_tokens"]) == ("stopped", STOPPED, None)
    assert row["text"]  # the partial answer is kept
    wait_until(lambda: engine.num_unfinished_requests() == 0, 30, "vLLM to drop the request")
    caption(page, 0).get_by_text(f"Stopped · {clock(page, row['created_at'])}", exact=True).wait_for(timeout=90_000)
    screenshot(page, "chat-stopped")
    page.close()


def test_closing_the_tab_mid_answer_leaves_the_answer_to_be_written_whole(browser, long_answers, held_answers):
    # Only Stop ends an answer: a customer who closes the tab (or whose connection drops) finds the whole answer when
    # they come back.
    url, db, server = long_answers
    page, question = while_streaming(browser, url, db, "Explain your whole warranty policy, step by step.", PHONE,
                                     held_answers)
    for selector in ("#message textarea", "#send"):
        assert above_the_fold(page, selector), f"{selector} is below the fold while an answer streams"
    assert_tidy(page)
    page.close()
    # The server knows the tab has gone while the answer is held, unfinished: its next update closes the page's event.
    wait_until(lambda: events_of_gone_pages(server.app) == 1, 60, "the server to see the tab go")
    assert conversation(db, question)[-1]["status"] == "generating"
    held_answers.release()
    row = wait_for_status(db, question, 0, timeout=300)  # (left to finish: 15 s or more)
    assert (row["status"], row["error"], row["finish_reason"], row["output_tokens"]) == ("ok", None, "length", 750)
    # The answer is stored before the desk lets it go: wait for that, not for a moment.
    wait_until(lambda: server.services.desk.answers_in_progress() == 0, 30, "the desk to let the stored answer go")


def test_what_the_customer_types_while_an_answer_streams_stays_and_the_sidebar_lists_the_chat(browser, long_answers,
                                                                                                held_answers):
    # The answer's last update must leave the message box alone; the sidebar refreshes once the answer is stored.
    url, db, _ = long_answers
    page, asked = while_streaming(browser, url, db, "What does shipping cost?", DESKTOP, held_answers)
    box = page.locator("#message textarea")
    box.fill("And gift wrapping?")
    assert conversation(db, asked)[-1]["status"] == "generating"  # typed while the answer is written
    held_answers.release()
    caption(page, 0).wait_for(timeout=120_000)
    assert wait_for_status(db, asked, 0)["status"] == "ok"
    page.locator("#conversations label").filter(has_text=asked).wait_for(timeout=90_000)
    assert box.input_value() == "And gift wrapping?"
    page.close()


def shown_html(text: str) -> str:
    """A stored answer's text as the chat shows it (its Markdown as HTML): what Gradio names the message by."""
    from app.chat.render import _message, shown_answer

    return _message("assistant", shown_answer(text).rstrip())["content"][0]["text"]


def test_retry_on_a_reopened_conversation_replaces_the_last_answer(browser, server_url, db):
    page = open_chat(browser, server_url)
    tag = uuid.uuid4().hex[:6]
    questions = [f"发票多久能开出来？{tag}", f"可以换开抬头吗？{tag}"]
    for i, question in enumerate(questions):
        caption(page, ask(page, question, watch=False)).wait_for(timeout=120_000)
    before = conversation(db, questions[0])

    page.reload()
    page.wait_for_function(READY, timeout=90_000)
    page.locator("#conversations label").filter(has_text=questions[0]).click()
    caption(page, 1).wait_for(timeout=90_000)
    page.locator("#retry").click()
    retried = wait_for_status(db, questions[0], 2)
    assert retried["status"] == "ok"
    after = conversation(db, questions[0])
    assert [(r["id"], r["role"], r["status"]) for r in after] == [
        (before[0]["id"], "user", "ok"), (before[1]["id"], "assistant", "ok"),
        (before[2]["id"], "user", "ok"), (before[3]["id"], "assistant", "replaced"), (retried["id"], "assistant", "ok")]

    # The page shows the conversation as stored: each question once, one answer each, the new one last.
    page.wait_for_function("""([n, text]) => {
        const answers = document.querySelectorAll('#chatbot .message.bot');
        const words = (s) => s.replace(/\\s+/g, ' ').trim();
        return answers.length === n && answers[n - 1].querySelector('.thought-group')
            && words(answers[n - 1].querySelector('[data-testid=bot]').getAttribute('aria-label'))
               === words("bot's message: " + text);
    }""", arg=[2, shown_html(retried["text"])], timeout=90_000)
    chat = page.locator("#chatbot")
    assert [chat.locator("[data-testid=user]").nth(i).inner_text() for i in range(2)] == questions
    assert chat.locator("[data-testid=user]").count() == 2
    # The retried answer's first text was measured again, and its caption says so.
    glyph_ms = first_visible(db, retried["id"])
    caption(page, 1).filter(has_text=f"{seconds(glyph_ms)} 秒内开始回复").wait_for(timeout=90_000)
    screenshot(page, "chat-retried")
    page.close()


def test_a_published_template_reaches_a_fresh_page_and_an_internal_one_never(browser, server_url, console, aio,
                                                                             services):
    zh, en = f"售后-{uuid.uuid4().hex[:6]}", f"after-sales-{uuid.uuid4().hex[:6]}"
    for name, language in ((zh, "zh"), (en, "en")):
        aio(console.templates.create(name=name, text=f"{name}：七天无理由退货。", user="op", language=language))
        aio(console.templates.publish(name=name, version=1, user="op"))
    page = open_chat(browser, server_url)
    page.locator("#template input").click()
    options = page.locator("#template [data-testid=dropdown-option]")
    options.first.wait_for()
    shown = [options.nth(i).get_attribute("aria-label") for i in range(options.count())]
    assert shown == [t.shown_name for t in services.catalog.customer_facing("zh")]  # titles, where they have one
    assert zh in shown  # published a moment ago, no restart
    assert "商城通用规则" not in shown  # the internal parent of 电子产品 and 服装鞋包
    assert en not in shown and "Orders and returns" not in shown  # another language's templates
    assert shown[:3] == ["购物咨询", "手机电脑数码", "服装鞋包"]
    screenshot(page, "chat-templates")
    page.close()


def test_html_and_script_in_a_message_render_inert(browser, server_url):
    page = open_chat(browser, server_url)
    attack = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script><b>bold?</b>'
    caption(page, ask(page, attack, watch=False)).wait_for(timeout=120_000)
    assert page.evaluate("window.__xss") is None  # neither the handler nor the script ran
    assert page.locator("#chatbot script").count() == 0
    assert page.locator("#chatbot img[onerror]").count() == 0
    screenshot(page, "chat-xss")
    page.close()
