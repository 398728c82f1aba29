"""How the operator's review queries scale: a SQLite database with N conversations (two turns each, a
share rated, some waiting for a person), then the time of each console query and the peak Python memory of
a full export. Prints a table and writes JSON:

    python -m bench.review_scale --conversations 20000 [--json out.json]
"""

from __future__ import annotations

import argparse
import io
import json
import random
import tempfile
import time
import tracemalloc
from datetime import timedelta
from pathlib import Path

from sqlalchemy import insert

from app import template_files
from app.db import open_database
from app.db import review as db_review
from app.db import templates as db_templates
from app.db.models import Conversation, Message, Rating, utcnow
from app.db.rows import ReviewFilter

ROOT = Path(__file__).resolve().parent.parent


def fill(db, n: int, seed: int = 1) -> None:
    """``n`` conversations of the seed templates, bulk-inserted: 4 messages each, a tenth rated, 1% waiting."""
    rng = random.Random(seed)
    templates = db.run(db_templates.published)
    now = utcnow()

    def rows(s):
        conversations, messages, ratings = [], [], []
        mid = 0
        for cid in range(1, n + 1):
            t = rng.choice(templates)
            at = now - timedelta(seconds=n - cid)
            waiting = rng.random() < 0.01
            conversations.append(dict(id=cid, session_key=f"s{cid % 997}", template_id=t.id, title=f"问题 {cid}",
                                      tenant="", created_at=at, template_version_id=t.version_id,
                                      handoff="waiting" if waiting else "", handoff_requested_at=at if waiting else None,
                                      handoff_operator=""))
            for turn in range(2):
                mid += 2
                messages.append(dict(id=mid - 1, conversation_id=cid, role="user", text=f"订单 {rng.randint(0, 10**6)} 怎么退货？",
                                     status="ok", author="", template_version_id=t.version_id, created_at=at,
                                     finished_at=at))
                messages.append(dict(id=mid, conversation_id=cid, role="assistant", text="您好，" * 40, status="ok",
                                     author="", template_version_id=t.version_id, prompt_tokens=700,
                                     num_cached_tokens=640, ttft_ms=rng.uniform(5, 50), output_tokens=48,
                                     decode_tokens_per_s=200.0, finish_reason="stop", created_at=at, finished_at=at,
                                     first_visible_ms=rng.uniform(20, 90)))
                if rng.random() < 0.1:
                    ratings.append(dict(message_id=mid, conversation_id=cid, template_version_id=t.version_id,
                                        thumbs=rng.choice((1, -1)), reason="", created_at=at, updated_at=at))
        for model, batch in ((Conversation, conversations), (Message, messages), (Rating, ratings)):
            for i in range(0, len(batch), 5000):
                s.execute(insert(model), batch[i:i + 5000])

    db.run(rows)


def timed(fn, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=20000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="review-scale-"))
    db = open_database(f"sqlite:///{folder / 'review.db'}")
    db.run(db_templates.seed, template_files.read_folder(ROOT / "templates"))
    started = time.perf_counter()
    fill(db, args.conversations)
    fill_s = time.perf_counter() - started
    search = lambda **f: db.run(db_review.search, filter=ReviewFilter(**f), page=1, page_size=20)  # noqa: E731
    results = {
        "list, first page": timed(lambda: search()),
        "list, page 500": timed(lambda: db.run(db_review.search, filter=ReviewFilter(), page=500, page_size=20)),
        "rating down": timed(lambda: search(rating="down")),
        "waiting for a person": timed(lambda: search(status="waiting")),
        "template 电商客服": timed(lambda: search(template="电商客服")),
        "text search": timed(lambda: search(text="订单 12345")),
        "transcript": timed(lambda: db.run(db_review.transcript, conversation_id=args.conversations // 2)),
        "versions of 电商客服": timed(lambda: db.run(db_review.split_view, template="电商客服"), repeat=1),
    }
    out = io.StringIO()
    tracemalloc.start()
    started = time.perf_counter()
    n_rows = db.run(db_review.export, filter=ReviewFilter(), fmt="csv", out=_Discard(out), include_text=True)
    results["export, all (csv)"] = (time.perf_counter() - started) * 1000
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    db.close()
    print(f"{args.conversations:,} conversations, {n_rows:,} messages (filled in {fill_s:.1f} s)")
    for name, ms in results.items():
        print(f"  {name:<24} {ms:9.1f} ms")
    print(f"  export peak Python memory {peak / 2**20:.1f} MiB")
    if args.json:
        args.json.write_text(json.dumps({"conversations": args.conversations, "messages": n_rows, "ms": results,
                                         "export_peak_mib": peak / 2**20}, indent=1, ensure_ascii=False))


class _Discard:
    """A file that counts what is written and keeps none of it (the export's own memory is measured)."""

    def __init__(self, _unused):
        self.chars = 0

    def write(self, text: str) -> int:
        self.chars += len(text)
        return len(text)


if __name__ == "__main__":
    main()
