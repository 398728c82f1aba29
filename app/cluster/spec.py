"""The plan of a single-host cluster: which processes, on which ports, cores and GPUs.

``plan_cluster`` turns the launcher's options and the app's settings into a ``ClusterPlan`` of
exact command lines, without starting anything, so a plan can be printed, checked and tested.
Replica i serves on ``replica_port + i`` and publishes its KV-cache events on
``kv_events_port + i``; the router listens on ``router_port``; the app keeps PREFIXDESK_PORT.
Every one of them listens on ``--host`` alone: the KV events carry customers' prompts as token ids,
and neither they nor the router's admin routes (/add_worker) have any authentication of their own.
With PREFIXDESK_ENGINE_API_KEY the replicas ask for it on every route but /health.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from app.engine import resolve_tokenizer
from app.engine.flags import CPU_BLOCK_SIZE, GPU_BLOCK_SIZE, resolve_flags
from app.engine.models import attention_backend
from app.engine.precision import check_quantization
from app.engine.residency import publisher_endpoint
from app.engine.types import STEP_DELAY_PROCESSOR, EngineStartError
from app.settings import Settings

POLICIES = ("consistent_hash", "cache_aware", "round_robin", "power_of_two", "random", "kv_aware")
DEFAULT_POLICY = "consistent_hash"  # the only one that keeps a family on one replica (docs/cluster.md)
REPLICA_MIDDLEWARE = ("app.cluster.replica_header.ReplicaHeader", "app.cluster.replica_auth.ReplicaAuth")
GPU_API_SERVERS = 4  # one API process streams at most ~50 req/s (shared/device/README.md)


class ClusterError(RuntimeError):
    """The cluster cannot start as asked; the message names the option or setting to change."""


@dataclass(frozen=True)
class ClusterOptions:
    """The launcher's command-line options (``python -m app.cluster --help``)."""

    replicas: int = 2
    api_servers: int = 0  # API processes per replica; 0: 1 on CPU, 4 on GPU
    host: str = "127.0.0.1"
    replica_port: int = 8001
    kv_events_port: int = 5557
    router_port: int = 8000
    router_metrics_port: int = 29000
    policy: str = DEFAULT_POLICY
    device: str = "auto"  # auto, cpu or gpu
    cores_per_replica: int = 0  # CPU: 0 splits this process's cores evenly
    start_app: bool = True


@dataclass(frozen=True)
class ProcessSpec:
    name: str  # "replica-0", "router", "app"
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]  # set on top of the launcher's own environment
    health_url: str  # answers 200 once the process is ready
    log_path: Path


@dataclass(frozen=True)
class ReplicaSpec:
    url: str
    kv_events_endpoint: str  # where it publishes: tcp://HOST:PORT, the address it binds and subscribers connect to
    cpus: tuple[int, ...]  # cores its engine's threads are bound to (CPU), else ()
    gpus: tuple[int, ...]  # CUDA_VISIBLE_DEVICES (GPU), else ()
    process: ProcessSpec


@dataclass(frozen=True)
class PortUse:
    port: int
    what: str  # "replica-0", "router", ...
    option: str  # the option or setting that moves it


@dataclass(frozen=True)
class ClusterPlan:
    device: str  # "cpu" or "gpu"
    host: str
    replicas: tuple[ReplicaSpec, ...]
    router: ProcessSpec
    router_url: str
    app: ProcessSpec | None
    app_env: tuple[tuple[str, str], ...]  # what points the app at the cluster (also for a hand-started app)
    ports: tuple[PortUse, ...]

    @property
    def processes(self) -> tuple[ProcessSpec, ...]:
        """In start order: the replicas, the router, the app."""
        return (*(r.process for r in self.replicas), self.router, *((self.app,) if self.app else ()))


def plan_cluster(options: ClusterOptions, settings: Settings, model: Path | str, *, gpu_count: int,
                 cpus: tuple[int, ...]) -> ClusterPlan:
    """The processes for ``options``; raises ClusterError when the machine cannot hold them."""
    if options.replicas < 1:
        raise ClusterError(f"--replicas must be at least 1, not {options.replicas}")
    try:
        ipaddress.IPv4Address(options.host)
    except ValueError:
        raise ClusterError(f"--host must be an IPv4 address of this machine (e.g. 127.0.0.1 or a private 10.x "
                           f"address), not {options.host!r}: every process of the cluster listens on it") from None
    if options.policy not in POLICIES:
        raise ClusterError(f"--policy must be one of {', '.join(POLICIES)}, not {options.policy!r}")
    device = options.device if options.device != "auto" else ("gpu" if gpu_count else "cpu")
    on_cpu = device == "cpu"
    tp = settings.tensor_parallel_size
    if not on_cpu and options.replicas * tp > gpu_count:
        raise ClusterError(
            f"--replicas {options.replicas} x PREFIXDESK_TENSOR_PARALLEL_SIZE={tp} needs {options.replicas * tp} GPUs, "
            f"but `nvidia-smi -L` lists {gpu_count}; lower --replicas (or use --device cpu)")
    per = options.cores_per_replica or max(1, len(cpus) // options.replicas)
    if on_cpu and options.replicas * per > len(cpus):
        raise ClusterError(
            f"--replicas {options.replicas} x --cores-per-replica {per} needs {options.replicas * per} cores, but this "
            f"process may use {len(cpus)}; lower --replicas or --cores-per-replica")
    try:
        check_quantization(settings.quantization, model, on_cpu=on_cpu, capability=None)  # vLLM checks the GPU's
        tokenizer = resolve_tokenizer(settings, model)  # Baichuan2's converted tokenizer, as the app's own engine
    except EngineStartError as exc:
        raise ClusterError(str(exc)) from None
    api_servers = options.api_servers or (1 if on_cpu else GPU_API_SERVERS)
    logs = Path(settings.data_dir).resolve() / "cluster"
    near = _near(options.host)
    replicas = []
    for i in range(options.replicas):
        port, events = options.replica_port + i, options.kv_events_port + i
        url = f"http://{near}:{port}"
        cores = tuple(cpus[i * per:(i + 1) * per]) if on_cpu else ()
        gpus = () if on_cpu else tuple(range(i * tp, (i + 1) * tp))
        argv = _serve_argv(settings, model, on_cpu=on_cpu, host=options.host, port=port, api_servers=api_servers,
                           kv_events=publisher_endpoint(f"tcp://{options.host}:{events}"), tokenizer=tokenizer)
        env = [("VLLM_SERVER_DEV_MODE", "1"), ("VLLM_NO_USAGE_STATS", "1"), ("DO_NOT_TRACK", "1")]
        if settings.engine_api_key:  # vLLM's --api-key, from the environment: an argument would show in `ps`
            env.append(("VLLM_API_KEY", settings.engine_api_key))
        if on_cpu:
            env.append(("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, cores))))
        else:
            env.append(("CUDA_VISIBLE_DEVICES", ",".join(map(str, gpus))))
            if settings.cascade_attention:  # vLLM 0.26 has no cascade path on its V2 model runner
                env.append(("VLLM_USE_V2_MODEL_RUNNER", "0"))
        process = ProcessSpec(f"replica-{i}", argv, tuple(env), f"{url}/health", logs / f"replica-{i}.log")
        replicas.append(ReplicaSpec(url, f"tcp://{near}:{events}", cores, gpus, process))
    router_url = f"http://{near}:{options.router_port}"
    router = ProcessSpec("router", _router_argv(options, replicas, settings, on_cpu=on_cpu), (),
                         f"{router_url}/health", logs / "router.log")
    app_env = (("PREFIXDESK_ENGINE", "remote"), ("PREFIXDESK_ENGINE_URL", router_url),
               ("PREFIXDESK_REPLICA_URLS", ",".join(r.url for r in replicas)),
               ("PREFIXDESK_REPLICA_KV_EVENTS", ",".join(f"{r.url}={r.kv_events_endpoint}" for r in replicas)))
    app = None
    if options.start_app:
        app = ProcessSpec("app", (sys.executable, "-m", "app"), app_env,
                          f"http://{_near(settings.host)}:{settings.port}/healthz", logs / "app.log")
    ports = [PortUse(options.replica_port + i, f"replica-{i}", "--replica-port") for i in range(options.replicas)]
    ports += [PortUse(options.kv_events_port + i, f"replica-{i} KV events", "--kv-events-port")
              for i in range(options.replicas)]
    ports += [PortUse(options.router_port, "router", "--router-port"),
              PortUse(options.router_metrics_port, "router metrics", "--router-metrics-port")]
    if app:
        ports.append(PortUse(settings.port, "app", "PREFIXDESK_PORT"))
    return ClusterPlan(device, options.host, tuple(replicas), router, router_url, app, app_env, tuple(ports))


def served_model_name(settings: Settings) -> str:
    return settings.model or "prefixdesk-demo"


def count_gpus() -> int:
    """GPUs that ``nvidia-smi -L`` lists; 0 without nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def usable_cpus() -> tuple[int, ...]:
    return tuple(sorted(os.sched_getaffinity(0)))


def _serve_argv(settings: Settings, model: Path | str, *, on_cpu: bool, host: str, port: int, api_servers: int,
                kv_events: str, tokenizer: str) -> tuple[str, ...]:
    """``vllm serve`` with the flags the in-process engine would use, plus what the app reads remotely."""
    flags = resolve_flags(settings, on_cpu=on_cpu, served=True)
    # vllm-cpu's own CLI fails on its package name; the wrapper runs the same entry point.
    cli = "app.cluster.vllm_cpu" if on_cpu else "vllm.entrypoints.cli.main"
    events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": kv_events, "topic": "",
              "buffer_steps": 1}
    argv = [sys.executable, "-m", cli, "serve", str(model), "--served-model-name", served_model_name(settings),
            "--host", host, "--port", str(port), "--api-server-count", str(api_servers),
            "--max-model-len", str(settings.max_model_len),
            "--block-size", str(settings.block_size or (CPU_BLOCK_SIZE if on_cpu else GPU_BLOCK_SIZE)),
            "--dtype", settings.dtype, "--load-format", settings.load_format, "--seed", str(settings.seed),
            "--max-num-seqs", str(flags.max_num_seqs), "--max-num-batched-tokens", str(flags.max_num_batched_tokens),
            "--kv-cache-dtype", flags.kv_cache_dtype,
            "--enable-prefix-caching" if flags.prefix_caching else "--no-enable-prefix-caching",
            # num_cached_tokens reaches the app only as usage.prompt_tokens_details.cached_tokens:
            "--enable-prompt-tokens-details",
            "--kv-events-config", json.dumps(events),
            *(arg for middleware in REPLICA_MIDDLEWARE for arg in ("--middleware", middleware)),
            "--uvicorn-log-level", "warning"]
    if tokenizer != str(model):
        argv += ["--tokenizer", tokenizer]
    if settings.quantization:
        argv += ["--quantization", settings.quantization]
    if backend := attention_backend(model, on_cpu=on_cpu):
        argv += ["--attention-backend", backend]
    if settings.trust_remote_code:
        argv.append("--trust-remote-code")
    if flags.enforce_eager:
        argv.append("--enforce-eager")
    if flags.stream_interval != 1:
        argv += ["--stream-interval", str(flags.stream_interval)]
    if settings.engine_step_delays:
        argv += ["--logits-processors", STEP_DELAY_PROCESSOR]
    if settings.kv_cache_metrics:
        argv.append("--kv-cache-metrics")
    if on_cpu:
        argv += ["--kv-cache-memory-bytes", str(settings.kv_cache_mib << 20)]
    else:
        argv += ["--gpu-memory-utilization", str(settings.gpu_memory_utilization),
                 "--tensor-parallel-size", str(settings.tensor_parallel_size),
                 "--no-disable-cascade-attn" if flags.cascade_attention else "--disable-cascade-attn"]
        if flags.cuda_graph_max_batch:
            argv += ["--max-cudagraph-capture-size", str(flags.cuda_graph_max_batch)]
    return tuple(argv)


def _router_argv(options: ClusterOptions, replicas: list[ReplicaSpec], settings: Settings, *,
                 on_cpu: bool) -> tuple[str, ...]:
    argv = [sys.executable, "-m", "vllm_router.launch_router", "--worker-urls", *(r.url for r in replicas),
            "--policy", options.policy, "--host", options.host, "--port", str(options.router_port),
            "--prometheus-host", _near(options.host), "--prometheus-port", str(options.router_metrics_port),
            # A replica that dies leaves the hash ring at the next check (vllm-router 0.1.17 does not retry a
            # refused connection on another worker: it answers 500, which the remote engine retries).
            "--health-check-interval-secs", "1", "--health-failure-threshold", "1", "--health-success-threshold", "1",
            # At info, 0.1.17 logs two lines per routed request (consistent_hash.rs "CONSISTENT_HASH_DEBUG").
            "--log-level", "warning"]
    if options.policy == "kv_aware":
        block = settings.block_size or (CPU_BLOCK_SIZE if on_cpu else GPU_BLOCK_SIZE)
        for r in replicas:
            argv += ["--kv-event-source", f"{r.url}={r.kv_events_endpoint}"]
        argv += ["--kv-event-block-size", str(block), "--kv-event-model", served_model_name(settings)]
    return tuple(argv)


def _near(host: str) -> str:
    """An address of ``host`` that a client on this machine can reach."""
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
