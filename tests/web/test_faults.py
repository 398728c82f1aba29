"""Faults an operator fears, each on a real server process: a dying engine, a signal, bad settings."""

import json
import re
import signal
import subprocess
import sys
import urllib.request

import psutil
import pytest
import sqlite_utils
from gradio_client import Client

from tests.helpers.chat_page import tag
from tests.helpers.servers import AppProcess, ROOT, app_env, slow_answers
from tests.helpers.waiting import wait_until


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


STALL_S = 10
BROKE_OFF = "The answer broke off: the model stopped unexpectedly and is restarting; please retry in a moment."


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    """One server for an engine that dies and one that hangs, each mid-answer (answers stream for 15 s or more), and
    for a SIGTERM under answers in progress, which ends it (the module's last test)."""
    # A stall timeout of 10 s, not less: after a restart the next question's whole prefill is one engine step, and a
    # busy machine (two busy loops beside the suite) once held such a step past a 3-s timeout: a second restart.
    data = tmp_path_factory.mktemp("faults")
    server = AppProcess(app_env(data, engine_stall_timeout_s=STALL_S, warm_on_start=False, **slow_answers()))
    try:
        server.wait_ready()
        yield server, sqlite_utils.Database(data / "prefixdesk.db")
    finally:
        assert server.stop() == 0


def test_killed_engine_core_is_reported_stored_and_restarted(faulty):
    server, db = faulty
    restarts = health(server.url)["restarts"]
    core = engine_core(server)
    job = Client(server.url, verbose=False).submit("请详细说明退货流程", [], "电商客服", None, None, api_name="/chat")
    wait_until(job.outputs, 90, "the answer's first text")
    core.kill()  # mid-answer: it streams for 15 s or more
    final = job.result(timeout=60)
    assert (final["status"], final["error"]) == ("error", BROKE_OFF), {k: v for k, v in final.items() if k != "text"}
    wait_restarted(server, restarts + 1)
    again = Client(server.url, verbose=False).predict("还在吗？", [], "电商客服", None, None, api_name="/chat")
    assert (again["status"], again["num_cached_tokens"]) == ("ok", 0)  # a new, empty KV cache
    assert server.proc.poll() is None
    broken = db["messages"].get(final["message_id"])
    assert (broken["status"], broken["text"]) == ("error", final["text"])
    assert db["messages"].get(again["message_id"])["status"] == "ok"


def wait_restarted(server: AppProcess, restarts: int) -> None:
    """Until /healthz reports ``restarts`` restarts of the engine and it healthy again."""
    seen: dict = {}

    def restarted() -> bool:
        seen.update(health(server.url))
        return seen["restarts"] == restarts and seen["ok"]

    wait_until(restarted, 120, lambda: f"the engine to restart (last /healthz: {seen})", poll_s=0.5)


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


def test_an_engine_that_stops_making_progress_is_reported_down_and_restarted(faulty):
    """A core that hangs without dying (its input thread killed by a malformed request, say) says nothing;
    the watchdog notices that requests stopped progressing, reports it, and restarts the engine."""
    server, _ = faulty
    restarts = health(server.url)["restarts"]
    core = engine_core(server)
    try:
        job = Client(server.url, verbose=False).submit("你好", [], "电商客服", None, None, api_name="/chat")
        wait_until(job.outputs, 90, "the answer's first text")
        core.suspend()  # SIGSTOP mid-answer (it streams for 15 s or more): alive, silent
        seen: dict = {}

        def reported() -> bool:
            seen.update(health(server.url))
            return not seen["ok"]

        wait_until(reported, 60, lambda: f"/healthz to report the stall (last: {seen})", poll_s=0.2)
        # Reported once the stall passes its timeout; a poll on a slow moment may read it a second or two later.
        stalled = re.fullmatch(r"no request has progressed for (\d+) s", seen["reason"])
        assert (stalled and int(stalled[1]) >= STALL_S) or seen["reason"] == "the model is restarting", seen
        final = job.result(timeout=60)
        assert (final["status"], final["error"]) == ("error", BROKE_OFF)
        wait_restarted(server, restarts + 1)
        again = Client(server.url, verbose=False).predict("还在吗？", [], "电商客服", None, None, api_name="/chat")
        assert again["status"] == "ok"
    finally:
        if core.is_running():
            core.kill()


# A cold prefill cut into steps of PREFILL_CHUNK tokens, each held STEP_PAUSE_MS by the step delay: the 电商客服
# template's 1,042 tokens alone take 33 steps, 23 s or more, over twice a stall timeout of PREFILL_STALL_S, while
# each step (0.7 s) leaves that timeout 9.3 s of room for a machine that stalls for seconds (two busy loops beside
# the suite on 2 cores: at 6 s, a loaded run once saw the watchdog restart a progressing engine).
PREFILL_CHUNK = 32
STEP_PAUSE_MS = 700
PREFILL_STALL_S = 10


def test_a_prefill_longer_than_the_stall_timeout_is_progress_and_a_silent_core_is_not(tmp_path):
    """The watchdog tells a busy engine from a dead one: a cold prefill that outlasts the stall timeout, step by
    step, is answered and restarts nothing; the same engine, stopped in a prefill, is reported and restarted."""
    server = AppProcess(app_env(tmp_path, engine_stall_timeout_s=PREFILL_STALL_S, engine_step_delays=True,
                                step_delay_ms=STEP_PAUSE_MS, max_num_seqs=PREFILL_CHUNK,
                                max_num_batched_tokens=PREFILL_CHUNK, max_tokens=4, ignore_eos=True,
                                warm_on_start=False))  # nothing warm: the first question's prefill is all of it
    core = None
    try:
        server.wait_ready()
        slow = Client(server.url, verbose=False).predict("发票可以开公司抬头吗？", [], "电商客服", None, None,
                                                         api_name="/chat")
        assert (slow["status"], slow["error"], slow["num_cached_tokens"], slow["output_tokens"]) == ("ok", None, 0, 4)
        steps = -(-slow["prompt_tokens"] // PREFILL_CHUNK)
        # The prefill alone took at least its steps' pauses (a bound no load can undercut), past the stall timeout.
        assert slow["ttft_ms"] >= steps * STEP_PAUSE_MS > 2 * PREFILL_STALL_S * 1000, (steps, slow["ttft_ms"])
        assert (health(server.url)["ok"], health(server.url)["restarts"]) == (True, 0)

        core = engine_core(server)
        core.suspend()  # SIGSTOP: alive and silent; the next question's prefill gets no step at all
        job = Client(server.url, verbose=False).submit("笔记本电脑能保修几年？", [], "电子产品", None, None,
                                                       api_name="/chat")
        final = job.result(timeout=120)
        assert (final["status"], final["error"]) == ("error", BROKE_OFF)
        wait_restarted(server, 1)
    finally:
        if core is not None and core.is_running():
            core.kill()
        assert server.stop() == 0
    db = sqlite_utils.Database(tmp_path / "prefixdesk.db")
    answers = list(db["messages"].rows_where("role = 'assistant'", order_by="id"))
    assert [a["status"] for a in answers] == ["ok", "error"]
    assert (answers[0]["output_tokens"], answers[0]["num_cached_tokens"], answers[0]["ttft_ms"]) == (
        4, 0, slow["ttft_ms"])


def test_sigterm_stores_answers_in_progress_as_stopped_and_exits_cleanly(faulty):
    """Last in this module: it ends the module's server (an engine start fewer than a server of its own)."""
    server, db = faulty
    clients = [Client(server.url, verbose=False) for _ in range(3)]  # each one a session of its own
    questions = [f"问题{i}：请详细介绍会员等级 {tag()}" for i in range(3)]
    jobs = [c.submit(q, [], "电商客服", None, None, api_name="/chat") for q, c in zip(questions, clients)]
    wait_until(lambda: all(job.outputs() for job in jobs), 90, "all three answers' first text")
    server.proc.send_signal(signal.SIGTERM)  # all three mid-answer: each streams for 15 s or more
    assert server.proc.wait(60) == 0
    asked = list(db["messages"].rows_where("role = 'user' AND text IN (?, ?, ?)", questions))
    assert sorted(u["text"] for u in asked) == sorted(questions)  # each question kept
    stopped = list(db["messages"].rows_where("role = 'assistant' AND conversation_id IN (?, ?, ?)",
                                             [u["conversation_id"] for u in asked], order_by="id"))
    assert [a["status"] for a in stopped] == ["stopped"] * 3
    assert [a["error"] for a in stopped] == ["stopped before the answer was complete"] * 3
    assert all(0 < a["output_tokens"] < 750 and a["text"] for a in stopped)  # partial answers, with stats
    assert db["messages"].count_where("status = 'generating'") == 0  # no answer is left half-written
