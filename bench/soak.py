"""``make soak``: N simulated customers hold multi-turn conversations against a real server.

Loopback only, bounded in users, turns and time. It starts its own server (``python -m app`` on a
free port with a fresh data folder) unless ``--url`` names one, then checks that every message the
clients sent and every answer they received is in the database, and prints a summary table.

    python -m bench.soak --users 50 --minutes 3
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

QUESTIONS = [
    "我刚买的手机屏幕碎了能退吗？", "价格保护怎么申请？", "什么时候能发货？", "发票可以换开抬头吗？",
    "积分怎么抵扣？", "Can I return boots I wore once?", "How long does express shipping take?",
    "会员等级怎么升级？", "退款多久到账？", "可以换一个尺码吗？",
]


@dataclass
class UserLog:
    sent: int = 0
    answered: int = 0
    busy: int = 0
    errors: list[str] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)
    message_ids: list[int] = field(default_factory=list)
    timeouts: int = 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--minutes", type=float, default=2.0)
    parser.add_argument("--turns", type=int, default=6, help="most messages in one conversation")
    parser.add_argument("--timeout-s", type=float, default=120.0, help="longest a single answer may take")
    parser.add_argument("--cap", type=int, default=0, help="the server's max_concurrent_requests (0: its default)")
    parser.add_argument("--url", default="", help="an already running server (loopback only)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.users > 500 or args.minutes > 60:
        parser.error("at most 500 users and 60 minutes")
    from gradio_client import Client

    server = None if args.url else _Server(args.cap)
    url = args.url or server.url
    if not url.startswith(("http://127.", "http://localhost")):
        parser.error("--url must be a loopback address")
    templates = _templates(Client(url, verbose=False))
    rss_start = server.rss() if server else 0
    deadline = time.monotonic() + args.minutes * 60
    logs = [UserLog() for _ in range(args.users)]
    rng = random.Random(args.seed)
    plans = [(rng.choice(templates), rng.sample(QUESTIONS, k=min(args.turns, len(QUESTIONS))))
             for _ in range(args.users)]

    def user(i: int) -> None:
        template, questions = plans[i]
        log, client = logs[i], Client(url, verbose=False)
        while time.monotonic() < deadline:
            history: list[dict] = []
            conversation = None
            for question in questions:
                if time.monotonic() >= deadline:
                    return
                log.sent += 1
                started = time.monotonic()
                job = client.submit(question, history, template, conversation, None, api_name="/chat")
                try:
                    final = job.result(timeout=args.timeout_s)
                except TimeoutError:
                    log.timeouts += 1
                    job.cancel()
                    return
                except Exception as exc:  # the client's own failure: count it, keep the soak going
                    log.errors.append(f"{type(exc).__name__}: {exc}")
                    continue
                log.latencies_s.append(time.monotonic() - started)
                if final.get("status") == "ok":
                    log.answered += 1
                    log.message_ids.append(final["message_id"])
                    conversation = final["conversation_id"]
                    history += [{"role": "user", "content": question}, {"role": "assistant", "content": final["text"]}]
                elif "busy" in (final.get("error") or ""):
                    log.busy += 1
                else:
                    log.errors.append(final.get("error") or str(final))

    threads = [threading.Thread(target=user, args=(i,), daemon=True) for i in range(args.users)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(args.minutes * 60 + args.timeout_s + 30)
    elapsed = time.monotonic() - started
    rss_end = server.rss() if server else 0
    stored = _stored(server.data_dir / "prefixdesk.db") if server else None
    if server:
        server.stop()
    return _report(args, logs, elapsed, rss_start, rss_end, stored)


def _report(args, logs: list[UserLog], elapsed: float, rss_start: int, rss_end: int, stored) -> int:
    sent = sum(u.sent for u in logs)
    answered = sum(u.answered for u in logs)
    busy = sum(u.busy for u in logs)
    errors = [e for u in logs for e in u.errors]
    timeouts = sum(u.timeouts for u in logs)
    latencies = sorted(x for u in logs for x in u.latencies_s)
    ids = {i for u in logs for i in u.message_ids}
    rows = [
        ("users", args.users), ("minutes", f"{elapsed / 60:.1f}"), ("messages sent", sent),
        ("answers received (ok)", answered), ("busy answers", busy), ("errors", len(errors)),
        ("timeouts", timeouts),
        ("latency p50 / p99 s", f"{_pct(latencies, 50):.2f} / {_pct(latencies, 99):.2f}" if latencies else "-"),
        ("answers per s", f"{answered / elapsed:.2f}"),
    ]
    ok = not errors and not timeouts
    if stored is not None:
        user_rows, ok_ids, hit_rate = stored
        rows += [("user messages stored", user_rows), ("received answers stored as ok", len(ids & ok_ids)),
                 ("hit rate (stored rows)", f"{hit_rate:.3f}"),
                 ("server RSS start / end MiB", f"{rss_start / 2**20:.0f} / {rss_end / 2**20:.0f}")]
        ok = ok and user_rows == sent and ids <= ok_ids
    width = max(len(k) for k, _ in rows)
    print("\nsoak summary")
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")
    for e in errors[:5]:
        print("  error:", e)
    print("  result:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


def _pct(values: list[float], q: int) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def _templates(client) -> list[str]:
    probe = client.predict("?", [], "?", None, None, api_name="/chat")  # names the customer-facing templates
    names = probe["error"].split("Choose one of: ", 1)[1].rstrip(".").split(", ")
    return names


def _stored(db_path: Path):
    import sqlite3

    with sqlite3.connect(db_path) as db:
        user_rows = db.execute("select count(*) from messages where role = 'user'").fetchone()[0]
        ok_ids = {r[0] for r in db.execute("select id from messages where role = 'assistant' and status = 'ok'")}
        cached, prompt = db.execute(
            "select coalesce(sum(num_cached_tokens), 0), coalesce(sum(prompt_tokens), 0) from messages "
            "where role = 'assistant' and status = 'ok'").fetchone()
    return user_rows, ok_ids, cached / prompt if prompt else 0.0


class _Server:
    def __init__(self, cap: int):
        import psutil

        self._psutil = psutil
        self.data_dir = Path(tempfile.mkdtemp(prefix="prefixdesk-soak-"))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFIXDESK_")}
        env.update(PREFIXDESK_DATA_DIR=str(self.data_dir), PREFIXDESK_PORT=str(port), PREFIXDESK_MAX_TOKENS="64",
                   PREFIXDESK_RATE_LIMIT_PER_MINUTE="0", PREFIXDESK_MAX_STREAMS_PER_CLIENT="0",
                   PREFIXDESK_RATE_LIMIT_PER_ADDRESS_PER_MINUTE="0", PREFIXDESK_MAX_STREAMS_PER_ADDRESS="0",
                   PREFIXDESK_MAX_CONNECTIONS_PER_CLIENT="0",
                   GRADIO_ANALYTICS_ENABLED="False")
        if cap:
            env["PREFIXDESK_MAX_CONCURRENT_REQUESTS"] = str(cap)
        self.log = open(self.data_dir / "server.log", "wb")
        # Its own process group, this session: a new session is a scheduling group of its own (autogroup),
        # and a server streaming on a small machine would starve the clients that measure it.
        self.proc = subprocess.Popen([sys.executable, "-m", "app"], env=env, stdout=self.log,
                                     stderr=subprocess.STDOUT, process_group=0)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"soak: the server exited; see {self.data_dir / 'server.log'}")
            try:
                urllib.request.urlopen(self.url + "healthz", timeout=2)
                return
            except OSError:
                time.sleep(0.5)
        sys.exit("soak: the server did not start in 180 s")

    def rss(self) -> int:
        me = self._psutil.Process(self.proc.pid)
        return me.memory_info().rss + sum(c.memory_info().rss for c in me.children(recursive=True))

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)
        self.log.close()
        if os.environ.get("SOAK_KEEP_DATA") != "1":
            shutil.rmtree(self.data_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
