"""The templates/ file format: a few ``key: value`` header lines, a ``---`` line, then the text.

    name: 电子产品
    parent: 商城通用规则
    language: zh
    title: 手机电脑
    example: 手机屏幕碎了能保修吗？
    example: 电脑激活后还能退吗？
    ---
    当前商品类别：电子产品……

``title`` is the topic's name for customers; each ``example`` line is a question an empty chat suggests (at
most MAX_EXAMPLES, in the file's order).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

HEADER_KEYS = ("name", "parent", "language", "pinned", "internal", "title", "example")
MAX_TITLE_CHARS = 60
MAX_EXAMPLES = 4
MAX_EXAMPLE_CHARS = 200


class TemplateFileError(ValueError):
    """A template file is malformed; the message names the file and the problem."""


@dataclass(frozen=True)
class TemplateFile:
    name: str
    text: str
    parent: str = ""
    language: str = "zh"
    pinned: bool = False
    internal: bool = False  # a shared base for other templates, never offered to customers
    title: str = ""  # the topic's name for customers ("" shows the name)
    examples: tuple[str, ...] = ()  # questions an empty chat suggests


def parse(content: str, *, source: str = "<text>") -> TemplateFile:
    head, sep, text = content.partition("\n---\n")
    if not sep:
        raise TemplateFileError(f"{source}: no '---' line between the header and the text")
    fields: dict[str, str] = {}
    examples: list[str] = []
    for line in head.splitlines():
        if not line.strip():
            continue
        key, colon, value = line.partition(":")
        key = key.strip()
        if not colon or key not in HEADER_KEYS:
            raise TemplateFileError(f"{source}: header line {line!r} is not one of {', '.join(HEADER_KEYS)}")
        if key == "example":
            examples.append(value.strip())
        else:
            fields[key] = value.strip()
    if not fields.get("name"):
        raise TemplateFileError(f"{source}: the header needs a 'name:' line")
    try:
        title, examples = check_presentation(fields.get("title", ""), examples)
    except ValueError as exc:
        raise TemplateFileError(f"{source}: {exc}") from None
    return TemplateFile(
        name=fields["name"],
        text=text.strip(),
        parent=fields.get("parent", ""),
        language=fields.get("language", "zh") or "zh",
        pinned=fields.get("pinned", "").lower() in ("1", "true", "yes"),
        internal=fields.get("internal", "").lower() in ("1", "true", "yes"),
        title=title,
        examples=examples,
    )


class PresentationError(ValueError):
    """A title or suggested questions refused: ``code`` names the rule and ``params`` its numbers, for a console
    that says it in its own language; the message is the English."""

    def __init__(self, code: str, message: str, **params: int):
        super().__init__(message)
        self.code, self.params = code, params


def check_presentation(title: str, examples: list[str] | tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    """``(title, examples)`` as stored: stripped, empty questions dropped; raises PresentationError saying what to
    change when the title or a question is too long, or there are too many questions."""
    title = title.strip()
    questions = tuple(q.strip() for q in examples if q.strip())
    if len(title) > MAX_TITLE_CHARS:
        raise PresentationError("title_chars", f"the title has {len(title):,} characters; at most {MAX_TITLE_CHARS} "
                                "fit the topic picker. Shorten it.", chars=len(title), limit=MAX_TITLE_CHARS)
    if not title.isprintable():
        raise PresentationError("title_line", "the title must be one line of text, without line breaks or control "
                                "characters.")
    if not all(q.isprintable() for q in questions):
        raise PresentationError("question_line", "a suggested question must be one line of text, without line "
                                "breaks or control characters.")
    if len(questions) > MAX_EXAMPLES:
        raise PresentationError("questions", f"{len(questions)} suggested questions; an empty chat shows at most "
                                f"{MAX_EXAMPLES}. Keep the best ones.", count=len(questions), limit=MAX_EXAMPLES)
    for q in questions:
        if len(q) > MAX_EXAMPLE_CHARS:
            raise PresentationError("question_chars", f"a suggested question has {len(q):,} characters; at most "
                                    f"{MAX_EXAMPLE_CHARS}. Shorten it.", chars=len(q), limit=MAX_EXAMPLE_CHARS)
    return title, questions


def render(template: TemplateFile) -> str:
    lines = [f"name: {template.name}"]
    if template.parent:
        lines.append(f"parent: {template.parent}")
    lines.append(f"language: {template.language}")
    if template.pinned:
        lines.append("pinned: true")
    if template.internal:
        lines.append("internal: true")
    if template.title:
        lines.append(f"title: {template.title}")
    lines += [f"example: {q}" for q in template.examples]
    return "\n".join(lines) + "\n---\n" + template.text.strip() + "\n"


def read_folder(folder: Path) -> list[TemplateFile]:
    """Every ``*.txt`` template in ``folder``, parents before their children."""
    files = [parse(p.read_text(encoding="utf-8"), source=str(p)) for p in sorted(Path(folder).glob("*.txt"))]
    by_name = {f.name: f for f in files}
    ordered: list[TemplateFile] = []

    def visit(f: TemplateFile, seen: tuple[str, ...] = ()) -> None:
        if f in ordered:
            return
        if f.name in seen:
            raise TemplateFileError(f"{folder}: templates {' -> '.join(seen + (f.name,))} form a cycle")
        if f.parent:
            if f.parent not in by_name:
                raise TemplateFileError(f"{folder}: {f.name!r} names parent {f.parent!r}, which has no file")
            visit(by_name[f.parent], seen + (f.name,))
        ordered.append(f)

    for f in files:
        visit(f)
    return ordered
