"""The chat load generator: its self-check's figures add up, and it speaks to the real chat page as a browser does."""

import asyncio
import concurrent.futures
import json
import os
import subprocess
import sys
import time

from app.chat.render import _message, shown_answer
from bench import chatstub
from bench.chatpage import ChatPageTarget
from bench.loadgen import Timer
from bench.workload import BenchRequest, poisson_window
from tests.helpers.servers import ROOT

RATE, WARMUP_S, WINDOW_S, UPDATES, INTERVAL_MS = 20.0, 0.5, 2.0, 5, 20.0


def test_the_self_check_reports_figures_that_add_up(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "bench.chatload", "--self-check", "--rate", str(RATE), "--warmup-s", str(WARMUP_S),
         "--window-s", str(WINDOW_S), "--updates", str(UPDATES), "--interval-ms", str(INTERVAL_MS), "--client-procs",
         "2", "--out", str(tmp_path)], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True,
        text=True, timeout=180)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    f = json.loads((tmp_path / "chatload-self-check.json").read_text(encoding="utf-8"))
    arrivals = poisson_window(RATE, warmup_s=WARMUP_S, window_s=WINDOW_S, seed=0)
    counted = sum(t >= WARMUP_S for t in arrivals)
    # Every customer of the window answered, each answer rebuilt from its diffs equal to the stub's text (a wrong one
    # is an error), with the stub's updates: the question, UPDATES pieces of text, the caption.
    assert (f["n_sent"], f["n_ok"], f["n_errors"], f["n_unfinished"]) == (counted, counted, 0, 0)
    assert f["updates_per_answer"] == [UPDATES + 2]
    assert (f["cached_tokens"], f["prompt_tokens"]) == ([chatstub.CACHED_TOKENS], [chatstub.PROMPT_TOKENS])
    assert f["ttft_p50_ms"] >= INTERVAL_MS and f["e2e_p50_ms"] >= UPDATES * INTERVAL_MS  # the stub's own pace
    assert 0 <= f["client_lag_p50_ms"] <= f["client_lag_p99_ms"] <= f["client_lag_max_ms"]
    assert f["kept_up"] == (f["client_lag_p99_ms"] <= 10.0) == (proc.returncode == 0)
    assert f["target_met"] is False  # 20 req/s is not the target's 200
    assert f"{f['n_ok']} answered, 0 errors, 0 cut off" in proc.stdout


def run_alone(coro):
    """``asyncio.run`` on a thread of its own: the session's browser keeps an event loop running on this one."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def test_the_chat_target_speaks_to_the_real_chat_page_as_a_browser_does(server_url, db):
    question = f"请问发票怎么开？{time.time_ns()}"

    async def one():
        target = ChatPageTarget(server_url)
        await target.open()
        try:
            timer = Timer(time.perf_counter())
            return await target.send(BenchRequest(0, "电商客服", question, None), 0, timer), timer
        finally:
            await target.close()

    outcome, timer = run_alone(one())
    (user,) = db["messages"].rows_where("role = 'user' and text = ?", [question])
    (answer,) = db["messages"].rows_where("conversation_id = ? and role = 'assistant'", [user["conversation_id"]])
    # What the page showed is what was stored, as the chat shows an answer (its Markdown as HTML).
    shown = _message("assistant", shown_answer(answer["text"]).rstrip())["content"][0]["text"]
    assert (answer["status"], shown) == ("ok", outcome.text)
    # The caption says the share of the template's shared prefix reused (the same in a split's arms), not tokens.
    assert (outcome.prompt_tokens, outcome.engine_ttft_ms) == (100, round(answer["ttft_ms"]))
    assert 0 <= outcome.cached_tokens <= 100 and (outcome.cached_tokens > 0) == (answer["num_cached_tokens"] > 0)
    assert outcome.updates >= 3  # the question, the answer's text, its caption
    assert timer.sent_at <= timer.first <= timer.last
    assert 0 < outcome.load_ms  # the page load came first
