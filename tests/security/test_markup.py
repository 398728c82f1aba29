"""Attack: plant markup in a page — a remote image (a beacon), a phishing form, a diagram with an image.

Before: a deep link (``/gradio_api/deep_link`` then ``/?deep_link=``) opened another session's chat as
the victim's own page, and the chatbot rendered a message's Markdown and HTML through Gradio's
sanitizer, which keeps ``<img>`` and ``<form>``: the remote images were fetched and the form drawn
(no script ran). A Mermaid block drew an image from its label too.
After: deep links are gone (404, and ``?deep_link=`` opens the plain page); no other path carries one
customer's text into another's page (conversations, their titles and the page's state are the
session key's own); and the chatbot renders no Markdown of its own and escapes HTML: a question is text, and an
answer's Markdown is made into a few tags on the server, with images and HTML as text (app/chat/markdown.py;
tests/security/test_answer_markdown.py).
"""

import uuid

REMOTE = "127.0.0.9:9"  # nothing listens there; the test watches for any request to it
MARKUP = (f'<img src="http://{REMOTE}/img.png"> <form action="http://{REMOTE}/steal"><input name="password">'
          f'<button>登录</button></form> ![x](http://{REMOTE}/md.png)\n'
          f'```mermaid\ngraph TD\n  A["<img src=\'http://{REMOTE}/m.png\'>"] --> B\n```')
DRAWN = "#chatbot form, #chatbot img, #chatbot input, #chatbot .mermaid, #conversations form, #conversations img"


def open_chat(browser, url: str):
    page = browser.new_page()
    remote: list[str] = []
    page.on("request", lambda r: remote.append(r.url) if REMOTE in r.url else None)
    page.goto(url)
    page.wait_for_function("window.__pdGlyph && document.querySelector('#template input')?.value", timeout=90_000)
    return page, remote


def test_markup_in_a_message_is_shown_as_text_and_fetches_nothing(browser, server_url):
    page, remote = open_chat(browser, server_url)
    message = f"{MARKUP} {uuid.uuid4().hex[:6]}"
    page.locator("#message textarea").fill(message)
    page.locator("#send").click()
    page.locator("#chatbot .message.bot .thought-group").first.wait_for(timeout=120_000)
    assert page.locator("#chatbot [data-testid=user]").inner_text() == message  # as typed, line breaks and all
    assert page.locator(DRAWN).count() == 0
    # Reopened from the history (its title is the message's start), the stored conversation reads the same.
    page.reload()
    page.wait_for_function("window.__pdGlyph && document.querySelector('#template input')?.value", timeout=90_000)
    page.locator("#conversations label").first.click()
    page.locator("#chatbot .message.bot .thought-group").first.wait_for(timeout=90_000)
    assert page.locator("#chatbot [data-testid=user]").inner_text() == message
    assert page.locator(DRAWN).count() == 0
    page.wait_for_timeout(500)  # time for an image that was drawn after all to be asked for
    assert remote == []
    page.close()
