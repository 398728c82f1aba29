"""Text from operators, templates and the model shown literally in the console's Markdown.

Gradio's Markdown renders inline HTML and Markdown images, so a template named ``<img src=http://…>``
or ``![](http://…)`` fetched that image in every operator's browser wherever the name was shown
(status lines, the editor's info, the warmup summary). ``literal`` makes any text show as itself.
"""

from __future__ import annotations

import html
import re

# CommonMark lets any ASCII punctuation be escaped with a backslash; these are the ones that start markup
# (emphasis, links and images, code, headings, lists, tables, Gradio's LaTeX delimiters).
_MARKDOWN = re.compile(r"([\\`*_{}\[\]()#+\-.!|~$:])")


def literal(text: object) -> str:
    """``text`` as Markdown that renders exactly that text: HTML escaped, Markdown punctuation escaped."""
    return _MARKDOWN.sub(r"\\\1", html.escape(str(text), quote=False))
