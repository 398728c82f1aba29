"""Gradio's own words as its frontend bundles them, read from the built files: each language's words are one
``var`` statement of plain values — backtick strings and objects of them, whose values may name an earlier
variable — with the language's table the object that has ``_name``. Only that much JavaScript is read."""

from __future__ import annotations

import re
from pathlib import Path

import gradio

GRADIO = Path(gradio.__file__).parent / "templates"
_NAME = re.compile(r'[A-Za-z_$][\w$]*|"[^"]*"')


def words(locale: str) -> dict[str, str]:
    """Gradio's words for ``locale`` ("en", "zh-CN"…), flattened to its keys ("chatbot.copy_message": …)."""
    if locale == "en":  # bundled into the frontend's core; the server build keeps it in a statement of its own
        source = next(text for path in sorted((GRADIO / "node" / "build" / "server" / "chunks").glob("*.js"))
                      if "=`English`," in (text := path.read_text(encoding="utf-8")))
        start = source.rindex("var ", 0, source.index("=`English`,"))
    else:
        (path,) = (GRADIO / "frontend" / "assets").glob(f"{locale}-*.js")
        source = path.read_text(encoding="utf-8")
        start = source.index("var ")
    names = _Reader(source, start + len("var ")).statement()
    (table,) = [v for v in names.values() if isinstance(v, dict) and "_name" in v]
    flat: dict[str, str] = {}

    def walk(value: dict, prefix: str) -> None:
        for key, item in value.items():
            if isinstance(item, dict):
                walk(item, f"{prefix}{key}.")
            elif key != "_name" or prefix:
                flat[prefix + key] = item
    walk(table, "")
    return flat


class _Reader:
    def __init__(self, source: str, at: int):
        self.s, self.i, self.names = source, at, {}

    def statement(self) -> dict:
        while True:
            name = self._name()
            self._expect("=")
            self.names[name] = self._value()
            if self.s[self.i] == ";":
                return self.names
            self._expect(",")

    def _value(self):
        c = self.s[self.i]
        if c == "`":
            end = self.s.index("`", self.i + 1)
            text, self.i = self.s[self.i + 1:end], end + 1
            assert "${" not in text, text
            return text
        if c == "{":
            self.i += 1
            out = {}
            while self.s[self.i] != "}":
                key = self._name().strip('"')
                self._expect(":")
                out[key] = self._value()
                if self.s[self.i] == ",":
                    self.i += 1
            self.i += 1
            return out
        return self.names[self._name()]  # an earlier variable

    def _name(self) -> str:
        m = _NAME.match(self.s, self.i)
        assert m, self.s[self.i:self.i + 40]
        self.i = m.end()
        return m.group()

    def _expect(self, char: str) -> None:
        assert self.s[self.i] == char, (char, self.s[self.i:self.i + 40])
        self.i += 1
