"""Answers read like answers: a person's reply (as a model's answer) is safe Markdown in the chat — lists, emphasis,
code and links drawn; raw HTML, images and links anywhere but http(s)/mailto shown as the text they were written
with — while a customer's question stays literal text. The replies are an operator's (the handoff), so the test
chooses every character the chat shows."""

import inspect

import pytest

from app.db import conversations as db_conversations
from tests.helpers.browser import DESKTOP, assert_tidy, screenshot
from tests.helpers.chat_page import ask, caption, conversation, faults, open_chat, tag

REL = 'target="_blank" rel="noopener noreferrer nofollow"'
BENIGN = ("Here is what to do:\n\n1. Open **Orders**\n2. Pick *the parcel*\n\n- run `track 42`\n"
          "- or mail [support](mailto:help@example.com)\n\n```\nprint('<ok>')\n```\n\n"
          "See [the guide](https://example.com/guide?a=1&b=2).")
COPIED = ("Here is what to do:\n\n1. Open Orders\n2. Pick the parcel\n\n- run track 42\n- or mail support\n\n"
          "print('<ok>')\n\nSee the guide.")
# (reply, the answer's HTML as the browser holds it)
REPLIES = [
    (BENIGN,
     '<div class="pd-md"><p>Here is what to do:</p>\n<ol>\n<li>Open <strong>Orders</strong></li>\n'
     '<li>Pick <em>the parcel</em></li>\n</ol>\n<ul>\n<li>run <code>track 42</code></li>\n'
     f'<li>or mail <a href="mailto:help@example.com" {REL}>support</a></li>\n</ul>\n'
     "<pre><code>print('&lt;ok&gt;')\n</code></pre>\n"
     f'<p>See <a href="https://example.com/guide?a=1&amp;b=2" {REL}>the guide</a>.</p>\n</div>'),
    ("<b>x</b><script>window.__pdXss = 1</script>",
     '<div class="pd-md"><p>&lt;b&gt;x&lt;/b&gt;&lt;script&gt;window.__pdXss = 1&lt;/script&gt;</p>\n</div>'),
    ('<img src=x onerror="window.__pdXss = 2">',
     '<div class="pd-md"><p>&lt;img src=x onerror="window.__pdXss = 2"&gt;</p>\n</div>'),
    ("![a](http://192.0.2.1/y.png)", '<div class="pd-md"><p>![a](http://192.0.2.1/y.png)</p>\n</div>'),
    ("[a](javascript:window.__pdXss=3)", '<div class="pd-md"><p>[a](javascript:window.__pdXss=3)</p>\n</div>'),
    ("[a](data:text/html,<script>alert(1)</script>)",
     '<div class="pd-md"><p>[a](data:text/html,&lt;script&gt;alert(1)&lt;/script&gt;)</p>\n</div>'),
    ("*" * 20_000, '<div class="pd-md"><hr>\n</div>'),  # a line of asterisks is a thematic break
]
DEEP_QUOTES = ">" * 200 + " deep"
DEEP_LIST = "".join("  " * i + "- x\n" for i in range(200))
# What the chat may hold of an answer, whatever it says: no image, script, frame or form, and no handler attribute.
DANGER_JS = """() => {
  const bad = [...document.querySelectorAll('#chatbot img, #chatbot script, #chatbot iframe, #chatbot form,'
                                           + ' #chatbot object, #chatbot embed, #chatbot svg image')];
  for (const el of document.querySelectorAll('#chatbot *'))
    for (const name of el.getAttributeNames()) if (name.toLowerCase().startsWith('on')) bad.push(el);
  return bad.map(el => el.outerHTML.slice(0, 80)).concat(window.__pdXss ? ['ran: ' + window.__pdXss] : []);
}"""


def answers_html(page) -> list[str]:
    return page.evaluate("() => [...document.querySelectorAll('#chatbot .pd-md')].map(e => e.outerHTML)")


@pytest.mark.parametrize("viewport", [DESKTOP], ids=["desktop"])
def test_a_persons_markdown_renders_safely_and_a_question_stays_text(browser, server_url, db, services, aio,
                                                                      viewport):
    context = browser.new_context(viewport=viewport)
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server_url.rstrip("/"))
    page = open_chat(browser, server_url, viewport, page=context.new_page())
    question = f"**bold** [a](https://example.com) <b>x</b> `c` {tag()}"
    caption(page, ask(page, question, watch=False)).wait_for(timeout=120_000)
    conversation_id = conversation(db, question)[0]["conversation_id"]
    shown_question = page.locator("#chatbot [data-testid=user]").last
    assert shown_question.inner_text().strip() == question
    assert shown_question.locator("a, strong, b, code").count() == 0

    page.locator("#person").click()
    page.locator("#person").wait_for(state="hidden", timeout=90_000)
    aio(services.db.write(db_conversations.take, conversation_id=conversation_id, operator="Ana"))
    for text, _ in REPLIES:
        aio(services.db.write(db_conversations.person_reply, conversation_id=conversation_id, operator="Ana",
                              text=text))
    for text in (DEEP_QUOTES, DEEP_LIST):
        aio(services.db.write(db_conversations.person_reply, conversation_id=conversation_id, operator="Ana",
                              text=text))
    count = len(REPLIES) + 3  # the model's answer, the replies, the two deep ones
    page.wait_for_function(f"() => document.querySelectorAll('#chatbot .pd-md').length >= {count}",
                           timeout=90_000)  # the page's poll, every 3 s
    shown = answers_html(page)
    assert len(shown) == count
    assert shown[1:len(REPLIES) + 1] == [html for _, html in REPLIES]
    # nested as deep as markdown-it's 20 levels (where it would drop the rest): the whole text, as text
    assert shown[-2:] == ['<div class="pd-md pd-text">' + "&gt;" * 200 + " deep</div>",
                          '<div class="pd-md pd-text">' + inspect.cleandoc(DEEP_LIST) + "</div>"]
    assert page.locator("#chatbot .pd-text").last.inner_text().count("- x") == 200
    assert page.evaluate(DANGER_JS) == []
    links = page.evaluate("() => [...document.querySelectorAll('#chatbot a')].filter(a => a.closest('.pd-md'))"
                          ".map(a => [a.getAttribute('href'), a.target, a.rel])")
    assert links[-2:] == [["mailto:help@example.com", "_blank", "noopener noreferrer nofollow"],
                          ["https://example.com/guide?a=1&b=2", "_blank", "noopener noreferrer nofollow"]]
    # the question, still literal after the page redrew the conversation
    assert page.locator("#chatbot [data-testid=user]").first.inner_text().strip() == question
    page.reload()  # a reopened conversation shows the same
    page.wait_for_function(f"() => document.querySelectorAll('#chatbot .pd-md').length >= {count}", timeout=90_000)
    assert answers_html(page)[1:] == shown[1:]
    assert page.evaluate(DANGER_JS) == []
    # The reloaded page scrolls itself to the last message; until it has, Gradio floats its "Scroll down" over it.
    page.wait_for_function("() => ![...document.querySelectorAll('#chatbot .scroll-down-button-container button')]"
                           ".some(b => b.offsetParent !== null)", timeout=90_000)
    assert_tidy(page)
    screenshot(page, "chat-markdown")
    # Copy under the answers gives what the customer reads, not the HTML the page draws it from.
    page.locator("#chatbot button[aria-label='复制']").last.click()
    copied = page.evaluate("navigator.clipboard.readText()")
    assert COPIED in copied
    assert "<b>x</b><script>window.__pdXss = 1</script>" in copied  # the hostile text, as the customer read it
    assert "pd-md" not in copied and "<div" not in copied and "&lt;" not in copied
    assert faults(page) == []
    context.close()
