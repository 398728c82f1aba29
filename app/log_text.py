"""Log lines that a client cannot forge: control characters escaped, one record per line.

A value a client sent (a path, a header, a file name) that reaches a log line could otherwise start a
line of its own with a newline — a fake ERROR, a fake login. ``printable`` escapes it; ``OneLineFormatter``
applies it to every record the server writes (its message and the message of an exception it carries),
so lines of ours and of uvicorn's are safe even where a call forgets. ``RateLimitedLog`` writes at most
one line a period for an event an attacker can repeat at will (refused connections, unknown routes).
This module imports nothing of the app, so every layer may use it.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import traceback
from collections.abc import Callable

MAX_VALUE_CHARS = 300
# C0 controls, DEL, C1 controls and the Unicode line and paragraph separators.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(value: object, limit: int = MAX_VALUE_CHARS) -> str:
    """``value`` as one line of text: control characters written as escapes (``\\n``, ``\\x1b``) and at most
    ``limit`` characters (``limit`` 0: all). Applying it twice changes nothing, so a value escaped by its log
    call passes the formatter unchanged."""
    text = _CONTROL.sub(lambda m: _NAMED.get(m.group(), f"\\x{ord(m.group()):02x}"
                                           if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}"), str(value))
    if limit and len(text) > limit:
        text = text[:limit] + f"… ({len(text) - limit:,} more)"
    return text


class OneLineFormatter(logging.Formatter):
    """A formatter whose records cannot span lines a client chose: the message is ``printable``, and an
    exception's traceback keeps its frames (our code) with its message escaped."""

    def format(self, record: logging.LogRecord) -> str:
        cached, record.exc_text = record.exc_text, None  # another formatter's text would not be escaped
        try:
            return super().format(record)
        finally:
            record.exc_text = cached

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        record.message = printable(record.message, limit=0)
        return super().formatMessage(record)

    def formatException(self, ei) -> str:  # noqa: N802
        return "".join(_EscapedTraceback(*ei, compact=True).format()).rstrip("\n")


class _EscapedTraceback(traceback.TracebackException):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # The chained exceptions were built as plain TracebackExceptions: escape their messages too.
        pending = [self.__cause__, self.__context__]
        while pending:
            chained = pending.pop()
            if chained is not None and type(chained) is traceback.TracebackException:
                chained.__class__ = _EscapedTraceback
                pending += [chained.__cause__, chained.__context__]

    def format_exception_only(self):
        for chunk in super().format_exception_only():
            yield printable(chunk.rstrip("\n"), limit=0) + "\n"


class RateLimitedLog:
    """At most one line every ``period_s`` for one kind of event, counting the ones it left out."""

    def __init__(self, logger: logging.Logger, *, period_s: float = 1.0, level: int = logging.WARNING,
                 clock: Callable[[], float] = time.monotonic):
        self._logger = logger
        self._period_s = period_s
        self._level = level
        self._clock = clock
        self._lock = threading.Lock()
        self._next_at = 0.0
        self._left_out = 0

    def __call__(self, message: str, *args: object) -> None:
        """Log ``message % args`` now, or count it when a line went out less than ``period_s`` ago."""
        with self._lock:
            now = self._clock()
            if now < self._next_at:
                self._left_out += 1
                return
            left_out, self._left_out, self._next_at = self._left_out, 0, now + self._period_s
        suffix = f" ({left_out:,} more since the last line)" if left_out else ""
        self._logger.log(self._level, message + "%s", *args, suffix)
