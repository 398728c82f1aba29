"""A database that refuses or holds up writes: a clear message, no half-written conversation — and,
because every query runs off the event loop, no other user's answer or health check waits for it."""

import json
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
import uuid

import httpx
import pytest

from app.core.desk import DeskInputError
from app.db import Database
from tests.helpers.desks import desk_for
from tests.helpers.servers import ROOT, SecondServer


def answer(aio, desk, message="我要退货"):
    async def run():
        return [e async for e in desk.answer(session_key=f"s-{uuid.uuid4().hex}", client="192.0.2.1",
                                             template_name="support-en", message=message, max_tokens=2)]
    return aio(run())


def count(services, table):
    return services.db.run(lambda s: s.connection().exec_driver_sql(f"select count(*) from {table}").scalar())


def test_a_read_only_database_refuses_the_message_with_a_clear_error(services, aio, settings):
    path = settings.database_url.removeprefix("sqlite:///")
    read_only = Database(f"sqlite:///file:{path}?mode=ro&uri=true")
    desk = desk_for(services, db=read_only)
    before = count(services, "messages")
    with pytest.raises(DeskInputError) as exc:
        answer(aio, desk)
    assert str(exc.value).startswith("Your message could not be saved, so it was not sent: the database could "
                                     "not be written (attempt to write a readonly database)")
    assert count(services, "messages") == before
    read_only.close()


def test_a_locked_database_refuses_the_message_and_the_app_keeps_working(services, aio, settings):
    path = settings.database_url.removeprefix("sqlite:///")
    locker = sqlite3.connect(path, timeout=1)
    locker.execute("BEGIN EXCLUSIVE")
    try:
        conversations = sqlite3.connect(path).execute("select count(*) from conversations").fetchone()[0]
        with pytest.raises(DeskInputError) as exc:
            answer(aio, services.desk)
        assert str(exc.value).startswith("Your message could not be saved, so it was not sent: the database could "
                                         "not be written (database is locked)")
    finally:
        locker.rollback()
        locker.close()
    assert sqlite3.connect(path).execute("select count(*) from conversations").fetchone()[0] == conversations
    events = answer(aio, services.desk)  # the lock is gone: the desk works again
    assert events[-1].message.status == "ok"


LOCK_S = 5.0


def test_a_write_lock_held_for_five_seconds_stalls_no_stream_and_no_health_check(services, engine_loop, tmp_path):
    """One user's answer streams while the database is locked and another user's message waits for it."""
    templates = tmp_path / "templates"
    templates.mkdir()
    shutil.copy(ROOT / "templates" / "02-support-en.txt", templates)  # 386 tokens + 1,500 fit in 2,048
    with SecondServer(services, engine_loop, tmp_path, max_tokens=1500, templates_dir=str(templates)) as url:
        arrivals: list[float] = []
        streaming = threading.Event()

        def stream_long_answer():
            body = {"model": "support-en", "messages": [{"role": "user", "content": "Tell me everything."}],
                    "stream": True, "max_tokens": 1500, "ignore_eos": True}
            with httpx.stream("POST", url + "v1/chat/completions", json=body, timeout=120) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        arrivals.append(time.monotonic())
                        streaming.set()

        reader = threading.Thread(target=stream_long_answer)
        reader.start()
        assert streaming.wait(30)
        path = str(tmp_path / "prefixdesk.db")
        locker = sqlite3.connect(path, timeout=1)
        locker.execute("BEGIN EXCLUSIVE")
        locked_at = time.monotonic()
        chat_result: dict = {}

        def chat_during_lock():
            # Its message must wait for the lock, on the database's thread. A process of its own: a client
            # importing gradio_client in this process would hold the GIL the server needs.
            code = ("import json, sys; from gradio_client import Client; "
                    "print(json.dumps(Client(sys.argv[1], verbose=False).predict("
                    "'I want a refund', None, 'support-en', None, None, api_name='/chat')))")
            out = subprocess.run([sys.executable, "-c", code, url], capture_output=True, text=True, timeout=120)
            chat_result.update(json.loads(out.stdout.strip().splitlines()[-1]))

        chatter = threading.Thread(target=chat_during_lock)
        chatter.start()
        health_ms = []
        while time.monotonic() - locked_at < LOCK_S:
            started = time.monotonic()
            assert httpx.get(url + "healthz", timeout=5).status_code == 200
            health_ms.append((time.monotonic() - started) * 1000)
            time.sleep(0.2)
        unlocked_at = time.monotonic()
        locker.rollback()
        locker.close()
        reader.join(120)
        chatter.join(120)

    during = [t for t in arrivals if locked_at <= t <= unlocked_at]
    gaps_ms = [(b - a) * 1000 for a, b in zip(during, during[1:])]
    # The 1,500-token answer streams for ~5-8 s on this machine, about as long as the lock: it must have kept
    # streaming for most of it (the other user's message met the lock at its start), with no gap anywhere.
    assert min(arrivals[-1], unlocked_at) - locked_at > 0.6 * LOCK_S
    assert len(during) > 100  # tokens kept coming the whole time
    assert max(gaps_ms) < 200, f"a {max(gaps_ms):.0f} ms gap in the stream while the database was locked"
    # A /healthz waiting on the lock would take the rest of its 5 s. The probes come from this process, which
    # also runs the server and reads the stream: on a loaded 2-core machine one probe in ten may be scheduled
    # late (172 ms seen in CI while a gradio_client process started), so the bound is on the 90th percentile.
    assert max(health_ms) < 1_000, f"/healthz took {max(health_ms):.0f} ms while the database was locked"
    p90 = sorted(health_ms)[int(len(health_ms) * 0.9) - 1]
    assert p90 < 100, f"/healthz took {p90:.0f} ms at p90 while the database was locked: {sorted(health_ms)}"
    assert chat_result["status"] == "ok"  # stored once the lock was gone
    stored = sqlite3.connect(path).execute("select role, status from messages order by id").fetchall()
    assert stored == [("user", "ok"), ("assistant", "ok")]
    print(f"\nlocked {LOCK_S:.0f} s: {len(during)} chunks, largest gap {max(gaps_ms):.0f} ms, "
          f"/healthz at most {max(health_ms):.0f} ms")

