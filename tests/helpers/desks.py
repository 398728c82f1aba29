"""A Desk of a test's own on the session's engine: its own database, catalog or limits."""

from __future__ import annotations

from app.core.desk import Desk
from app.core.limits import ClientLimiter, FeedbackLimiter


def desk_for(services, *, db=None, catalog=None, limiter: ClientLimiter | None = None,
             tenant_secret: str = "test-secret", feedback: FeedbackLimiter | None = None) -> Desk:
    """The session's engine and prompts with ``db``, ``catalog`` and ``limiter`` of the test's choosing
    (default: the session's database and catalog, no limits)."""
    return Desk(db=db or services.db, catalog=catalog or services.catalog, engine=services.engine,
                prompts=services.prompts, limiter=limiter or ClientLimiter(per_minute=0, concurrent=0),
                tenant_secret=tenant_secret, feedback=feedback)
