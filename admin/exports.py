"""The console's exports (transcripts, template files), kept on disk only as long as an operator needs them.

An export of conversations is a file of customers' words (tens of MB). Each export is written in a folder of its own
(0700) inside the console's private folder, which Gradio serves from without copying it again and which the
server removes at shutdown; a folder older than EXPORT_TTL_S is removed at the next export and by a timer
set when it is made. The clock is injectable, so a test moves time instead of waiting for it.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

EXPORT_TTL_S = 600.0  # ten minutes to click the download link; the console says so


class ExportFiles:
    def __init__(self, root: Path, *, ttl_s: float = EXPORT_TTL_S, clock: Callable[[], float] = time.monotonic):
        self.root = Path(root)
        self.ttl_s = ttl_s
        self._clock = clock
        self._made: dict[Path, float] = {}  # folder -> when it was made, on ``clock``
        self._lock = threading.Lock()  # new_path runs on the loop, prune on a thread
        self._timers: set[asyncio.Task] = set()

    def new_path(self, name: str) -> Path:
        """A path for one export's file named ``name``, in a fresh folder of its own (0700) under ``root``."""
        return self.new_folder() / name

    def new_folder(self) -> Path:
        """A fresh folder (0700) under ``root`` for one export's files, removed with them."""
        folder = Path(tempfile.mkdtemp(prefix="prefixdesk-export-", dir=self.root))
        with self._lock:
            self._made[folder] = self._clock()
        return folder

    def prune(self) -> int:
        """Remove the exports made EXPORT_TTL_S or longer ago; returns how many. Blocking: call it on a thread."""
        now = self._clock()
        with self._lock:
            old = [folder for folder, made in self._made.items() if now - made >= self.ttl_s]
        for folder in old:
            shutil.rmtree(folder, ignore_errors=True)
        with self._lock:  # only once gone from the disk: kept() says what is still there
            for folder in old:
                self._made.pop(folder, None)
        return len(old)

    def kept(self) -> list[Path]:
        """The export folders not removed yet, oldest first."""
        with self._lock:
            return list(self._made)

    def expire_later(self) -> None:
        """Prune once EXPORT_TTL_S has passed (on the running loop; the removal runs on a thread)."""
        task = asyncio.get_running_loop().create_task(self._prune_after(self.ttl_s))
        self._timers.add(task)
        task.add_done_callback(self._timers.discard)

    def close(self) -> None:
        """Remove every export now (the server is stopping)."""
        for task in list(self._timers):
            task.cancel()
        with self._lock:
            folders, self._made = list(self._made), {}
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)

    async def _prune_after(self, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        await asyncio.to_thread(self.prune)
