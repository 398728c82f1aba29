"""An answer is Markdown, and nothing in it becomes markup beyond Markdown's own few tags: HTML is text, an image is
text, a link goes only to http(s) or mailto (with target and rel), and deep nesting is shown whole as text. Exact
HTML from app/chat/markdown.py (the chat's browser test shows the same in chromium)."""

import pytest

from app.chat.render import _message
from app.chat.markdown import markdown_html

REL = 'target="_blank" rel="noopener noreferrer nofollow"'


def md(inner: str) -> str:
    return f'<div class="pd-md">{inner}</div>'


@pytest.mark.parametrize("answer, html", [
    ("<b>x</b><script>alert(1)</script>", md("<p>&lt;b&gt;x&lt;/b&gt;&lt;script&gt;alert(1)&lt;/script&gt;</p>\n")),
    ("<img src=x onerror=alert(1)>", md("<p>&lt;img src=x onerror=alert(1)&gt;</p>\n")),
    ("<div>\n<iframe src=//e.com>\n</div>", md("<p>&lt;div&gt;<br>\n&lt;iframe src=//e.com&gt;<br>\n&lt;/div&gt;</p>\n")),
    ("![a](http://x/y.png)", md("<p>![a](http://x/y.png)</p>\n")),
    ('![a](http://x/y.png "t") and ![b][r]\n\n[r]: http://x/z.png', md("<p>![a](http://x/y.png &quot;t&quot;) and ![b][r]</p>\n")),
    ("[a](javascript:alert(1))", md("<p>[a](javascript:alert(1))</p>\n")),
    ("[a](JaVa&#115;cript:alert(1))", md("<p>[a](JaVascript:alert(1))</p>\n")),
    ("[a](java\tscript:alert(1))", md("<p>[a](java\tscript:alert(1))</p>\n")),
    ("[a](data:text/html,<script>alert(1)</script>)",
     md("<p>[a](data:text/html,&lt;script&gt;alert(1)&lt;/script&gt;)</p>\n")),
    ("[a](vbscript:x) [b](file:///etc/passwd) [c](/admin) [d](#top)",
     md("<p>[a](vbscript:x) [b](file:///etc/passwd) [c](/admin) [d](#top)</p>\n")),
    ("<javascript:alert(1)> <data:text/html,x>", md("<p>&lt;javascript:alert(1)&gt; &lt;data:text/html,x&gt;</p>\n")),
    ("[x]: javascript:alert(1)\n\n[x]", md("<p>[x]: javascript:alert(1)</p>\n<p>[x]</p>\n")),
    ('[a](https://e.com/?q="><script>)', md(f'<p><a href="https://e.com/?q=%22%3E%3Cscript%3E" {REL}>a</a></p>\n')),
    ("[![i](http://x/i.png)](https://e.com)", md(f'<p><a href="https://e.com" {REL}>![i](http://x/i.png)</a></p>\n')),
    ("<https://e.com/a> [m](mailto:a@b.c) [H](HTTPS://E.COM)",
     md(f'<p><a href="https://e.com/a" {REL}>https://e.com/a</a> <a href="mailto:a@b.c" {REL}>m</a> '
        f'<a href="HTTPS://E.COM" {REL}>H</a></p>\n')),
    ("`<b>` and\n```html\n<script>x</script>\n```",
     md('<p><code>&lt;b&gt;</code> and</p>\n<pre><code class="language-html">&lt;script&gt;x&lt;/script&gt;\n'
        '</code></pre>\n')),
    ('```"><img src=x onerror=alert(1)>\nx\n```',
     md('<pre><code class="language-&quot;&gt;&lt;img">x\n</code></pre>\n')),
    ("*" * 20_000, md("<hr>\n")),
    # Gradio draws a diagram from an element of class "mermaid" (an image from its label): a fence is only code
    ("```mermaid\ngraph TD\n  A[\"<img src=x>\"]\n```",
     md('<pre><code class="language-mermaid">graph TD\n  A[&quot;&lt;img src=x&gt;&quot;]\n</code></pre>\n')),
])
def test_hostile_answers_are_text(answer, html):
    assert markdown_html(answer) == html


def test_a_benign_answer_renders():
    answer = "Steps:\n\n1. Open **Orders**\n2. Pick *one*\n\n- run `x`\n\n> quoted\n\n### Done\nline\nbreak"
    assert markdown_html(answer) == md(
        "<p>Steps:</p>\n<ol>\n<li>Open <strong>Orders</strong></li>\n<li>Pick <em>one</em></li>\n</ol>\n"
        "<ul>\n<li>run <code>x</code></li>\n</ul>\n<blockquote>\n<p>quoted</p>\n</blockquote>\n<h3>Done</h3>\n"
        "<p>line<br>\nbreak</p>\n")


@pytest.mark.parametrize("answer", [">" * 200 + " deep", "".join("  " * i + "- x\n" for i in range(200)),
                                    "> " * 10_000 + "deep"])
def test_nesting_as_deep_as_markdown_it_goes_is_shown_whole_as_text(answer):
    # markdown-it stops at 20 levels and drops the rest; the customer reads the whole answer instead
    assert markdown_html(answer) == f'<div class="pd-md pd-text">{answer.replace(">", "&gt;")}</div>'


def test_questions_notices_and_captions_stay_text():
    question = _message("user", "**bold** [a](https://e.com) <b>x</b>")
    assert question["content"][0]["text"] == "**bold** [a](https://e.com) &lt;b&gt;x&lt;/b&gt;"
    caption = _message("assistant", "**1.2 s**", "<b>title</b>", 7)
    assert caption["content"][0]["text"] == "**1.2 s**"
    answer = _message("assistant", "**yes**")
    assert answer["content"][0]["text"] == md("<p><strong>yes</strong></p>\n")
