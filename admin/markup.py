"""Text from operators, templates and the model shown literally in the console's Markdown.

Gradio's Markdown renders inline HTML and Markdown images, so a template named ``<img src=http://…>``
or ``![](http://…)`` fetched that image in every operator's browser wherever the name was shown
(status lines, the editor's info, the warmup summary). ``literal`` takes the markup out of any text.
"""

from __future__ import annotations

import html
import re

# What makes Markdown fetch or build an element: HTML (escaped as entities, below) and the brackets of
# images, links and reference definitions. Other punctuation only changes how text looks, and escaping it
# would fill the values an API client reads with backslashes.
_MARKDOWN = re.compile(r"([\\!\[\]])")


def literal(text: object) -> str:
    """``text`` as Markdown with no HTML, image or link in it: ``<`` ``>`` ``&`` as entities, brackets escaped."""
    return _MARKDOWN.sub(r"\\\1", html.escape(str(text), quote=False))
