"""The benchmark: its workload, its statistics, run_ab on the real engine, and a tiny CLI run.

Benchmarks are programs that print numbers; nothing here times anything. The CLI test checks
that a tiny configuration runs end to end and writes valid JSON with the exact request counts.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

from app.bench import ABResult, run_ab
from app.bench.report import max_rate_within, percentile
from app.bench.workload import build_workload, poisson_arrivals, questions, shop_variants, template_set
from app.prompts import common_prefix_len, system_text

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = "电商客服"


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
    # The variants differ near the start, so they share no block beyond the first few tokens.
    a, b = shop_variants(templates[0], 2)
    assert common_prefix_len(a.system, b.system) == a.system.index("第001号店") + 3


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


def test_percentile_interpolates_like_numpy():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([10.0], 99) == 10.0
    assert percentile(list(range(101)), 99) == 99.0


def test_sweep_picks_the_highest_rate_within_the_slo():
    from app.bench.report import RunSummary

    def run(rate, p99, errors=0):
        return RunSummary("http", "static", f"poisson {rate}/s", rate, 10, errors, 1.0, 1.0, 1.0, 1.0, p99, 1.0, 1.0,
                          1.0, 1.0, 1.0, None, 0.9, 1, 1.0, 1, 0, 1.0, None, None)

    assert max_rate_within([run(10, 100), run(20, 700), run(30, 900)], 800) == 20
    assert max_rate_within([run(10, 100), run(20, 700, errors=1)], 800) == 10
    assert max_rate_within([run(30, 900)], 800) is None


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


def test_cli_runs_a_tiny_configuration_and_writes_json(tmp_path, settings, services):
    out = tmp_path / "bench"
    env = dict(os.environ, PYTHONPATH=str(ROOT), VLLM_NO_USAGE_STATS="1", GRADIO_ANALYTICS_ENABLED="False")
    cmd = [sys.executable, "-m", "app.bench", "--modes", "static,none", "--paths", "raw,app,http",
           "--concurrency", "2", "--num-requests", "2", "--output-len", "4", "--out", str(out),
           "--data-dir", str(settings.data_dir), "--set", "kv_cache_mib=32", "--set", "max_model_len=2048",
           "--set", "kv_events=false"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    body = json.loads((out / "bench.json").read_text(encoding="utf-8"))
    runs = body["runs"]
    assert [(r["mode"], r["path"]) for r in runs] == [
        ("static", "raw"), ("static", "app"), ("static", "http"), ("none", "raw"), ("none", "app"), ("none", "http")]
    assert [(r["n_requests"], r["n_errors"]) for r in runs] == [(2, 0)] * 6
    system = system_text(services.catalog.get(TEMPLATE).chain)
    assert body["prefix_tokens"] == {TEMPLATE: len(services.prompts.prefix_ids(system))}
    assert body["raw_prompts_identical"] == 2
    assert [r["cached_tokens_mean"] for r in runs if r["mode"] == "none" and r["path"] != "raw"] == [0.0, 0.0]
    assert [r["hit_rate"] for r in runs if r["mode"] == "none"] == [0.0, 0.0, 0.0]
    assert body["config"]["output_len"] == 4
    assert (out / "runs.jsonl").read_text(encoding="utf-8").count("\n") == 6
