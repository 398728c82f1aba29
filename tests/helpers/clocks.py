"""A clock a test moves by hand, for what waits for a deadline: console sessions and login delays."""

from __future__ import annotations

from datetime import datetime, timedelta

from app.db.models import utcnow


class ManualClock:
    """Monotonic seconds and the UTC time, moving together only when ``advance`` says so. The UTC time starts at
    the real one, so what it stamps sits among the rows the real clock wrote. Called, it is the monotonic time
    (LoginThrottle's clock); as ``clock=`` it is an admin.access.Clock."""

    def __init__(self):
        self.now_s = 1000.0
        self._utc_at_start = utcnow()

    def __call__(self) -> float:
        return self.now_s

    def monotonic(self) -> float:
        return self.now_s

    def utcnow(self) -> datetime:
        return self._utc_at_start + timedelta(seconds=self.now_s - 1000.0)

    def advance(self, seconds: float) -> None:
        self.now_s += seconds
