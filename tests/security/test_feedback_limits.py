"""Attack: poison a split's figures with scripted ratings and first-text times (issue 28).

Before: ratings and the browser's first-text reports were counted without limit per client, so 24 scripted
conversations from 3 addresses made v1 100% 👍 at 1 ms and v2 100% 👎 at 600,000 ms. After: each kind is counted
at most PREFIXDESK_FEEDBACK_PER_CLIENT times an hour per address and PREFIXDESK_FEEDBACK_PER_SESSION per browser;
past either a report is not stored (the 600,000 ms bound stays). Scaled down here: 3 per address, 2 per browser.
"""

from __future__ import annotations

import pytest
import sqlite_utils

from app import template_files
from app.core.catalog import TemplateCatalog
from app.core.limits import FEEDBACK_WINDOW_S, FeedbackLimiter
from app.db import open_database
from app.db import templates as db_templates
from tests.helpers.clocks import ManualClock
from tests.helpers.desks import desk_for
from tests.helpers.servers import collect

A, B = "192.0.2.50", "198.51.100.50"


@pytest.fixture()
def fresh(services, tmp_path):
    """The session's engine with a database of the test's own and a feedback limiter on a manual clock."""
    path = tmp_path / "feedback.db"
    db = open_database(f"sqlite:///{path}")
    db.run(db_templates.seed, template_files.read_folder(services.settings.templates_dir))
    catalog = TemplateCatalog(db, services.prompts)
    catalog.load()
    clock = ManualClock()
    desk = desk_for(services, db=db, catalog=catalog,
                    feedback=FeedbackLimiter(per_client=3, per_session=2, clock=clock))
    yield desk, clock, sqlite_utils.Database(path)
    db.close()


def answer(aio, desk, session: str, client: str, conversation_id: int | None = None):
    events = aio(collect(desk.answer(session_key=session, client=client, template_name="support-en",
                                     message="Where is my parcel?", conversation_id=conversation_id, max_tokens=2,
                                     ignore_eos=True)))
    return events[-1].message


def test_ratings_and_first_text_times_past_a_clients_share_are_not_counted(fresh, aio):
    desk, clock, rows = fresh
    first = answer(aio, desk, "s1", A)
    c1 = [first] + [answer(aio, desk, "s1", A, first.conversation_id) for _ in range(2)]
    c2, c3, c5 = (answer(aio, desk, s, A) for s in ("s2", "s3", "s5"))
    c4 = answer(aio, desk, "s4", B)

    def rate(session, client, m):
        return aio(desk.rate(session_key=session, message_id=m.id, thumbs=1, client=client))

    # One browser: its first two ratings count, the third is past the browser's share.
    assert [rate("s1", A, m) for m in c1] == [True, True, False]
    # The same address in fresh browsers: one more counts (3 from A), the next is past the address's share.
    assert [rate("s2", A, c2), rate("s3", A, c3)] == [True, False]
    assert rate("s4", B, c4) is True  # another address has its own share
    kept = {r["message_id"] for r in rows.query("select message_id from ratings")}
    assert kept == {c1[0].id, c1[1].id, c2.id, c4.id}
    clock.advance(FEEDBACK_WINDOW_S)  # an hour on, A's share is free again
    assert rate("s3", A, c3) is True
    assert rows.execute("select count(*) from ratings").fetchone()[0] == 5

    # First-text times: a kind of its own, with its own share. A's first three count, the fourth does not.
    def report(session, client, m, ms):
        return aio(desk.first_visible(session_key=session, conversation_id=m.conversation_id, ms=ms, client=client))

    # (A first-text time sooner than the engine's first token is refused on its own: these are all later.)
    reported = [report("s1", A, c1[-1], 500_000), report("s2", A, c2, 500_000), report("s3", A, c3, 500_000),
                report("s5", A, c5, 500_000), report("s4", B, c4, 600_000)]
    assert [r is not None for r in reported] == [True, True, True, False, True]
    stored = {r["id"]: r["first_visible_ms"] for r in rows.query(
        "select id, first_visible_ms from messages where role = 'assistant'")}
    assert stored == {c1[0].id: None, c1[1].id: None, c1[2].id: 500_000.0, c2.id: 500_000.0, c3.id: 500_000.0,
                      c5.id: None, c4.id: 600_000.0}


def test_idle_keys_are_forgotten():
    clock = ManualClock()
    limiter = FeedbackLimiter(per_client=1, per_session=1, clock=clock)
    for k in range(255):
        assert limiter.allow("rating", client=f"10.0.{k // 256}.{k % 256}", session_key=f"s{k}")
    assert limiter.num_keys() == 510
    clock.advance(FEEDBACK_WINDOW_S)
    assert limiter.allow("rating", client="10.9.9.9", session_key="fresh")  # the 256th call sweeps idle keys
    assert limiter.num_keys() == 2
