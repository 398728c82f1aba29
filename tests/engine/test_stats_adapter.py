"""The one adapter over vLLM's unstable stats, on the installed vLLM's own classes; the replicas' /metrics in the
form vLLM exports them (the series names of vLLM 0.26 and 0.32 alike); and the block split over a real mirror."""

from vllm.v1.metrics.stats import (IterationStats, KVCacheEvictionEvent, PrefillStats, PrefixCacheStats,
                                   SchedulerStats)

from app.engine.blocks import block_counts
from app.engine.monitor import CacheMonitor, stat_logger_factory, vllm_stats_features
from app.engine.replicas import parse_metrics
from app.engine.residency import ResidencyMirror
from app.engine.types import EvictionSample, PromptTokenSources, WaitingReasons


def step(*, running, waiting, skipped, queries, hits, computed_prompt, cached_prompt, preempted, evictions=()):
    scheduler = SchedulerStats(num_running_reqs=running, num_waiting_reqs=waiting, num_skipped_waiting_reqs=skipped,
                               kv_cache_usage=0.25, prefix_cache_stats=PrefixCacheStats(requests=1, queries=queries,
                                                                                        hits=hits),
                               kv_cache_eviction_events=list(evictions))
    iteration = IterationStats()
    prefill = PrefillStats()
    prefill.set(computed_prompt + cached_prompt, cached_prompt, 0)
    iteration.prompt_token_stats.update_from_output(prefill)
    iteration.num_preempted_reqs = preempted
    return scheduler, iteration


def test_the_installed_vllms_stats_feed_the_monitor(block_size=32):
    assert vllm_stats_features() == vllm_stats_features().__class__(True, True, True, True)
    monitor = CacheMonitor(evictions_enabled=True)
    logger = stat_logger_factory(monitor)(None)
    logger.record(*step(running=3, waiting=2, skipped=1, queries=400, hits=320, computed_prompt=80,
                        cached_prompt=320, preempted=1, evictions=[KVCacheEvictionEvent(10.0, 4.0, ())]))
    logger.record(*step(running=1, waiting=0, skipped=0, queries=100, hits=64, computed_prompt=36, cached_prompt=64,
                        preempted=0, evictions=[KVCacheEvictionEvent(20.0, 2.0, (1.0,))]))
    logger.record(None, None)  # a step without stats changes nothing
    snap = monitor.snapshot(num_blocks=100, block_size=block_size)
    assert (snap.running, snap.waiting, snap.queries, snap.hits, snap.kv_cache_usage) == (1, 0, 500, 384, 0.25)
    assert snap.prompt_tokens == PromptTokenSources(computed=116, local_cache_hit=384, external_kv_transfer=0,
                                                    cached=384)
    assert snap.prompt_tokens.total == 500
    assert (snap.preemptions, snap.waiting_by_reason) == (1, WaitingReasons(0, 0))
    assert snap.evictions == EvictionSample(num_blocks=2, mean_lifetime_s=15.0, mean_idle_s=3.0)
    assert snap.max_running_seen == 3
    # Waiting counts both reasons, as vllm:num_requests_waiting does.
    logger.record(*step(running=0, waiting=2, skipped=3, queries=0, hits=0, computed_prompt=0, cached_prompt=0,
                        preempted=0))
    later = monitor.snapshot(num_blocks=100, block_size=block_size)
    assert (later.waiting, later.waiting_by_reason) == (5, WaitingReasons(capacity=2, deferred=3))
    # Without --kv-cache-metrics there is nothing sampled to show: None, not zero.
    assert CacheMonitor(features=monitor.features).snapshot(num_blocks=1, block_size=1).evictions is None


METRICS = """\
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
vllm:num_requests_running{engine="0",model_name="m"} 2.0
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 2.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="deferred"} 1.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 640.0
vllm:num_preemptions_total{engine="0",model_name="m"} 4.0
vllm:num_preemptions_created{engine="0",model_name="m"} 1.7e+09
vllm:prompt_tokens_total{engine="0",model_name="m"} 1000.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 360.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_cache_hit"} 600.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="external_kv_transfer"} 40.0
vllm:prompt_tokens_cached_total{engine="0",model_name="m"} 640.0
vllm:kv_block_lifetime_seconds_sum{engine="0",model_name="m"} 30.0
vllm:kv_block_lifetime_seconds_count{engine="0",model_name="m"} 3.0
vllm:kv_block_idle_before_evict_seconds_sum{engine="0",model_name="m"} 6.0
vllm:kv_block_idle_before_evict_seconds_count{engine="0",model_name="m"} 3.0
vllm:cache_config_info{block_size="32",engine="0",num_gpu_blocks="4096"} 1.0
"""


def test_a_replicas_metrics_give_the_same_numbers_and_none_where_absent():
    m = parse_metrics(METRICS)
    assert (m.running, m.waiting, m.queries, m.hits, m.block_size, m.num_blocks) == (2, 3, 1000, 640, 32, 4096)
    assert m.prompt_tokens == PromptTokenSources(computed=360, local_cache_hit=600, external_kv_transfer=40,
                                                 cached=640)
    assert (m.preemptions, m.waiting_by_reason) == (4, WaitingReasons(capacity=2, deferred=1))
    assert m.evictions == EvictionSample(num_blocks=3, mean_lifetime_s=10.0, mean_idle_s=2.0)
    old = parse_metrics("\n".join(line for line in METRICS.splitlines()
                                  if "by_source" not in line and "kv_block" not in line and "preemptions" not in line
                                  and "by_reason" not in line))
    assert (old.prompt_tokens, old.preemptions, old.waiting_by_reason, old.evictions) == (None, None, None, None)


def test_blocks_held_by_running_requests_are_cached_but_not_evictable():
    mirror = ResidencyMirror("ipc://unused", 4)
    tokens = list(range(1, 13))
    mirror.apply([{"type": "BlockStored", "block_hashes": [b"a", b"b", b"c"], "parent_block_hash": None,
                   "token_ids": tokens, "block_size": 4, "extra_keys": None},
                  {"type": "BlockStored", "block_hashes": [b"x"], "parent_block_hash": None,
                   "token_ids": [9, 9, 9, 9], "block_size": 4, "extra_keys": None}], seq=0)
    # 11 blocks (10 usable), 3 held: a request running over the first two cached blocks plus a partial one.
    counts = block_counts(num_blocks=11, kv_cache_usage=0.3, residency=mirror, running=[(tokens[:8] + [77], None)])
    assert (counts.usable, counts.held, counts.held_cached, counts.evictable, counts.empty) == (10, 3, 2, 2, 5)
    assert (counts.cached, counts.free) == (4, 7)
    assert counts.held + counts.evictable + counts.empty == counts.usable
    idle = block_counts(num_blocks=11, kv_cache_usage=0.0, residency=mirror, running=[])
    assert (idle.held, idle.evictable, idle.empty, idle.free) == (0, 4, 6, 10)
