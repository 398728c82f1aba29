"""Copy under an answer gives the answer and nothing else: not its caption (the time and figures folded under its
title), whichever way the browser lets the page copy (the clipboard API, or Gradio's own textarea where there is
none)."""

import pytest

from app.db import conversations as db_conversations
from tests.helpers.chat_page import ask, caption, conversation, faults, open_chat, tag

REPLY = "Your parcel ships **today**.\n\n- track it under *Orders*\n- or write to us"
REPLY_COPIED = "Your parcel ships today.\n\n- track it under Orders\n- or write to us"
COPY = "#chatbot button[aria-label='复制']"
# The clipboard API gone, as on a page served over plain http from another host: Gradio then copies through a
# textarea of its own (document.execCommand). The test keeps the API to read what was copied.
NO_CLIPBOARD_API = """
window.__pdClipboard = navigator.clipboard;
delete Navigator.prototype.clipboard;
"""


@pytest.mark.parametrize("clipboard_api", [True, False], ids=["clipboard-api", "textarea"])
def test_copy_gives_the_answer_without_its_caption(browser, server_url, db, services, aio, clipboard_api):
    context = browser.new_context(viewport={"width": 1366, "height": 900}, locale="en-US")
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server_url.rstrip("/"))
    page = context.new_page()
    if not clipboard_api:
        page.add_init_script(NO_CLIPBOARD_API)
    page = open_chat(browser, server_url, page=page)
    clipboard = "navigator.clipboard" if clipboard_api else "window.__pdClipboard"
    assert page.evaluate("'clipboard' in navigator") is clipboard_api

    question = f"包裹什么时候发货？{tag()}"
    first = ask(page, question, watch=False)
    caption(page, first).wait_for(timeout=120_000)
    rows = conversation(db, question)
    answer = rows[1]
    title = caption(page, first).inner_text().strip()
    caption(page, first).click()
    details = page.locator("#chatbot .message.bot").nth(first).locator(".thought-group .content").inner_text().strip()
    assert title and details  # what a copy must leave out
    # The browser's clipboard outlives a context: empty it, so the wait below sees this copy and no earlier one.
    page.evaluate(f"{clipboard}.writeText('')")
    page.locator(COPY).nth(1).click()  # the question's, then the answer's
    page.wait_for_function(f"async () => (await {clipboard}.readText()).length > 0", timeout=90_000)
    copied = page.evaluate(f"{clipboard}.readText()")
    assert title not in copied and details not in copied
    # The caption's words, unless the random model wrote them into the answer itself.
    for word in ("秒", "UTC"):
        assert (word in copied) == (word in answer["text"]), word
    assert copied.strip() and copied == copied.strip()

    # A person's reply, whose text the test chose: copied exactly as the customer reads it, caption left out.
    page.locator("#person").click()
    page.locator("#person").wait_for(state="hidden", timeout=90_000)
    aio(services.db.write(db_conversations.take, conversation_id=answer["conversation_id"], operator="ana.lee"))
    aio(services.db.write(db_conversations.person_reply, conversation_id=answer["conversation_id"],
                          operator="ana.lee", text=REPLY))
    page.wait_for_function("() => document.querySelectorAll('#chatbot .pd-md').length === 2", timeout=90_000)
    page.wait_for_function("() => [...document.querySelectorAll('#chatbot .thought-group .title')]"
                           ".some(t => t.innerText.includes('人工客服'))", timeout=90_000)
    page.evaluate(f"{clipboard}.writeText('')")
    # The reply's group is the answer's (one turn: the answer, its caption, the notice, the reply, its caption).
    page.locator(COPY).last.click()
    page.wait_for_function(f"async () => (await {clipboard}.readText()).length > 0", timeout=90_000)
    assert page.evaluate(f"{clipboard}.readText()") == copied + "\n\n" + REPLY_COPIED
    assert faults(page) == []
    context.close()
