"""An answer's Markdown as the chat shows it: lists, emphasis, headings, quotes, code and links — nothing else.

Answers (the model's and a person's) are Markdown; questions stay text (app/chat/render.py ``as_text``). The
HTML is made here, on the server, by markdown-it-py (CommonMark, which Gradio already depends on) set up so
that it can only write its own few tags:

- raw HTML is text: ``html`` is off, so ``<b>`` or ``<script>`` in an answer is escaped like any text;
- an image is text: ``![a](http://x/y.png)`` stays those characters (an image from elsewhere is a beacon);
- a link is a link only to ``http:``, ``https:`` or ``mailto:``; any other (``javascript:``, ``data:``, a
  relative one) stays the characters it was written with; a link opens in a new tab with
  ``rel="noopener noreferrer nofollow"``;
- an answer nested as deep as markdown-it's ``maxNesting`` (20 levels, where it would drop the rest of the
  text) is shown as the text it is, in full; each render is linear in the answer's length (a streaming answer
  is rendered once per screen update, 10 a second at most; a stored one once, then from a small cache).

The chatbot keeps Gradio's sanitizer on as the second line; it rewrites every link's ``rel`` to its own
"noopener noreferrer", and the page's script (static/chat.js) puts ``nofollow`` back.
"""

from __future__ import annotations

import functools
import html
import re

from markdown_it import MarkdownIt
from markdown_it.rules_inline import StateInline
from markdown_it.rules_inline.image import image as _image

LINK_TARGET = "_blank"
LINK_REL = "noopener noreferrer nofollow"
# What an answer's HTML is wrapped in: the chat's CSS lays Markdown out by it (chat.css).
WRAPPER_CLASS = "pd-md"
TEXT_CLASS = "pd-text"  # an answer shown as text: its line breaks kept
# A link's destination after markdown-it normalised it (entities decoded, spaces and controls %-encoded).
_LINKABLE = re.compile(r"(?:https?://|mailto:)", re.IGNORECASE)


@functools.lru_cache(maxsize=256)
def markdown_html(text: str) -> str:
    """``text`` (an answer, as Markdown) as HTML in a ``<div class="pd-md">``; as text in a
    ``<div class="pd-md pd-text">`` when it nests too deep to render whole."""
    inner = _inner_html(text)
    if inner is None:
        return f'<div class="{WRAPPER_CLASS} {TEXT_CLASS}">{html.escape(text, quote=False)}</div>'
    return f'<div class="{WRAPPER_CLASS}">{inner}</div>'


def streaming_html(text: str) -> str:
    """``markdown_html`` of an answer still being written, at a cost that does not grow with what was already
    shown: its blocks up to the last blank line outside a code fence are settled, rendered once and kept
    (_settled_html), and only the block being written is rendered at each update. Rendering the whole answer at
    every update took 16% of a web process's time on the GPU host (docs/benchmarks.md). The finished answer is
    rendered whole (markdown_html), which may join what a blank line split here (a loose list) or resolve a link
    defined further on."""
    cut = _settled_end(text)
    head = _settled_html(text[:cut]) if cut else ""
    tail = _inner_html(text[cut:])
    if head is None or tail is None:
        return markdown_html(text)
    return f'<div class="{WRAPPER_CLASS}">{head}{tail}</div>'


def _settled_end(text: str) -> int:
    """Where the text after the last blank line that no open code fence holds begins (0: none)."""
    end = text.rfind("\n\n")
    while end > 0:
        head = text[:end]
        if head.count("```") % 2 == 0 and head.count("~~~") % 2 == 0:
            return end + 2
        end = text.rfind("\n\n", 0, end)
    return 0


@functools.lru_cache(maxsize=1024)
def _settled_html(text: str) -> str | None:
    return _inner_html(text)


def _inner_html(text: str) -> str | None:
    """The HTML of ``text``'s blocks, or None when it nests as deep as markdown-it's limit."""
    env: dict = {}
    tokens = _MD.parse(text, env)
    if any(token.level >= _MD.options.maxNesting - 1 for token in tokens):
        return None
    return _MD.renderer.render(tokens, _MD.options, env)


def _linkable(url: str) -> bool:
    return _LINKABLE.match(url) is not None


def _image_as_text(state: StateInline, silent: bool) -> bool:
    """An image's whole source (``![alt](src "title")``) as text, where markdown-it would make an ``<img>``."""
    start = state.pos
    if not _image(state, True):  # silent: only finds where the image ends
        return False
    if not silent:
        state.push("text", "", 0).content = state.src[start:state.pos]
    return True


def _link_open(self, tokens, idx, options, env) -> str:
    tokens[idx].attrSet("target", LINK_TARGET)
    tokens[idx].attrSet("rel", LINK_REL)
    return self.renderToken(tokens, idx, options, env)


def _build() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "breaks": True, "xhtmlOut": False})
    md.validateLink = _linkable
    md.inline.ruler.at("image", _image_as_text)
    md.add_render_rule("link_open", _link_open)
    return md


_MD = _build()
