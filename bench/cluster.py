"""The benchmark's cluster: vllm serve replicas and vllm-router started with app.cluster's own code,
the router restarted with another policy between runs, every replica's prefix cache reset, and each
replica's ``/metrics`` read through a run (running requests, decode tokens, prefix-cache hits).

``--cascade-probe`` also starts each replica with ``bench/probe_site`` first on its PYTHONPATH:
its ``sitecustomize`` makes the engine core count the model steps that ran cascade attention
(``probe_site/prefixdesk_cascade_probe.py``), since vLLM 0.26 says so in no metric and no log line.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from app.cluster.processes import Cluster, check_ports, tail
from app.cluster.spec import ClusterOptions, ClusterPlan, count_gpus, plan_cluster, served_model_name, usable_cpus
from app.engine.replicas import ReplicaMetrics, parse_metrics
from bench.report import ReplicaWindow

PROBE_SITE = Path(__file__).resolve().parent / "probe_site"
SCRAPE_INTERVAL_S = 0.5


class BenchClusterError(RuntimeError):
    """A process of the benchmark's cluster did not start or died; the message ends with its log."""


class BenchCluster:
    """N replicas and a router on ports ``base_port`` (router), ``base_port + 1 + i`` (replica i)."""

    def __init__(self, settings, model, *, replicas: int, policy: str, base_port: int, api_servers: int = 0,
                 device: str = "auto", cascade_probe_dir: Path | None = None, on_launch=None):
        self.settings, self.model, self.base_port, self.n = settings, model, base_port, replicas
        self.api_servers, self.device, self.cascade_probe_dir = api_servers, device, cascade_probe_dir
        self.policy = policy
        self.plan = self._plan(policy)
        check_ports(self.plan)
        self.cluster = _Cluster(self.plan, on_launch or (lambda pgid: None))
        self.served_model = served_model_name(settings)

    @property
    def router_url(self) -> str:
        return self.plan.router_url

    @property
    def replica_urls(self) -> list[str]:
        return [r.url for r in self.plan.replicas]

    @property
    def app_env(self) -> dict[str, str]:
        """PREFIXDESK_* that point an app at this cluster (as app.cluster starts it)."""
        return dict(self.plan.app_env)

    def start(self, timeout_s: float) -> None:
        """Start the replicas, then the router (blocking); raises BenchClusterError with the failing log."""
        from app.cluster.spec import ClusterError

        try:
            self.cluster.start(timeout_s=timeout_s,
                               on_ready=lambda s: print(f"bench: {s.name} ready", flush=True))
        except ClusterError as exc:
            raise BenchClusterError(str(exc)) from None

    def restart_router(self, policy: str, timeout_s: float = 120) -> None:
        """Stop the router and start it again with ``policy``; the replicas (and their caches) stay."""
        if policy == self.policy:
            return
        name = self.plan.router.name
        self.cluster.kill(name, signal.SIGTERM)
        try:
            self.cluster.procs[name].wait(30)
        except Exception:
            self.cluster.kill(name, signal.SIGKILL)
            self.cluster.procs[name].wait(10)
        self.policy = policy
        self.plan = self._plan(policy)
        self.cluster.plan = self.plan
        self.cluster.launch(self.plan.router)
        from app.cluster.spec import ClusterError

        try:
            self.cluster.wait_healthy(self.plan.router, timeout_s)
        except ClusterError as exc:
            raise BenchClusterError(str(exc)) from None
        print(f"bench: router restarted with policy {policy}", flush=True)

    def check_alive(self) -> None:
        """Raise BenchClusterError naming the process that exited, with the end of its log."""
        for name in self.cluster.exited():
            spec = next(p for p in self.plan.processes if p.name == name)
            code = self.cluster.procs[name].returncode
            raise BenchClusterError(f"{name} exited with {code}; {spec.log_path} ends:\n{tail(spec.log_path)}")

    def stop(self) -> None:
        self.cluster.stop(timeout_s=15)

    def logs(self) -> list[Path]:
        return [p.log_path for p in self.plan.processes]

    def _plan(self, policy: str) -> ClusterPlan:
        n, base = self.n, self.base_port
        options = ClusterOptions(replicas=n, api_servers=self.api_servers, replica_port=base + 1,
                                 kv_events_port=base + 1 + n, router_port=base, router_metrics_port=base + 1 + 2 * n,
                                 policy=policy, device=self.device, start_app=False)
        plan = plan_cluster(options, self.settings, self.model,
                            gpu_count=count_gpus() if self.device != "cpu" else 0, cpus=usable_cpus())
        if self.cascade_probe_dir is None:
            return plan
        path = os.pathsep.join(p for p in (str(PROBE_SITE), os.environ.get("PYTHONPATH", "")) if p)
        replicas = []
        for r in plan.replicas:
            env = (*r.process.env, ("PYTHONPATH", path), ("PREFIXDESK_CASCADE_PROBE_DIR", str(self.cascade_probe_dir)),
                   ("PREFIXDESK_CASCADE_PROBE_NAME", r.process.name))
            replicas.append(dataclasses.replace(r, process=dataclasses.replace(r.process, env=env)))
        return dataclasses.replace(plan, replicas=tuple(replicas))


class _Cluster(Cluster):
    """app.cluster's Cluster, telling ``on_launch`` each process group it starts (for a last-resort kill)."""

    def __init__(self, plan: ClusterPlan, on_launch):
        super().__init__(plan)
        self._on_launch = on_launch

    def launch(self, spec):
        proc = super().launch(spec)
        self._on_launch(proc.pid)
        return proc


async def reset_prefix_caches(urls: Sequence[str]) -> bool:
    """POST /reset_prefix_cache to every replica (VLLM_SERVER_DEV_MODE=1); True when each one did it."""
    import httpx

    async with httpx.AsyncClient(timeout=30) as client:
        async def one(url: str) -> bool:
            try:
                r = await client.post(f"{url}/reset_prefix_cache")
            except httpx.HTTPError:
                return False
            return r.status_code == 200
        done = await asyncio.gather(*(one(u) for u in urls))
    return all(done)


def scrape(url: str) -> ReplicaMetrics:
    """One replica's /metrics now (blocking); raises httpx.HTTPError when it does not answer."""
    import httpx

    response = httpx.get(f"{url}/metrics", timeout=10)
    response.raise_for_status()
    return parse_metrics(response.text)


@dataclass(frozen=True)
class Scrape:
    t_wall: float
    metrics: dict[str, ReplicaMetrics]  # url -> its metrics
    cascade: dict[str, dict]  # replica name -> summed probe counters


class ReplicaProbe:
    """Reads every replica's /metrics (and the cascade probe's files) every SCRAPE_INTERVAL_S during a run."""

    def __init__(self, urls: Sequence[str], *, names: Sequence[str] = (), cascade_dir: Path | None = None):
        self.urls = list(urls)
        self.names = dict(zip(self.urls, names))
        self.cascade_dir = cascade_dir
        self.scrapes: list[Scrape] = []
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._scrape_once()

    def window(self, start_wall: float, end_wall: float) -> list[ReplicaWindow]:
        """Each replica's numbers between the scrapes nearest to ``start_wall`` and ``end_wall``."""
        if not self.scrapes:
            return []
        before = [s for s in self.scrapes if s.t_wall <= start_wall]
        first = before[-1] if before else self.scrapes[0]
        after = [s for s in self.scrapes if s.t_wall >= end_wall]
        last = after[0] if after else self.scrapes[-1]
        inside = [s for s in self.scrapes if first.t_wall <= s.t_wall <= last.t_wall]
        dt = max(1e-9, last.t_wall - first.t_wall)
        out = []
        for url in self.urls:
            a, b = first.metrics.get(url), last.metrics.get(url)
            if a is None or b is None:
                continue
            running = [s.metrics[url].running for s in inside if url in s.metrics]
            queries = b.queries - a.queries
            name = self.names.get(url, "")
            ca, cb = first.cascade.get(name), last.cascade.get(name)
            out.append(ReplicaWindow(
                url=url, requests=b.requests - a.requests,
                running_mean=sum(running) / len(running) if running else 0.0,
                running_peak=max(running, default=0),
                waiting_peak=max((s.metrics[url].waiting for s in inside if url in s.metrics), default=0),
                kv_cache_usage_peak=max((s.metrics[url].kv_cache_usage for s in inside if url in s.metrics),
                                        default=0.0),
                decode_tok_per_s=(b.generation_tokens - a.generation_tokens) / dt,
                hit_rate=(b.hits - a.hits) / queries if queries > 0 else 0.0,
                cascade_probe=_probe_state(self.cascade_dir, cb),
                cascade_steps=(cb["steps"] - (ca or {}).get("steps", 0)) if cb and cb.get("method") else None,
                cascade_engaged_steps=(cb["engaged"] - (ca or {}).get("engaged", 0)) if cb and cb.get("method")
                else None,
                cascade_prefix_tokens_max=cb.get("prefix_max") if cb and cb.get("method") else None,
            ))
        return out

    async def _loop(self) -> None:
        while True:
            await self._scrape_once()
            await asyncio.sleep(SCRAPE_INTERVAL_S)

    async def _scrape_once(self) -> None:
        import httpx

        async with httpx.AsyncClient(timeout=5) as client:
            async def one(url: str) -> tuple[str, ReplicaMetrics | None]:
                try:
                    r = await client.get(f"{url}/metrics")
                    return url, parse_metrics(r.text) if r.status_code == 200 else None
                except httpx.HTTPError:
                    return url, None
            results = await asyncio.gather(*(one(u) for u in self.urls))
        metrics = {u: m for u, m in results if m is not None}
        self.scrapes.append(Scrape(time.time(), metrics, read_cascade_probe(self.cascade_dir)))


def _probe_state(folder: Path | None, counters: dict | None) -> str:
    if folder is None:
        return "off"
    if counters is None:
        return "no report (the engine has not loaded its model runner?)"
    return "on" if counters.get("method") else "no cascade in this vLLM"


def read_cascade_probe(folder: Path | None) -> dict[str, dict]:
    """The cascade probe's counters per replica name, summed over its engine processes ({} without a probe)."""
    if folder is None or not folder.is_dir():
        return {}
    out: dict[str, dict] = {}
    for path in folder.glob("*.json"):
        try:
            body = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being written
        total = out.setdefault(body.get("name", ""), {"steps": 0, "engaged": 0, "prefix_max": 0, "method": False})
        total["steps"] += body.get("steps", 0)
        total["engaged"] += body.get("engaged", 0)
        total["prefix_max"] = max(total["prefix_max"], body.get("prefix_max", 0))
        total["method"] = total["method"] or bool(body.get("method"))
    return out
