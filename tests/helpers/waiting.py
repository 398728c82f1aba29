"""Waiting for something that happens a moment later: a value (vLLM updates /metrics a step after the answer)
or a condition (a server is up, an answer is stored). The only deadline loops of the suite."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

POLL_S = 0.05


def eventually(read, expected, timeout_s: float = 5.0):
    """``read()`` once it equals ``expected``, else its last value when ``timeout_s`` has passed."""
    deadline = time.monotonic() + timeout_s
    while (value := read()) != expected and time.monotonic() < deadline:
        time.sleep(0.1)
    return value


def wait_until(predicate: Callable[[], T], timeout_s: float, what: str | Callable[[], str], *,
               poll_s: float = POLL_S) -> T:
    """The first truthy value of ``predicate()``, asked every ``poll_s``; raises AssertionError naming ``what``
    (a text, or a function that describes what was seen last) when ``timeout_s`` passes first. An exception
    from ``predicate`` (a server that exited, say) ends the wait at once."""
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        if time.monotonic() >= deadline:
            raise AssertionError(f"waited {timeout_s:g} s for {what() if callable(what) else what}")
        time.sleep(poll_s)
    return value
