"""The templates/ file format: a few ``key: value`` header lines, a ``---`` line, then the text.

    name: 电子产品
    parent: 商城通用规则
    language: zh
    ---
    当前商品类别：电子产品……
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

HEADER_KEYS = ("name", "parent", "language", "pinned", "internal")


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


def parse(content: str, *, source: str = "<text>") -> TemplateFile:
    head, sep, text = content.partition("\n---\n")
    if not sep:
        raise TemplateFileError(f"{source}: no '---' line between the header and the text")
    fields: dict[str, str] = {}
    for line in head.splitlines():
        if not line.strip():
            continue
        key, colon, value = line.partition(":")
        key = key.strip()
        if not colon or key not in HEADER_KEYS:
            raise TemplateFileError(f"{source}: header line {line!r} is not one of {', '.join(HEADER_KEYS)}")
        fields[key] = value.strip()
    if not fields.get("name"):
        raise TemplateFileError(f"{source}: the header needs a 'name:' line")
    return TemplateFile(
        name=fields["name"],
        text=text.strip(),
        parent=fields.get("parent", ""),
        language=fields.get("language", "zh") or "zh",
        pinned=fields.get("pinned", "").lower() in ("1", "true", "yes"),
        internal=fields.get("internal", "").lower() in ("1", "true", "yes"),
    )


def render(template: TemplateFile) -> str:
    lines = [f"name: {template.name}"]
    if template.parent:
        lines.append(f"parent: {template.parent}")
    lines.append(f"language: {template.language}")
    if template.pinned:
        lines.append("pinned: true")
    if template.internal:
        lines.append("internal: true")
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
