"""Waiting for a value that arrives a moment later (vLLM updates /metrics a step after the answer)."""

from __future__ import annotations

import time


def eventually(read, expected, timeout_s: float = 5.0):
    """``read()`` once it equals ``expected``, else its last value when ``timeout_s`` has passed."""
    deadline = time.monotonic() + timeout_s
    while (value := read()) != expected and time.monotonic() < deadline:
        time.sleep(0.1)
    return value
