"""The benchmark: its workload, its window accounting and lag verdict, run_ab and one real run on the
session engine, and a tiny CLI run.

Benchmarks are programs that print numbers; nothing here asserts a speed. The real runs check exact
counts (which requests were counted, which were the warm-up), exact cached tokens and valid JSON.
"""

import asyncio
import concurrent.futures
import json
import math
import os
import subprocess
import sys
import time

from app.core.demo import ABResult, run_ab
from app.core.prompts import common_prefix_len, system_text
from app.template_files import read_folder
from bench.loadgen import ClientResult, Outcome, Sample, run_schedule
from bench.paths import AppTarget, RawTarget
from bench.report import (RunInfo, lag_verdict, max_rate_within, percentile, summarize, table)
from bench.runner import Bench, LocalBackend, RunTarget, Schedule, raw_token_ids
from bench.workload import (BenchRequest, build_workload, dynamic_template_count, poisson_arrivals,
                                poisson_window, questions, shop_variants, template_set, write_template_folder)

from tests.helpers.servers import ROOT
TEMPLATE = "电商客服"


# -- the workload --------------------------------------------------------------------------------


def test_questions_are_distinct_and_repeatable():
    qs = questions(200, seed=3)
    assert len(set(qs)) == 200
    assert qs == questions(200, seed=3)
    assert qs[:5] == questions(5, seed=3)


def test_no_reuse_mode_gives_every_request_its_own_salt():
    templates = template_set("ecommerce", ROOT / "templates", len)
    wl = build_workload("none", templates, 4, salt_prefix="t")
    assert [r.cache_salt for r in wl.requests] == ["t-0", "t-1", "t-2", "t-3"]
    assert wl.warm_first == ()


def test_static_mode_warms_each_template_of_the_family():
    family = template_set("family", ROOT / "templates", len)
    names = [t.name for t in family]
    assert sorted(names) == sorted(["服装鞋包", "电子产品"])
    assert all(t.chain[0] == family[0].chain[0] for t in family)  # the shared parent comes first
    assert {(t.parent, t.routing_family) for t in family} == {("商城通用规则", "商城通用规则")}
    wl = build_workload("static", family, 4)
    assert wl.warm_first == tuple(names)
    assert [r.template for r in wl.requests] == names + names
    assert {r.cache_salt for r in wl.requests} == {None}


def test_dynamic_mode_has_many_templates_and_keeps_the_pinned_ones_warm():
    templates = template_set("ecommerce", ROOT / "templates", len)
    wl = build_workload("dynamic", templates, 50, dynamic_templates=12, pinned=3)
    assert len(wl.templates) == 12
    assert wl.keep_warm == ("电商客服-001", "电商客服-002", "电商客服-003")
    assert wl.warm_first == wl.keep_warm
    names = {t.name for t in wl.templates}
    assert {r.template for r in wl.requests} <= names
    assert {t.routing_family for t in wl.templates} == names  # each variant is a family of its own
    # The variants differ near the start, so they share no block beyond the first few tokens.
    a, b = shop_variants(templates[0], 2)
    assert common_prefix_len(a.system, b.system) == a.system.index("第001号店") + 3


def test_dynamic_template_count_is_one_and_a_half_caches():
    # 15,491 fp8 blocks of 16 tokens (one H200 replica, 13B shape) and the 652-token template.
    assert dynamic_template_count(15_491 * 16, 652) == 570
    assert dynamic_template_count(100, 652) == 4  # never fewer than 4


def test_families_mode_sends_both_families_and_warms_both():
    base = template_set("ecommerce", ROOT / "templates", len)
    fams = shop_variants(base[0], 2, tag="F")
    wl = build_workload("families", base, 40, families=fams, seed=5)
    assert wl.warm_first == ("电商客服-F001", "电商客服-F002")
    counts = [sum(r.template == t.name for r in wl.requests) for t in fams]
    assert sum(counts) == 40 and min(counts) > 0
    assert wl == build_workload("families", base, 40, families=fams, seed=5)


def test_long_template_reaches_its_token_target():
    long = template_set("long", ROOT / "templates", len)[0]
    assert len(long.system) >= 2000
    assert long.system.startswith(template_set("ecommerce", ROOT / "templates", len)[0].system)


def test_poisson_arrivals_start_at_zero_and_only_go_forward():
    times = poisson_arrivals(10.0, 100, seed=1)
    assert len(times) == 100
    assert times[0] == 0.0
    assert all(b >= a for a, b in zip(times, times[1:]))
    assert times == poisson_arrivals(10.0, 100, seed=1)


def test_poisson_window_covers_warmup_and_window_and_nothing_after():
    times = poisson_window(10.0, warmup_s=1.0, window_s=2.0, seed=3)
    assert times[0] == 0.0 and max(times) < 3.0
    assert times == poisson_arrivals(10.0, len(times), seed=3)  # the same process, cut at 3 s
    assert poisson_arrivals(10.0, len(times) + 1, seed=3)[-1] >= 3.0
    longer = poisson_window(10.0, warmup_s=1.0, window_s=5.0, seed=3)
    assert longer[:len(times)] == times
    assert (len(times), sum(t < 1.0 for t in times)) == (29, 6)


def test_template_folder_holds_exactly_the_benchmark_templates(tmp_path):
    base = template_set("ecommerce", ROOT / "templates", len)
    family = template_set("family", ROOT / "templates", len)
    variants = shop_variants(base[0], 3)
    written = write_template_folder(tmp_path, [*base, *family, *variants], ROOT / "templates")
    files = {f.name: f for f in read_folder(tmp_path)}
    assert written == len(files) == 1 + 1 + 2 + 3  # the family's parent comes along
    assert files["商城通用规则"].internal
    chains = {}
    for f in files.values():
        chains[f.name] = (chains[f.parent] if f.parent else ()) + (f.text,)
    for t in [*base, *family, *variants]:
        assert system_text(chains[t.name]) == t.system


# -- the window's accounting and the lag verdict --------------------------------------------------


def sample(index, scheduled_s, *, counted=True, lag_ms=1.0, ttft_ms=50.0, e2e_ms=500.0, error=None, finished=True,
           prompt=100, cached=96):
    return Sample(index, TEMPLATE, scheduled_s, counted, lag_ms, ttft_ms, e2e_ms if finished else None, 8, 5.0,
                  prompt, cached, "", error, finished)


def info(**overrides):
    values = dict(path="remote", mode="static", policy="", schedule="poisson 2/s", repeat=1, offered_req_per_s=2.0,
                  warmup_s=1.0, window_s=2.0, n_warmup=2, client_procs=2)
    return RunInfo(**(values | overrides))


def test_the_window_counts_only_requests_arriving_after_the_warmup():
    warmup = [sample(0, 0.2, counted=False, ttft_ms=9000.0, lag_ms=900.0, e2e_ms=1000.0),  # ends at 1.2 s
              sample(1, 0.7, counted=False, ttft_ms=9000.0, lag_ms=900.0, e2e_ms=5000.0)]  # ends at 5.7 s
    counted = [sample(2, 1.0, ttft_ms=40.0, e2e_ms=500.0),  # ends at 1.5 s
               sample(3, 1.5, ttft_ms=60.0, e2e_ms=1000.0, lag_ms=3.0),  # 2.5 s
               sample(4, 2.9, ttft_ms=80.0, e2e_ms=200.0),  # 3.1 s: after the window
               sample(5, 2.95, error="HTTP 500: boom", e2e_ms=10.0),
               sample(6, 2.99, finished=False, error="cut off at the drain deadline", ttft_ms=None)]
    results = [ClientResult(warmup[:1] + counted[:3], [1.0, 2.0]), ClientResult(warmup[1:] + counted[3:], [4.0])]
    s = summarize(results, info(), drain_deadline_s=4.0)
    assert (s.n_sent, s.n_warmup, s.n_ok, s.n_errors, s.n_unfinished) == (5, 2, 3, 1, 1)
    assert s.drain_timed_out and s.first_error == "HTTP 500: boom"
    # Latencies of the counted answers only: the warm-up's 9 s TTFTs are nowhere.
    assert (s.ttft_p50_ms, s.ttft_p99_ms) == (60.0, percentile([40.0, 60.0, 80.0], 99))
    assert s.e2e_p50_ms == 500.0
    # Completed inside [1 s, 3 s): the warm-up answer ending at 1.2 s and two counted ones.
    assert s.req_per_s == 3 / 2.0 and s.output_tok_per_s == 3 * 8 / 2.0
    assert s.arrived_req_per_s == 5 / 2.0
    assert s.duration_s == 3.0  # window start → the drain deadline (a request was cut off)
    assert s.client_lag_max_ms == 3.0 and s.client_loop_lag_max_ms == 4.0
    assert s.hit_rate == 3 * 96 / (3 * 100)


def test_a_closed_burst_counts_from_the_first_send_to_the_last_answer():
    burst = [sample(i, 0.0, e2e_ms=1000.0 * (i + 1)) for i in range(4)]
    s = summarize([ClientResult(burst)], info(schedule="closed 4 users", offered_req_per_s=None, warmup_s=0.0,
                                               window_s=0.0, n_warmup=0))
    assert (s.n_sent, s.n_ok, s.duration_s, s.req_per_s) == (4, 4, 4.0, 1.0)
    assert s.arrived_req_per_s is None and not s.rejected


def test_a_run_whose_client_lags_more_than_a_tenth_of_ttft_is_rejected():
    assert lag_verdict(9.9, 100.0, open_loop=True) == (False, "")
    rejected, reason = lag_verdict(10.1, 100.0, open_loop=True)
    assert rejected and reason == "client lag p99 10.1 ms > 10% of TTFT p50 100.0 ms"
    assert lag_verdict(500.0, 100.0, open_loop=False) == (False, "")  # a burst's TTFT is queueing by design
    assert lag_verdict(0.0, math.nan, open_loop=True)[0]

    lagging = [sample(i, 1.0 + i / 10, lag_ms=20.0, ttft_ms=100.0) for i in range(10)]
    s = summarize([ClientResult(lagging)], info())
    assert s.rejected and s.reject_reason == "client lag p99 20.0 ms > 10% of TTFT p50 100.0 ms"
    assert "REJECTED" in table([s])


def test_a_rate_passes_only_when_every_repeat_passes():
    def run(rate, p99, repeat, *, errors=0, rejected=False):
        counted = [sample(i, 1.0 + i / 100, ttft_ms=p99, lag_ms=30.0 if rejected else 0.0) for i in range(10)]
        counted += [sample(99, 1.5, error="boom")] * errors
        return summarize([ClientResult(counted)], info(offered_req_per_s=rate, repeat=repeat,
                                                       schedule=f"poisson {rate:g}/s"))

    runs = [run(10, 100, 1), run(10, 120, 2), run(20, 700, 1), run(20, 900, 2), run(30, 100, 1)]
    assert max_rate_within(runs, 800) == 30
    assert max_rate_within(runs[:4], 800) == 10  # 20/s failed its second run
    assert max_rate_within([run(10, 100, 1, errors=1)], 800) is None
    assert max_rate_within([run(10, 100, 1, rejected=True)], 800) is None
    line = table([runs[0], runs[1]]).splitlines()[-1]  # both repeats side by side, on one line
    assert line.count(" | ") == 2 and line.count(" ok") == 2


def test_percentile_interpolates_like_numpy():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([10.0], 99) == 10.0
    assert percentile(list(range(101)), 99) == 99.0


# -- the load generator on a clock it does not control --------------------------------------------


class SleepyTarget:
    """Answers after ``answer_s``; request ``block_index`` blocks the event loop for ``block_s`` before it
    leaves (a client that falls behind), and ``hang_index`` never answers."""

    def __init__(self, answer_s=0.01, block_index=None, block_s=0.0, hang_index=None):
        self.answer_s, self.block_index, self.block_s, self.hang_index = answer_s, block_index, block_s, hang_index

    async def send(self, req, max_tokens, timer):
        if req.index == self.block_index:
            time.sleep(self.block_s)
        timer.sent()
        if req.index == self.hang_index:
            await asyncio.sleep(3600)
        await asyncio.sleep(self.answer_s)
        timer.token()
        return Outcome(1)


def reqs(n):
    return [BenchRequest(i, TEMPLATE, f"q{i}", None) for i in range(n)]


def run_alone(coro):
    """``asyncio.run`` on a thread of its own: the session's browser keeps an event loop running on this one."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def test_requests_scheduled_in_the_warmup_are_sent_but_not_counted():
    result = run_alone(run_schedule(SleepyTarget(), reqs(5), max_tokens=1, t0_wall=time.time(),
                                      arrivals_s=[0.0, 0.02, 0.04, 0.06, 0.08], warmup_s=0.04))
    assert [(s.index, s.counted) for s in result.samples] == [(0, False), (1, False), (2, True), (3, True),
                                                              (4, True)]
    assert all(s.ok and s.lag_ms >= 0 and s.ttft_ms >= 10.0 for s in result.samples)
    assert result.loop_lag_ms  # the client's event loop was watched


def test_ttft_counts_from_the_scheduled_arrival_so_a_late_client_cannot_hide_it():
    # Request 0 blocks the loop for 0.3 s: requests 1 and 2 leave that late and their TTFT says so.
    target = SleepyTarget(block_index=0, block_s=0.3)
    result = run_alone(run_schedule(target, reqs(3), max_tokens=1, t0_wall=time.time(),
                                      arrivals_s=[0.0, 0.01, 0.02]))
    late = [s for s in result.samples if s.index > 0]
    assert all(s.lag_ms >= 250 and s.ttft_ms >= s.lag_ms + 10.0 for s in late)
    assert max(result.loop_lag_ms) >= 250


def test_counted_requests_still_running_at_the_drain_deadline_are_cut_off():
    target = SleepyTarget(hang_index=2)  # an hour, unless the drain deadline cuts it off
    result = run_alone(run_schedule(target, reqs(3), max_tokens=1, t0_wall=time.time(),
                                      arrivals_s=[0.0, 0.01, 0.02], drain_deadline_s=0.3))
    cut = [s for s in result.samples if not s.finished]
    assert [(s.index, s.error, s.e2e_ms) for s in cut] == [(2, "cut off at the drain deadline", None)]
    assert [s.index for s in result.samples if s.ok] == [0, 1]


# -- on the real engine ---------------------------------------------------------------------------


def test_run_ab_warm_prefix_against_unique_salts(services, engine, aio):
    chain = services.catalog.get(TEMPLATE).chain
    system = system_text(chain)
    # Each question starts differently, so requests share exactly the system segment and the user header.
    qs = ["请问退货运费谁出？", "能不能开专票？", "为什么还没发货呀？", "怎么申请价格保护？"]
    result = aio(run_ab(engine, services.prompts, chain, 4, concurrency=2, max_tokens=4, questions=qs))

    assert isinstance(result, ABResult)
    block = engine.info.block_size
    warm_up = services.prompts.build(system, [], "你好").token_ids
    built = [services.prompts.build(system, [], q).token_ids for q in qs]
    assert result.prefix_tokens == len(services.prompts.prefix_ids(system))
    assert result.warm.num_cached_tokens == tuple(common_prefix_len(ids, warm_up) // block * block for ids in built)
    assert result.cold.num_cached_tokens == (0, 0, 0, 0)
    assert result.warm.prompt_tokens == result.cold.prompt_tokens == tuple(len(ids) for ids in built)
    assert (result.warm.output_tokens, result.cold.output_tokens) == (16, 16)
    assert (len(result.warm.ttft_ms), len(result.cold.ttft_ms)) == (4, 4)


def test_a_short_poisson_window_on_the_session_engine(services, engine, aio):
    """The app path (the real Desk) and the raw path, one Poisson window each on the session engine:
    exact counts, and exactly the cached tokens each prompt's full blocks allow."""
    template = template_set("ecommerce", ROOT / "templates", len)[0]
    # Seed 12: no two of these questions share a full block beyond what they share with the warm one.
    arrivals = poisson_window(4.0, warmup_s=0.5, window_s=1.5, seed=12)
    schedule = Schedule(arrivals_s=tuple(arrivals), rate_per_s=4.0, warmup_s=0.5, window_s=1.5)
    wl = build_workload("static", [template], len(arrivals), seed=12)
    n_warmup = sum(t < 0.5 for t in arrivals)
    systems = {TEMPLATE: template.system}
    bench = Bench(LocalBackend(engine, 0), max_tokens=4, client_procs=1, drain_timeout_s=60, burst_timeout_s=60)
    app = aio(bench.run(RunTarget("app", local=AppTarget(services.desk)), wl, schedule))
    tok = services.prompts.tokenizer
    raw = aio(bench.run(RunTarget("raw", local=RawTarget(engine, {}),
                                  raw_ids=lambda rs: raw_token_ids(tok, rs, systems)), wl, schedule))

    for s in (app, raw):
        assert (s.n_sent, s.n_warmup, s.n_ok, s.n_errors, s.n_unfinished) == (len(arrivals) - n_warmup, n_warmup,
                                                                              len(arrivals) - n_warmup, 0, 0)
        assert (s.schedule, s.window_s, s.client_procs) == ("poisson 4/s", 1.5, 1)
        assert s.server_loop_lag_p99_ms is not None
    # Every prompt shares the template and "你好" with the warm request and with each other; the full
    # blocks of that (the same bound either way, checked here) are exactly what each request reuses.
    block = engine.info.block_size
    prompts = [services.prompts.build(template.system, [], r.question).token_ids for r in wl.requests]
    warm = services.prompts.build(template.system, [], "你好").token_ids
    lower = {common_prefix_len(p, warm) // block * block for p in prompts}
    upper = {max(common_prefix_len(p, q) for q in prompts if q is not p) // block * block for p in prompts}
    assert lower == upper and len(lower) == 1
    counted = [p for p, t in zip(prompts, arrivals) if t >= 0.5]
    assert app.cached_tokens_mean == lower.pop()
    assert app.prompt_tokens_mean == sum(len(p) for p in counted) / len(counted)
    assert raw.prompt_tokens_mean == app.prompt_tokens_mean  # raw vLLM builds the same token ids here


def test_cli_runs_a_tiny_configuration_and_writes_json(tmp_path, settings, services):
    out = tmp_path / "bench"
    env = dict(os.environ, PYTHONPATH=str(ROOT), VLLM_NO_USAGE_STATS="1", GRADIO_ANALYTICS_ENABLED="False")
    cmd = [sys.executable, "-m", "bench", "--modes", "static,none", "--paths", "raw,app,http",
           "--concurrency", "2", "--num-requests", "2", "--output-len", "4", "--out", str(out), "--client-procs", "1",
           "--data-dir", str(settings.data_dir), "--set", "kv_cache_mib=32", "--set", "max_model_len=2048",
           "--set", "kv_events=false"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    body = json.loads((out / "bench.json").read_text(encoding="utf-8"))
    runs = body["runs"]
    assert [(r["mode"], r["path"]) for r in runs] == [
        ("static", "raw"), ("static", "app"), ("static", "http"), ("none", "raw"), ("none", "app"), ("none", "http")]
    assert [(r["n_sent"], r["n_ok"], r["n_errors"], r["n_warmup"]) for r in runs] == [(2, 2, 0, 0)] * 6
    system = system_text(services.catalog.get(TEMPLATE).chain)
    assert body["prefix_tokens"] == {TEMPLATE: len(services.prompts.prefix_ids(system))}
    assert [r["cached_tokens_mean"] for r in runs if r["mode"] == "none" and r["path"] != "raw"] == [0.0, 0.0]
    assert [r["hit_rate"] for r in runs if r["mode"] == "none"] == [0.0, 0.0, 0.0]
    assert [g["schedule"] for g in body["groups"]] == ["closed 2 users"] * 6
    assert body["config"]["output_len"] == 4 and body["skipped"] == []
    assert (out / "runs.jsonl").read_text(encoding="utf-8").count("\n") == 6


def test_skip_names_runs_by_path_rate_and_repeat():
    from bench.session import skipped_by

    skip = "remote@50,remote@70#1"
    assert [skipped_by(skip, path, rate, repeat) for path, rate, repeat in (
        ("remote", 50, 1), ("remote", 50, 2), ("remote", 70, 1), ("remote", 70, 2), ("chat", 50, 1), ("chat", 70, 1))
    ] == [True, True, True, False, False, False]
    assert skipped_by("", "chat", 70, 1) is False
