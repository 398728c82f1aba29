"""py-spy on a server process during one benchmark run: a flame graph of where its time goes.

``python -m bench --profile chat@70`` records the first run of the chat path at 70 req/s offered,
over its counted window (``chat@c64``: the closed burst of 64 users, over the whole burst), into
``profile-chat-70.svg`` under ``--out``. py-spy samples from outside (``--nonblocking``: the process
is never paused), so the profile costs the server nothing but a core of the machine's.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import sys
import time
from pathlib import Path

SAMPLE_RATE_HZ = 100


class ProfileError(RuntimeError):
    """py-spy is missing or failed; the message says which."""


def find_py_spy() -> str:
    """The py-spy executable: on PATH, beside this interpreter, or in a ``bin`` folder next to an entry of
    sys.path (``pip install --target DIR`` puts it in DIR/bin); raises ProfileError."""
    found = shutil.which("py-spy") or next(
        (str(c) for c in [Path(sys.executable).with_name("py-spy"), *(Path(p) / "bin" / "py-spy" for p in sys.path)]
         if c.is_file()), None)
    if found is None:
        raise ProfileError("--profile needs py-spy (pip install py-spy)")
    return found


def parse_profile(spec: str) -> tuple[str, str]:
    """``PATH@RATE`` or ``PATH@cN`` → (path, schedule label as runs name it: "poisson 70/s", "closed 64 users")."""
    path, at, what = spec.partition("@")
    if not at or not path or not what:
        raise ValueError(f"--profile {spec!r}: expected PATH@RATE (e.g. chat@70) or PATH@cN (e.g. chat@c64)")
    if what.startswith("c"):
        return path, f"closed {int(what[1:])} users"
    return path, f"poisson {float(what):g}/s"


class Recording:
    """py-spy record of ``pid`` from a wall-clock time on, for ``duration_s`` or until ``finish``."""

    def __init__(self, pid: int, out: Path, *, rate_hz: int = SAMPLE_RATE_HZ):
        self.pid, self.out, self.rate_hz = pid, out, rate_hz
        self.executable = find_py_spy()
        self.proc: asyncio.subprocess.Process | None = None
        self.task: asyncio.Task | None = None

    def begin(self, start_wall: float, duration_s: float | None) -> None:
        self.task = asyncio.create_task(self._record(start_wall, duration_s))

    async def finish(self) -> Path | None:
        """Stop recording (if it still runs) and return the flame graph, or None when py-spy wrote none."""
        if self.task is not None:
            if self.proc is not None and self.proc.returncode is None:
                self._interrupt()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(self.task, timeout=60)
        return self.out if self.out.is_file() else None

    async def _record(self, start_wall: float, duration_s: float | None) -> None:
        await asyncio.sleep(max(0.0, start_wall - time.time()))
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.proc = await asyncio.create_subprocess_exec(
            self.executable, "record", "--pid", str(self.pid), "--rate", str(self.rate_hz), "--nonblocking",
            "--format", "flamegraph", "--output", str(self.out), stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE)
        if duration_s is not None:
            try:
                await asyncio.wait_for(self.proc.wait(), timeout=duration_s)
            except asyncio.TimeoutError:
                self._interrupt()
        _, err = await self.proc.communicate()
        print(f"bench: py-spy on {self.pid}: {self.out if self.out.is_file() else 'no profile'}"
              + (f" ({err.decode(errors='replace').strip()[-300:]})" if not self.out.is_file() else ""), flush=True)

    def _interrupt(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGINT)  # py-spy writes its flame graph on SIGINT
