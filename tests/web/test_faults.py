"""Faults an operator fears, each on a real server process: a dying engine, a signal, bad settings."""

import json
import subprocess
import sys
import time
import urllib.request

import psutil
import sqlite_utils
from gradio_client import Client

from tests.helpers.servers import AppProcess, ROOT, app_env


def health(url) -> dict:
    try:
        with urllib.request.urlopen(url + "healthz", timeout=5) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return json.loads(exc.read())


def engine_core(server: AppProcess) -> psutil.Process:
    for child in psutil.Process(server.proc.pid).children(recursive=True):
        if "EngineCore" in " ".join(child.cmdline()) or "EngineCore" in child.name():
            return child
    raise AssertionError("no EngineCore child process")


def test_killed_engine_core_is_reported_stored_and_restarted(tmp_path):
    # Every answer runs to its 3,000 tokens (seconds here): the one below is still streaming when its core dies.
    server = AppProcess(app_env(tmp_path, max_tokens=3000, max_model_len=8192, ignore_eos="true"))
    try:
        server.wait_ready()
        assert health(server.url)["restarts"] == 0
        killer = signal_when_generating(tmp_path / "prefixdesk.db", engine_core(server).pid, 1, "SIGKILL")
        job = Client(server.url, verbose=False).submit("请详细说明退货流程", [], "电商客服", None, None, api_name="/chat")
        killer.wait(90)
        final = job.result(timeout=60)
        assert final["status"] == "error", ({k: v for k, v in final.items() if k != "text"}, killer.stdout.read())
        assert final["error"] == ("The answer broke off: the model stopped unexpectedly and is restarting; "
                                  "please retry in a moment.")
        deadline = time.monotonic() + 120
        while (h := health(server.url))["restarts"] != 1 or not h["ok"]:
            assert time.monotonic() < deadline, f"engine did not restart: {h}"
            time.sleep(0.5)
        again = Client(server.url, verbose=False).predict("还在吗？", [], "电商客服", None, None, api_name="/chat")
        assert again["status"] == "ok" and again["num_cached_tokens"] == 0  # a new, empty KV cache
        assert server.proc.poll() is None
    finally:
        assert server.stop() == 0
    db = sqlite_utils.Database(tmp_path / "prefixdesk.db")
    broken = db["messages"].get(final["message_id"])
    assert broken["status"] == "error" and broken["text"] == final["text"]
    assert [r["status"] for r in db["messages"].rows_where("role = 'assistant'", order_by="id")] == ["error", "ok"]


SIGNAL_WHEN_GENERATING = """
import os, signal, sqlite3, sys, time
path, pid, answers, sig = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), getattr(signal, sys.argv[4])
print("watching", flush=True)
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    db = sqlite3.connect(path)  # a fresh connection each time: an open one may keep reading an old snapshot
    try:
        generating = db.execute("select count(*) from messages where status = 'generating'").fetchall()[0][0]
    finally:
        db.close()
    if generating == answers:
        time.sleep(0.5)
        print("seen", time.time(), flush=True)
        break
    time.sleep(0.05)
os.kill(pid, sig)
print("sent", time.time(), flush=True)
"""


def signal_when_generating(db_path, pid: int, answers: int, sig: str) -> subprocess.Popen:
    """A separate process sends ``sig`` to ``pid`` once ``answers`` answers have been generating for 0.5 s, or
    after 60 s regardless; it prints "seen" only in the first case. It watches the database, not the test's
    gradio_client jobs, so how fast the test's own threads run does not matter."""
    watcher = subprocess.Popen([sys.executable, "-c", SIGNAL_WHEN_GENERATING, str(db_path), str(pid), str(answers),
                                sig], stdout=subprocess.PIPE, text=True)
    assert watcher.stdout.readline() == "watching\n"  # started (a Python start-up can take seconds here)
    return watcher


def test_sigterm_stores_answers_in_progress_as_stopped_and_exits_cleanly(tmp_path):
    # Every answer runs to its 6,000 tokens (about 25 s here): the signal always finds all three running.
    server = AppProcess(app_env(tmp_path, max_tokens=6000, max_model_len=8192, ignore_eos="true"))
    try:
        server.wait_ready()
        db = sqlite_utils.Database(tmp_path / "prefixdesk.db")
        clients = [Client(server.url, verbose=False) for _ in range(3)]  # each one a session of its own
        _jobs = [c.submit(f"问题{i}：请详细介绍会员等级", [], "电商客服", None, None, api_name="/chat")
                for i, c in enumerate(clients)]
        watcher = signal_when_generating(tmp_path / "prefixdesk.db", server.proc.pid, 3, "SIGTERM")
        assert server.proc.wait(150) == 0  # the watcher waits up to 60 s for the answers, then shutdown takes ~10 s
    finally:
        server.stop()
    stopped = list(db["messages"].rows_where("role = 'assistant'", order_by="id"))
    # The three sessions' answers stream at once: the signal found all three generating.
    assert "seen" in watcher.communicate(timeout=30)[0], [(a["status"], a["created_at"], a["finished_at"])
                                                          for a in stopped]
    assert [a["status"] for a in stopped] == ["stopped"] * 3
    assert [a["error"] for a in stopped] == ["stopped before the answer was complete"] * 3
    assert all(0 < a["output_tokens"] < 6000 and a["text"] for a in stopped)  # partial answers, with stats
    assert db["messages"].count_where("status = 'generating'") == 0  # no answer is left half-written
    users = sorted(u["text"] for u in db["messages"].rows_where("role = 'user'"))
    assert users == [f"问题{i}：请详细介绍会员等级" for i in range(3)]  # each question kept


def run_app(tmp_path, **settings) -> subprocess.CompletedProcess:
    env = app_env(tmp_path, **settings)
    return subprocess.run([sys.executable, "-m", "app"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=180)


def test_model_path_that_does_not_exist_names_the_setting(tmp_path):
    out = run_app(tmp_path, model="./no/such/model")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == (
        "prefixdesk: cannot start: PREFIXDESK_MODEL points to './no/such/model', which does not exist; "
        "give a local model folder or a hub id. Hugging Face id or local path of the model, or qwen2.5-0.5b-demo "
        "(a real small chat model that `make demo-model` prepares); empty uses the built-in random-weight demo model."
    )


def test_context_shorter_than_the_longest_template_names_the_setting(tmp_path):
    out = run_app(tmp_path, max_model_len=1024, max_tokens=48)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].startswith(
        "prefixdesk: cannot start: PREFIXDESK_MAX_MODEL_LEN is 1024, but template '电商客服' alone is 1042 tokens"
    )


def test_kv_cache_too_small_for_one_request_names_the_setting(tmp_path):
    out = run_app(tmp_path, kv_cache_mib=1)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == (
        "prefixdesk: cannot start: PREFIXDESK_KV_CACHE_MIB=1 holds 64 KV blocks of 32 tokens, but one request "
        "of PREFIXDESK_MAX_MODEL_LEN=2048 tokens needs 65; raise PREFIXDESK_KV_CACHE_MIB to at least 2 or lower "
        "PREFIXDESK_MAX_MODEL_LEN"
    )


def test_an_engine_that_stops_making_progress_is_reported_down_and_restarted(tmp_path):
    """A core that hangs without dying (its input thread killed by a malformed request, say) says nothing;
    the watchdog notices that requests stopped progressing, reports it, and restarts the engine."""
    server = AppProcess(app_env(tmp_path, max_tokens=6000, max_model_len=8192, engine_stall_timeout_s=3,
                                ignore_eos="true"))
    core = None
    try:
        server.wait_ready()
        core = engine_core(server)
        # SIGSTOP once the answer is generating: alive, silent, mid-answer (its 6,000 tokens take seconds). In
        # a loaded CI run an answer once ran on to its end regardless; then the core is thawed and a new answer
        # is stopped, at most three times: the watchdog must report one of them.
        for attempt in range(1, 4):
            freezer = signal_when_generating(tmp_path / "prefixdesk.db", core.pid, 1, "SIGSTOP")
            job = Client(server.url, verbose=False).submit(f"你好 {attempt}", [], "电商客服", None, None,
                                                           api_name="/chat")
            assert freezer.wait(90) == 0
            deadline = time.monotonic() + 30
            while (h := health(server.url))["ok"] and not job.done():
                assert time.monotonic() < deadline, f"the stall was not reported: {h}"
                time.sleep(0.2)
            if not h["ok"]:
                break
            core.resume()
        else:
            raise AssertionError("three stopped answers ran to their end; the watchdog reported none")
        assert h["reason"] in {f"no request has progressed for {s} s" for s in (3, 4)} | {"the model is restarting"}
        final = job.result(timeout=60)
        assert (final["status"], final["error"]) == ("error", "The answer broke off: the model stopped unexpectedly "
                                                              "and is restarting; please retry in a moment.")
        deadline = time.monotonic() + 120
        while (h := health(server.url))["restarts"] != 1 or not h["ok"]:
            assert time.monotonic() < deadline, f"engine did not restart: {h}"
            time.sleep(0.5)
        again = Client(server.url, verbose=False).predict("还在吗？", [], "电商客服", None, None, api_name="/chat")
        assert again["status"] == "ok"
    finally:
        if core is not None and core.is_running():
            core.kill()
        assert server.stop() == 0
