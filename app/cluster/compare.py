"""``python -m app.cluster.compare``: which vllm-router policy keeps each template family on one replica.

Starts the replicas once (as ``python -m app.cluster --no-app`` would), then for each policy a
fresh router and empty caches, and sends the same workload through the remote engine: every
request carries its family's routing key, as the desk sends it. Per policy it prints requests per
replica, how many families were split over several replicas, the prefix-cache hit rate (cached /
prompt tokens, as vLLM counts them) and TTFT p50. Results of this machine are in docs/cluster.md.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import random
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

QUESTIONS = ("我刚买的手机屏幕碎了能退吗？", "价格保护怎么申请？", "发票怎么开？", "多久能发货？", "会员有什么权益？",
             "Where is my order?", "Can I change my address?", "怎么联系人工客服？")


@dataclass(frozen=True)
class PolicyResult:
    policy: str
    requests_per_replica: dict[str, int]
    families: int
    families_split: int  # families whose requests reached more than one replica
    hit_rate: float  # cached prompt tokens / prompt tokens
    ttft_p50_ms: float
    errors: int


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m app.cluster.compare", description=__doc__.split("\n\n")[0])
    p.add_argument("--policies", default="consistent_hash,cache_aware,round_robin")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--families", type=int, default=8, help="template families (the seeds, then variants of them)")
    p.add_argument("--requests-per-family", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--family-shards", type=int, default=1,
                   help="routing keys per family (family:k, k from the request), as PREFIXDESK_FAMILY_SHARDS")
    p.add_argument("--no-routing-key", dest="routing_key", action="store_false",
                   help="send no routing key (shows what a policy does from the prompt alone)")
    p.add_argument("--base-port", type=int, default=8400, help="ports base .. base+2N+2")
    p.add_argument("--out", type=Path, default=Path("bench-out/policies.json"))
    a = p.parse_args(argv)
    from app.cluster.processes import Cluster, check_ports
    from app.cluster.spec import ClusterError, ClusterOptions, count_gpus, plan_cluster, usable_cpus
    from app.engine import resolve_model_path
    from app.settings import load_settings

    settings = load_settings()
    model = resolve_model_path(settings)
    policies = a.policies.split(",")
    n = a.replicas

    def plan_for(policy: str):
        options = ClusterOptions(replicas=n, replica_port=a.base_port + 1, kv_events_port=a.base_port + 1 + n,
                                 router_port=a.base_port, router_metrics_port=a.base_port + 1 + 2 * n,
                                 policy=policy, start_app=False)
        return plan_cluster(options, settings, model, gpu_count=count_gpus(), cpus=usable_cpus())

    plan = plan_for(policies[0])
    try:
        check_ports(plan)
    except ClusterError as exc:
        print(f"app.cluster.compare: {exc}", file=sys.stderr)
        return 2
    results = []
    with Cluster(plan) as cluster:
        cluster.start(on_ready=lambda s: print(f"compare: {s.name} ready", flush=True))
        for policy in policies:
            if policy != policies[0]:
                cluster.kill(plan.router.name, 15)
                cluster.procs[plan.router.name].wait(30)
                router = plan_for(policy).router
                cluster.launch(router)
                cluster.wait_healthy(router, 120)
            result = asyncio.run(_run_policy(policy, settings.replace(engine="remote", engine_url=plan.router_url),
                                             model, a))
            results.append(result)
            print(json.dumps(asdict(result), ensure_ascii=False), flush=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps([asdict(r) for r in results], ensure_ascii=False, indent=1))
    print(_table(results))
    return 0


async def _run_policy(policy: str, settings, model, a) -> PolicyResult:
    from app.core.prompts import PromptBuilder, system_text
    from app.core.routing import routing_key
    from app.engine import EngineError, RequestStats
    from app.engine.remote import RemoteEngine
    from app.template_files import read_folder

    engine = RemoteEngine.connect(settings, model)
    prompts = PromptBuilder(model, max_model_len=settings.max_model_len, max_tokens=a.max_tokens,
                            drop_oldest_turns=True)
    files = {f.name: f for f in read_folder(settings.templates_dir)}

    def chain(name: str) -> list[str]:
        return (chain(files[name].parent) if files[name].parent else []) + [files[name].text]

    roots = [f.name for f in files.values() if not f.parent]
    # family -> the system texts of its templates (a variant changes the root's first line: a prefix of its own)
    families: dict[str, list[str]] = {}
    for i in range(a.families):
        root = roots[i % len(roots)]
        members = [n for n in files if chain(n)[0] == files[root].text]
        tag = "" if i < len(roots) else f"[{i}] "
        families[f"{tag}{root}"] = [tag + system_text(chain(m)) for m in members]
    rng = random.Random(0)
    work = [(routing_key(fam, shards=a.family_shards, shard_seed=str(i)), rng.choice(texts), rng.choice(QUESTIONS))
            for fam, texts in families.items() for i in range(a.requests_per_family)]
    rng.shuffle(work)
    try:
        if not await engine.reset_prefix_cache():
            raise SystemExit("a replica did not reset its prefix cache; are they in VLLM_SERVER_DEV_MODE?")
        gate = asyncio.Semaphore(a.concurrency)
        seen: dict[str, set[str]] = collections.defaultdict(set)
        stats: list[RequestStats] = []
        errors = 0

        async def one(key: str, system: str, question: str) -> None:
            nonlocal errors
            ids = prompts.build(system, [], question).token_ids
            async with gate:
                try:
                    async for event in engine.stream(ids, max_tokens=a.max_tokens, ignore_eos=True,
                                                     routing_key=key if a.routing_key else None):
                        if isinstance(event, RequestStats):
                            stats.append(event)
                            seen[key.rpartition(":")[0] if a.family_shards > 1 else key].add(event.replica)
                except EngineError:
                    errors += 1

        await asyncio.gather(*(one(*w) for w in work))
    finally:
        engine.shutdown()
    per_replica = collections.Counter(s.replica for s in stats)
    return PolicyResult(policy, dict(sorted(per_replica.items())), len(families),
                        sum(len(r) > 1 for r in seen.values()),
                        round(sum(s.num_cached_tokens for s in stats) / max(1, sum(s.prompt_tokens for s in stats)), 3),
                        round(statistics.median(s.ttft_ms for s in stats), 1) if stats else 0.0, errors)


def _table(results: list[PolicyResult]) -> str:
    rows = ["| policy | requests per replica | families split | hit rate | TTFT p50 ms | errors |",
            "|---|---|---|---|---|---|"]
    for r in results:
        per = " / ".join(str(v) for v in r.requests_per_replica.values())
        rows.append(f"| `{r.policy}` | {per} | {r.families_split} of {r.families} | {r.hit_rate:.1%} | "
                    f"{r.ttft_p50_ms:.0f} | {r.errors} |")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
