"""The queue's header line and the JSON the page's script reads, in both languages (no browser: the chromium test
is tests/admin/test_queue_browser.py)."""

import json
from datetime import datetime, timedelta

from admin.i18n import TEXT
from admin.queue_ui import admin_js, queue_line, queue_payload
from app.db.rows import PersonQueue

NOW = datetime(2026, 12, 2, 8, 0, 0)


def test_the_line_names_the_longest_waiting_first_in_whole_minutes():
    queue = PersonQueue(5, ((12, NOW - timedelta(minutes=61, seconds=59)), (40, NOW - timedelta(seconds=119)),
                            (41, NOW - timedelta(seconds=59))), (44, 43, 42, 41, 40))
    assert queue_line(queue, TEXT["en"], NOW) == (
        "⏳ **5 customers wait for a person**, longest first: #12 61 min · #40 1 min · #41 under 1 min · and 2 more")
    assert queue_line(queue, TEXT["zh"], NOW) == (
        "⏳ **5 位客户在等人工**，等得最久的在前：#12 61 分钟 · #40 1 分钟 · #41 不到 1 分钟 · 另有 2 位")
    one = PersonQueue(1, ((7, NOW - timedelta(minutes=3)),), (7,))
    assert queue_line(one, TEXT["en"], NOW) == "⏳ **1 customer waits for a person**: #7 3 min"
    assert queue_line(PersonQueue(0, (), ()), TEXT["zh"], NOW) == ""
    # a clock a little behind the database's: no negative wait
    assert queue_line(PersonQueue(1, ((7, NOW + timedelta(seconds=5)),), (7,)), TEXT["en"], NOW).endswith(
        "#7 under 1 min")


def test_the_page_reads_counts_ids_and_the_operator_and_its_texts_in_the_ui_language():
    assert json.loads(queue_payload(PersonQueue(2, (), (9, 4)), "ana")) == {"count": 2, "ids": [9, 4],
                                                                            "operator": "ana"}
    for language in ("en", "zh"):
        script = admin_js(language)
        assert "/*PD_TEXT*/{}" not in script
        assert json.dumps(TEXT[language]["queue_notice_body"], ensure_ascii=False) in script
