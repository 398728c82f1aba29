"""Servers a run will need, started early: one after another, in a thread of their own, while the first tests run.

An engine start is some 40 s of one core's work (vLLM imported in three processes, one after another), and the run
used to wait for each server its tests met: the edge server, the cluster, the web tier, the faults' servers. A module
registers how its server starts (``register``) when it is imported; once the run is collected, the servers its tests
use start in the order the tests meet them (``begin``), each once the one before it is ready, so that at most one
start at a time shares the machine with the tests. A fixture takes its server (``take``): the one started early, or
one it starts then (a run that collected no test of it). Nothing else changes: the fixture waits for it to be ready
as before, and stops it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol


class Server(Protocol):
    def wait_ready(self) -> object: ...

    def stop(self) -> int: ...


Start = Callable[[Path], Server]  # begins a server on a data folder of its own; returns it without waiting for it

_starts: dict[str, Start] = {}
_early: dict[str, _Early] = {}
_lock = threading.Lock()  # held while a server starts; once the run has ended (_ended), nothing more starts
_ended = False


class _Early:
    def __init__(self, data_dir: Path):
        self.data_dir = data_dir
        self.started = threading.Event()
        self.server: Server | None = None
        self.error: BaseException | None = None
        self.taken = False


def register(fixture: str, start: Start) -> None:
    """``start`` begins the server that ``fixture`` yields."""
    _starts[fixture] = start


def begin(fixtures: Iterable[str], mktemp: Callable[[str], Path]) -> list[str]:
    """Starts, in a daemon thread and in this order, the registered servers among ``fixtures`` (the fixture names
    of the collected tests, in the order the tests use them); returns their names."""
    names = [name for name in dict.fromkeys(fixtures) if name in _starts and name not in _early]
    for name in names:
        _early[name] = _Early(mktemp(name))
    threading.Thread(target=_start_each, args=(names,), name="early-servers", daemon=True).start()
    return names


def take(fixture: str, mktemp: Callable[[str], Path]) -> Server:
    """The server ``fixture`` yields: the one started early (raising what its start raised), else one started now."""
    early = _early.get(fixture)
    if early is None or early.taken:
        return _starts[fixture](mktemp(fixture))
    with _lock:
        early.taken = True
        if not early.started.is_set():  # the thread has not come to it yet: no waiting for the servers before it
            early.started.set()
            return _starts[fixture](early.data_dir)
    if early.error is not None:
        raise early.error
    return early.server


def stop_untaken() -> None:
    """Starts nothing more, and stops every server started early whose fixture never took it (a run that stopped at
    its first failure)."""
    global _ended
    with _lock:
        _ended = True
    for early in _early.values():
        if not early.taken and early.server is not None:
            early.server.stop()


def _start_each(names: list[str]) -> None:
    for name in names:
        early = _early[name]
        with _lock:
            try:
                if _ended or early.taken:
                    continue
                early.server = _starts[name](early.data_dir)
            except BaseException as exc:  # the fixture raises it, in its test
                early.error = exc
            finally:
                early.started.set()
        if early.server is not None:
            try:
                early.server.wait_ready()
            except BaseException:  # the fixture's own wait says what it died of
                pass
