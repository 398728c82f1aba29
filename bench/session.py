"""One ``python -m bench`` invocation: start what the paths need, run every configuration, report.

What starts, in order: the cluster (``--cluster N``: replicas and router, in a thread), the demo model
or shape and the tokenizer, the in-process engine (for raw, app, http, chat, gradio), the templates
(written as files, so every app serves exactly the benchmark's templates), the in-process app
(``http``, ``chat``, ``gradio``), and ``python -m app`` over the cluster (``remote``) — or, with
``--app-engine local``, only ``python -m app`` with its own engine, for its ``remote`` and ``chat``. Then, per router policy, per mode:
every Poisson rate ``--repeats`` times (the repeats interleaved), then each closed burst, on every
path. Everything started is stopped at the end, also on SIGTERM, and a run that could not finish
before ``--deadline`` is skipped (and listed), so a time-limited machine still returns its numbers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import signal
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from bench import report
from bench.paths import AppTarget, RawTarget, completion_options
from bench.runner import (AppBackend, Bench, LocalBackend, RemoteBackend, RunTarget, Schedule, raw_token_ids,
                          token_suffixes)
from bench.workload import (BenchRequest, build_workload, dynamic_template_count, poisson_window, shop_variants,
                                template_set, write_template_folder)

FAMILY_CANDIDATES = 8
ENGINE_WARMUP_REQUESTS = 8
BENCH_CONCURRENCY_LIMIT = 100_000  # the desk's "busy" limit (and the chat queue's), out of the way of a benchmark
APP_SAMPLE_INTERVAL_S = 1.0  # the started app's cache samples: its running / waiting peaks, read from its database


def build_settings(args):
    """Settings from the environment, the benchmark's own needs, then ``--set`` (which wins)."""
    from app.settings import SETTINGS, SettingsError, load_settings

    by_name = {s.name: s for s in SETTINGS}
    overrides: dict = {"max_concurrent_requests": BENCH_CONCURRENCY_LIMIT, "queue_max_size": BENCH_CONCURRENCY_LIMIT,
                       "data_dir": str(args.data_dir), "rate_limit_per_minute": 0, "max_streams_per_client": 0,
                       "rate_limit_per_address_per_minute": 0, "max_streams_per_address": 0,
                       "max_connections_per_client": 0, "session_claims_per_minute": 0}
    for item in args.set:
        name, eq, value = item.partition("=")
        if not eq or name not in by_name:
            raise SettingsError(f"--set {item!r}: expected NAME=VALUE with NAME one of {', '.join(by_name)}")
        overrides[name] = by_name[name].parse(value)
    settings = load_settings(**overrides)
    if settings.max_tokens < args.output_len:
        settings = settings.replace(max_tokens=args.output_len)
    return settings


async def run_session(args) -> int:
    """Run the whole benchmark; returns the exit code (1 when a server died or nothing could run)."""
    session = Session(args)
    main = asyncio.current_task()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, main.cancel)
    try:
        return await session.run()
    except asyncio.CancelledError:
        print("bench: stopped by a signal; stopping what it started", file=sys.stderr, flush=True)
        session.report()
        return 130
    finally:
        await session.close()



def skipped_by(skip: str, path: str, rate: float, repeat: int) -> bool:
    """Whether ``--skip`` (PATH@RATE[#REPEAT],...) names this Poisson run."""
    for item in filter(None, (x.strip() for x in skip.split(","))):
        named, _, rest = item.partition("@")
        rate_text, _, repeat_text = rest.partition("#")
        if named == path and float(rate_text) == rate and (not repeat_text or int(repeat_text) == repeat):
            return True
    return False

class Session:
    def __init__(self, args):
        self.args = args
        self.started = time.time()
        self.cluster = None
        self.cluster_ready: asyncio.Task | None = None
        self.app_process = None
        self.engine = None
        self.server = None
        self.services = None
        self.summaries: list[report.RunSummary] = []
        self.chosen_families: list = []
        self.skipped: list[str] = []
        self.extra: dict = {}
        self.progress = args.out / "runs.jsonl"
        self.profiled = False  # --profile records one run

    # -- start-up ----------------------------------------------------------------------------

    async def run(self) -> int:
        """Start, measure and report; a server that dies or does not start ends the measuring, and what
        was measured until then is still reported."""
        from app.engine import EngineStartError
        from bench.clients import ClientProcessError
        from bench.cluster import BenchClusterError
        from bench.servers import AppStartError
        from bench.workload import WorkloadError

        try:
            await self._start_and_measure()
        except (BenchClusterError, AppStartError, ClientProcessError, EngineStartError, WorkloadError) as exc:
            print(f"bench: FAILED: {exc}", file=sys.stderr, flush=True)
            self.report()
            return 1
        return self.report()

    async def _start_and_measure(self) -> None:
        from app.core.prompts import PromptBuilder
        from app.engine import resolve_model_path, resolve_tokenizer
        from bench.shapes import kv_bytes_per_token, resolve_shape

        args = self.args
        args.out.mkdir(parents=True, exist_ok=True)
        self.progress.unlink(missing_ok=True)
        settings = build_settings(args)
        demo_dir = resolve_model_path(settings.replace(model="")) if args.shape == "cpu-prefill" else None
        shape = resolve_shape(args.shape, data_dir=settings.data_dir, demo_model_dir=demo_dir,
                              tokenizer_dir=args.tokenizer_from, templates_dir=settings.templates_dir)
        if shape.model_dir is not None:
            settings = settings.replace(model=str(shape.model_dir), load_format=shape.load_format)
        model_dir = Path(resolve_model_path(settings))
        if settings.uses_demo_model:  # every process below must load the same demo folder
            settings = settings.replace(model=str(model_dir))
        self.settings = settings
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        (settings.data_dir / "bench-pgids.txt").unlink(missing_ok=True)
        embedded = args.app_engine == "local"  # python -m app with its engine in-process: its /v1 and its chat
        local_paths = [] if embedded else [p for p in args.paths if p in ("raw", "app", "http", "gradio", "chat")]
        remote_paths = [] if embedded else [p for p in args.paths if p in ("remote", "router", "replica")]

        cluster_ready = None
        if args.cluster:
            from bench.cluster import BenchCluster

            probe_dir = settings.data_dir / "cascade-probe" if args.cascade_probe else None
            if probe_dir is not None:
                shutil.rmtree(probe_dir, ignore_errors=True)
            self.cluster = BenchCluster(settings, model_dir, replicas=args.cluster, policy=args.policy,
                                        base_port=args.base_port, api_servers=args.api_servers, device=args.device,
                                        cascade_probe_dir=probe_dir, on_launch=self._record_pgid)
            print(f"bench: starting {args.cluster} replicas and the router ({args.policy}); logs in "
                  f"{self.cluster.plan.router.log_path.parent}", flush=True)
            cluster_ready = asyncio.create_task(asyncio.to_thread(self.cluster.start, self._time_left(600)))
            self.cluster_ready = cluster_ready

        # The prompts are the app's: a Baichuan2 folder's tokenizer is converted as the app converts it.
        tokenizer = resolve_tokenizer(settings, model_dir)
        prompts = PromptBuilder(tokenizer, max_model_len=settings.max_model_len,
                                max_tokens=settings.max_tokens, drop_oldest_turns=False,
                                trust_remote_code=settings.trust_remote_code)
        self.prompts = prompts
        base = template_set(args.templates, settings.templates_dir, prompts.count)
        prefix_tokens = {t.name: len(prompts.prefix_ids(t.system)) for t in base}
        print(f"bench: templates {prefix_tokens} (system segment tokens)", flush=True)
        self.extra.update(prefix_tokens=prefix_tokens, shape=shape.name, model=str(model_dir))

        local_bench = None
        if local_paths:
            from app.engine import build_engine

            started = time.time()
            self.engine = build_engine(settings)
            info = self.engine.info
            print(f"bench: engine up in {time.time() - started:.0f} s: {info.device}, {info.num_blocks} blocks "
                  f"of {info.block_size}, flags {self.engine.flags}", flush=True)
            if info.device == "cpu" and info.num_blocks:
                block_bytes = info.kv_cache_bytes // info.num_blocks
            else:
                block_bytes = kv_bytes_per_token(model_dir, self.engine.flags.kv_cache_dtype) * info.block_size
            local_bench = self._bench(LocalBackend(self.engine, block_bytes))
            self.extra["engine"] = {**asdict(info), "flags": asdict(self.engine.flags)}
            capacity_tokens = info.num_blocks * info.block_size

        # The app started for the remote path can wait for the cluster; unless the dynamic mode needs
        # a replica's capacity first, it starts now, beside the replicas.
        needs_capacity = "dynamic" in args.modes and not args.dynamic_templates and not local_paths
        remote_info = None
        if remote_paths:
            if needs_capacity or not ("remote" in remote_paths and not args.app_url):
                await self._cluster_up(cluster_ready)
                remote_info = self._remote_info()
                capacity_tokens = remote_info["capacity_tokens"]
        dynamic_n = 0
        if "dynamic" in args.modes:
            dynamic_n = args.dynamic_templates or dynamic_template_count(capacity_tokens, min(prefix_tokens.values()))
            print(f"bench: dynamic mode: {dynamic_n} templates", flush=True)
        self.extra["dynamic_templates"] = dynamic_n
        dynamic = shop_variants(base[0], dynamic_n) if dynamic_n else []
        candidates = shop_variants(base[0], FAMILY_CANDIDATES, tag="F") if "families" in args.modes else []
        templates = [*base, *dynamic, *candidates]
        folder = settings.data_dir / "bench-templates"
        write_template_folder(folder, templates, settings.templates_dir)
        self.systems = {t.name: t.system for t in templates}
        self.base, self.dynamic_n, self.candidates = base, dynamic_n, candidates

        if embedded:
            await self._measure(await self._start_embedded(folder))
            return
        if "remote" in remote_paths and not args.app_url:
            self.app_process = self._start_app(folder)
        if local_paths:
            await self._start_local(folder, local_paths)
        if remote_paths:
            await self._cluster_up(cluster_ready)
            remote_info = remote_info or self._remote_info()
            self.extra["cluster"] = {k: v for k, v in remote_info.items()}
            if self.app_process is not None:
                await self.app_process.wait_ready(self._time_left(600))

        targets: list[tuple[RunTarget, Bench]] = []
        for path in args.paths:
            if path in local_paths:
                targets.append((self._local_target(path), local_bench))
        if remote_paths:
            remote_bench = self._bench(RemoteBackend(remote_info["replica_urls"], remote_info["replica_names"],
                                                     cascade_dir=self.cluster.cascade_probe_dir if self.cluster
                                                     else None), alive=self._check_alive)
            for path in remote_paths:
                targets.append((self._remote_target(path, remote_info), remote_bench))
        await self._measure(targets)

    def _bench(self, backend, alive=None, reset_cache: bool = True) -> Bench:
        a = self.args
        shards = self.settings.family_shards
        return Bench(backend, max_tokens=a.output_len, client_procs=a.client_procs, drain_timeout_s=a.drain_timeout_s,
                     burst_timeout_s=a.burst_timeout_s, keep_warm_interval_s=a.keep_warm_s, alive=alive,
                     warm_copies=1 if shards == 1 else 4 * shards, reset_cache=reset_cache)

    async def _cluster_up(self, task) -> None:
        if task is not None:
            await task

    def _remote_info(self) -> dict:
        """The replicas, router and served model the remote paths use, and one replica's KV capacity."""
        import httpx

        from app.engine.replicas import replica_urls
        from bench.cluster import scrape

        a = self.args
        router = a.router_url or (self.cluster.router_url if self.cluster else None)
        if self.cluster:
            replicas, names = self.cluster.replica_urls, [f"replica-{i}" for i in range(a.cluster)]
        elif a.replica_urls:
            replicas, names = [u.strip().rstrip("/") for u in a.replica_urls.split(",") if u.strip()], []
        elif router:
            replicas, names = replica_urls(router), []
        else:
            replicas, names = ([a.replica_url.rstrip("/")] if a.replica_url else []), []
        if not replicas:
            raise SystemExit("bench: the remote paths need --cluster N, --router-url or --replica-url")
        replica = (a.replica_url or replicas[0]).rstrip("/")
        metrics = scrape(replicas[0])
        served = httpx.get(f"{router or replica}/v1/models", timeout=10).json()["data"][0]["id"]
        return {"router_url": router, "replica_url": replica, "replica_urls": replicas, "replica_names": names,
                "served_model": served, "block_size": metrics.block_size, "num_blocks": metrics.num_blocks,
                "capacity_tokens": metrics.num_blocks * metrics.block_size,
                "policy": self.cluster.policy if self.cluster else ""}

    def _start_app(self, folder: Path):
        """``python -m app`` over the cluster, with the benchmark's settings and templates."""
        from bench.servers import AppProcess, free_port, settings_env

        a, s = self.args, self.settings
        if self.cluster:
            engine_url = a.engine_url or (self.cluster.replica_urls[0] if a.app_engine == "replica"
                                          else self.cluster.router_url)
            # As app.cluster starts the app: every replica's /metrics and KV events (or the one it uses).
            replicas = self.cluster.plan.replicas[:1] if a.app_engine == "replica" else self.cluster.plan.replicas
            cluster_env = {"PREFIXDESK_REPLICA_URLS": ",".join(r.url for r in replicas),
                           "PREFIXDESK_REPLICA_KV_EVENTS": ",".join(f"{r.url}={r.kv_events_endpoint}"
                                                                    for r in replicas)}
        else:
            engine_url = a.engine_url or a.router_url or a.replica_url
            cluster_env = {"PREFIXDESK_REPLICA_URLS": a.replica_urls}
        if not engine_url:
            raise SystemExit("bench: the remote path needs --app-url, --cluster N or --engine-url")
        data = s.data_dir / "bench-remote-app"
        shutil.rmtree(data, ignore_errors=True)
        env = settings_env(s, engine="remote", engine_url=engine_url, web_processes=a.web_processes,
                           host="127.0.0.1", port=free_port(), data_dir=str(data), database_url="",
                           templates_dir=str(folder), warm_on_start=False, keep_warm_interval_s=0.0,
                           engine_connect_timeout_s=900.0, max_tokens=a.output_len, kv_events=False)
        env.update(cluster_env)
        app = AppProcess(env, log_path=s.data_dir / "bench-app.log", web_processes=a.web_processes,
                         api_only=a.app_entry == "api")
        app.log_path.unlink(missing_ok=True)
        app.start()
        self._record_pgid(app.proc.pid)
        return app

    async def _start_embedded(self, folder: Path) -> list[tuple[RunTarget, Bench]]:
        """``python -m app`` as an operator starts it by default (its own engine in-process, the chat, the console,
        /v1), seeded with the benchmark's templates, warmed before ready; answers run to --output-len tokens
        (PREFIXDESK_IGNORE_EOS). The remote path measures its /v1 and the chat path its chat page."""
        from bench.servers import AppProcess, free_port, settings_env

        a, s = self.args, self.settings
        if a.app_url:  # one already serving, e.g. to profile it by hand: no cache samples to read
            bench = self._bench(AppBackend(a.app_url, None), reset_cache=False)
            return [(RunTarget(path, client={"kind": path, "base_url": a.app_url.rstrip("/") + "/"}), bench)
                    for path in a.paths]
        data = s.data_dir / "bench-embedded-app"
        shutil.rmtree(data, ignore_errors=True)
        # The app's own limit of answers at once (twice max_num_seqs): Gradio's queue keeps a job slot for each, and
        # with the benchmark's 100,000 its housekeeping walks them all, which no deployment does.
        env = settings_env(s, engine="local", web_processes=a.app_web_processes, host="127.0.0.1", port=free_port(),
                           data_dir=str(data),
                           database_url="", templates_dir=str(folder), max_tokens=a.output_len, ignore_eos=True,
                           warm_on_start=True, keep_warm_interval_s=0.0, sample_interval_s=APP_SAMPLE_INTERVAL_S,
                           max_concurrent_requests=0)
        app = AppProcess(env, log_path=s.data_dir / "bench-app.log", web_processes=1, api_only=False)
        app.log_path.unlink(missing_ok=True)
        app.start()
        self._record_pgid(app.proc.pid)
        self.app_process = app
        self.extra["app_pid"] = app.proc.pid
        await app.wait_ready(self._time_left(900))
        bench = self._bench(AppBackend(app.url, data / "prefixdesk.db"), alive=self._check_alive, reset_cache=False)
        return [(RunTarget(path, client={"kind": path, "base_url": app.url + "/"}), bench) for path in a.paths]

    async def _start_local(self, folder: Path, local_paths: list[str]) -> None:
        """The real Desk (and, for http and gradio, the real app served on this loop) on the engine."""
        if not {"app", "http", "gradio", "chat"} & set(local_paths):
            return
        from concurrent.futures import ThreadPoolExecutor

        from app.server import build_services

        data = self.settings.data_dir / "bench-app"
        shutil.rmtree(data, ignore_errors=True)
        # ignore_eos: the chat sends no per-request budget, so the server's setting makes its answers --output-len.
        s = self.settings.replace(templates_dir=folder, data_dir=data, database_url=f"sqlite:///{data}/prefixdesk.db",
                                  warm_on_start=False, keep_warm_interval_s=0.0, max_tokens=self.args.output_len,
                                  ignore_eos=True)
        with ThreadPoolExecutor(1) as pool:  # AsyncLLM must not bind to a loop of build_services' thread
            self.services = await asyncio.get_running_loop().run_in_executor(
                pool, lambda: build_services(s, engine=self.engine))
        if {"http", "gradio", "chat"} & set(local_paths):
            from app.server import create_app
            from bench.servers import InProcessServer, free_port

            self.server = InProcessServer()
            self.http_url = await self.server.serve(create_app(self.services), free_port())
            ready = self.services.ready
            while ready is None or not ready.is_set():
                await asyncio.sleep(0.05)
                ready = self.services.ready

    def _local_target(self, path: str) -> RunTarget:
        if path == "raw":
            tok = self.prompts.tokenizer
            return RunTarget("raw", local=RawTarget(self.engine, {}),
                             raw_ids=lambda reqs: raw_token_ids(tok, reqs, self.systems))
        if path == "app":
            return RunTarget("app", local=AppTarget(self.services.desk))
        if path == "http":
            return RunTarget("http", client={"kind": "http", "base_url": self.http_url})
        if path == "chat":
            return RunTarget("chat", client={"kind": "chat", "base_url": self.http_url + "/"})
        return RunTarget("gradio", client={"kind": "gradio", "base_url": self.http_url + "/"})

    def _remote_target(self, path: str, info: dict) -> RunTarget:
        if path == "remote":
            return RunTarget("remote", client={"kind": "remote", "base_url": self.args.app_url or self.app_process.url})
        templates = [*self.base, *shop_variants(self.base[0], self.dynamic_n), *self.candidates]
        prefixes = {t.name: list(self.prompts.prefix_ids(t.system)) for t in templates}
        options = completion_options(served_model=info["served_model"], templates=templates, prefixes=prefixes,
                                     temperature=self.settings.temperature, top_p=self.settings.top_p,
                                     family_shards=self.settings.family_shards)
        url = info["router_url"] if path == "router" else info["replica_url"]
        if path == "router" and not url:
            raise SystemExit("bench: the router path needs --cluster N or --router-url")
        return RunTarget(path, client={"kind": path, "base_url": url, **options},
                         suffixes=lambda reqs: token_suffixes(self.prompts, reqs, self.systems))

    # -- measuring ---------------------------------------------------------------------------

    async def _measure(self, targets: list[tuple[RunTarget, Bench]]) -> None:
        a = self.args
        policies = [p for p in a.policies.split(",") if p] or [self.cluster.policy if self.cluster else ""]
        families_policies = [p for p in a.families_policies.split(",") if p] or policies
        if len(policies) > 1 and not self.cluster:
            raise SystemExit("bench: --policies needs --cluster N (the benchmark restarts its own router)")
        for path_target, bench in targets:  # one-off costs (graphs, connections) nobody should measure
            await self._engine_warmup(path_target, bench)
        for policy in policies:
            if self.cluster and policy != self.cluster.policy:
                await asyncio.to_thread(self.cluster.restart_router, policy)
            for mode in a.modes:
                if mode == "families" and policy not in families_policies:
                    continue
                if mode == "families":
                    await self._families(targets)
                for repeat in range(1, a.repeats + 1):
                    for rate in a.rates:
                        for target, bench in targets:
                            schedule = self._poisson(rate, repeat)
                            await self._run(target, bench, mode, schedule, policy, repeat)
                if a.concurrency:
                    for repeat in range(1, a.burst_repeats + 1):
                        for target, bench in targets:
                            await self._run(target, bench, mode, Schedule(concurrency=a.concurrency), policy, repeat,
                                            n=a.num_requests)
        if a.low_load_requests:
            for target, bench in targets:
                await self._run(target, bench, "static", Schedule(concurrency=1), policies[-1], 1,
                                n=a.low_load_requests)
        if a.cross_check and self.engine is not None:
            await self._cross_check()

    def _poisson(self, rate: float, repeat: int) -> Schedule:
        a = self.args
        arrivals = poisson_window(rate, warmup_s=a.warmup_s, window_s=a.window_s, seed=a.seed + 1000 * repeat)
        return Schedule(arrivals_s=tuple(arrivals), rate_per_s=rate, warmup_s=a.warmup_s, window_s=a.window_s)

    async def _run(self, target: RunTarget, bench: Bench, mode: str, schedule: Schedule, policy: str, repeat: int,
                   n: int | None = None) -> None:
        a = self.args
        n = len(schedule.arrivals_s) if schedule.arrivals_s is not None else n
        if (target.path in ("gradio", "chat") or self.args.app_engine == "local") and mode != "static":
            return  # the chat has no cache_salt, and the started app's cache is its own: static mode only
        label = f"{target.path} {mode} {schedule.label} {policy} #{repeat}".replace("  ", " ")
        if schedule.rate_per_s is not None and skipped_by(a.skip, target.path, schedule.rate_per_s, repeat):
            print(f"bench: skipped {label}: --skip", flush=True)
            return
        # What a run usually takes (its window, the answers still running after it, starting clients): a
        # run that would end after --deadline is skipped, so the benchmark reports before its time is up.
        estimate = schedule.warmup_s + schedule.window_s + 8 if schedule.arrivals_s is not None else 30
        if a.deadline and time.time() + estimate > a.deadline:
            print(f"bench: skipped {label}: it would end after --deadline", flush=True)
            self.skipped.append(label)
            return
        workload = await self._workload(mode, n, repeat, target)
        print(f"bench: run {label} ({n} requests)", flush=True)
        recording = self._recording(target, schedule, repeat)
        on_start = None
        if recording is not None:  # a Poisson run: its counted window; a burst: all of it
            open_loop = schedule.arrivals_s is not None
            on_start = lambda t0: recording.begin(t0 + schedule.warmup_s if open_loop else t0,  # noqa: E731
                                                  schedule.window_s if open_loop else None)
        try:
            web_cpu_s = self._web_cpu_s()
            summary = await bench.run(target, workload, schedule, policy=policy if self._via_router(target) else "",
                                      repeat=repeat, on_start=on_start)
            if web_cpu_s is not None and (answers := summary.n_ok + summary.n_errors + summary.n_warmup):
                # The web process's own CPU (its event loop and threads; the engine core is a process of its own)
                # over the whole run, per answer the run got: what the path costs the server, whatever the rate.
                summary = dataclasses.replace(summary, web_cpu_ms_per_answer=(self._web_cpu_s() - web_cpu_s)
                                              * 1000 / answers)
        finally:
            if recording is not None and (svg := await recording.finish()):
                self.extra.setdefault("profiles", {})[label] = str(svg)
        self.summaries.append(summary)
        with self.progress.open("a", encoding="utf-8") as f:  # a run cut short by a time limit keeps these
            f.write(json.dumps(report.clean(asdict(summary)), ensure_ascii=False) + "\n")
        print(report.table([summary]).splitlines()[-1], flush=True)

    def _web_pids(self) -> list[int]:
        """The started app's web processes: its ``--worker`` children behind the proxy (PREFIXDESK_WEB_PROCESSES
        above 1; not the engine, not the proxy), else the app's own process. Empty without a started app."""
        if self.app_process is None:
            return []
        import psutil

        try:
            workers = [c.pid for c in psutil.Process(self.app_process.proc.pid).children()
                       if "--worker" in c.cmdline()]
        except psutil.Error:
            workers = []
        return workers or [self.app_process.proc.pid]

    def _web_cpu_s(self) -> float | None:
        """CPU seconds the started app's web processes have used together (None without a started app)."""
        import psutil

        pids, total = self._web_pids(), 0.0
        for pid in pids:
            try:
                t = psutil.Process(pid).cpu_times()
            except psutil.Error:
                continue
            total += t.user + t.system
        return total if pids else None

    def _recording(self, target: RunTarget, schedule: Schedule, repeat: int):
        """A py-spy recording of the server for this run, when --profile names it (its first repeat only)."""
        if not self.args.profile or repeat != 1 or self.profiled:
            return None
        from bench.pyspy import Recording, parse_profile

        path, label = parse_profile(self.args.profile)
        if target.path != path or schedule.label != label:
            return None
        self.profiled = True
        # The server: the app the benchmark started (python -m app), else this process (the in-process app).
        pid = self._web_pids()[0] if self.app_process is not None else os.getpid()  # with several: the first
        name = f"profile-{path}-{self.args.profile.partition('@')[2]}.svg"
        return Recording(pid, self.args.out / name)

    async def _workload(self, mode: str, n: int, repeat: int, target: RunTarget):
        a = self.args
        families = self.chosen_families if mode == "families" else []
        seed = a.seed + 1000 * repeat
        if a.app_engine == "local":
            # The started app's cache is never reset: a path asking the questions another path asked just before
            # would find their blocks cached. Each path gets its own draw of the same questions' distribution.
            seed += 100 * a.paths.index(target.path)
        return build_workload(mode, self.base, n, seed=seed, dynamic_templates=self.dynamic_n,
                              pinned=a.pinned, zipf_s=a.zipf, salt_prefix=f"bench-{int(self.started)}-{repeat}",
                              families=families)

    async def _families(self, targets: list[tuple[RunTarget, Bench]]) -> None:
        """Choose two of the family candidates, once; behind a consistent_hash router, two that it places on
        different replicas (found by sending one short request each), so each replica's batch is one family."""
        if self.chosen_families:
            return
        chosen = self.candidates[:2]
        placement = {}
        target = next((t for t, _ in targets if t.path == "router"), None)
        if self.cluster and self.cluster.policy == "consistent_hash" and target is not None:
            from bench.loadgen import Timer
            from bench.paths import make_client_target

            reqs = [BenchRequest(-1 - i, t.name, "你好", None) for i, t in enumerate(self.candidates)]
            client = make_client_target(**target.client, suffix_ids=target.suffixes(reqs))
            await client.open()
            try:
                for r in reqs:
                    placement[r.template] = (await client.send(r, 1, Timer(time.perf_counter()))).replica
            finally:
                await client.close()
            first = self.candidates[0]
            other = next((t for t in self.candidates if placement[t.name] != placement[first.name]), None)
            chosen = [first, other] if other else chosen
        self.chosen_families = chosen
        self.extra["families"] = {"chosen": [t.name for t in chosen], "placement": placement}
        print(f"bench: families {[t.name for t in chosen]} (placement {placement})", flush=True)

    async def _engine_warmup(self, target: RunTarget, bench: Bench) -> None:
        wl = build_workload("static", self.base, ENGINE_WARMUP_REQUESTS, seed=self.args.seed + 99)
        await bench.run(target, wl, Schedule(concurrency=ENGINE_WARMUP_REQUESTS), max_tokens=8)

    async def _cross_check(self) -> None:
        """Mode none once more, on a fresh engine with prefix caching off: it should match the salted run."""
        from app.engine import build_engine

        self.engine.shutdown()
        engine = build_engine(self.settings.replace(prefix_caching=False))
        try:
            tok = self.prompts.tokenizer
            bench = self._bench(LocalBackend(engine, 0))
            target = RunTarget("raw", local=RawTarget(engine, {}),
                               raw_ids=lambda reqs: raw_token_ids(tok, reqs, self.systems))
            n = self.args.num_requests or ENGINE_WARMUP_REQUESTS
            schedule = (Schedule(concurrency=self.args.concurrency) if self.args.concurrency
                        else self._poisson(self.args.rates[0], 1))
            n = len(schedule.arrivals_s) if schedule.arrivals_s is not None else n
            summary = await bench.run(target, await self._workload("none", n, 1, target), schedule)
            self.summaries.append(replace(summary, path="raw-nocache"))
        finally:
            engine.shutdown()
            self.engine = None

    def _via_router(self, target: RunTarget) -> bool:
        """Whether ``target``'s requests pass the router (whose policy then belongs to the run)."""
        if target.path == "router":
            return True
        return target.path == "remote" and self.cluster is not None and not self.args.engine_url \
            and self.args.app_engine == "router"

    def _check_alive(self) -> None:
        if self.cluster:
            self.cluster.check_alive()
        if self.app_process:
            self.app_process.check_alive()

    def _time_left(self, default_s: float) -> float:
        if not self.args.deadline:
            return default_s
        return max(30.0, min(default_s, self.args.deadline - time.time() - 30))

    def _record_pgid(self, pgid: int) -> None:
        """Note a process group this benchmark started, for a caller's last-resort cleanup (gpu.sh kills
        every group listed in <data_dir>/bench-pgids.txt when the benchmark itself could not)."""
        with (self.settings.data_dir / "bench-pgids.txt").open("a") as f:
            f.write(f"{pgid}\n")

    # -- reporting ---------------------------------------------------------------------------

    def report(self) -> int:
        """Write bench.json (and the chart) and print the tables; 1 when nothing was measured."""
        a = self.args
        if not hasattr(self, "settings"):
            return 1
        runs = self.summaries
        rates = {}
        for g in report.groups([s for s in runs if s.offered_req_per_s is not None]):
            key = f"{g[0].path} {g[0].mode} {g[0].policy}".strip()
            rates.setdefault(key, []).extend(g)
        within = {k: report.max_rate_within(v, a.ttft_slo_ms) for k, v in rates.items()}
        config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()}
        config.update(date=time.strftime("%Y-%m-%d %H:%M:%S"), wall_s=round(time.time() - self.started, 1))
        self.extra.update(max_rate_within_slo=within, ttft_slo_ms=a.ttft_slo_ms, skipped=self.skipped,
                          settings={k: str(v) for k, v in asdict(self.settings).items() if k != "admin_password"})
        report.write_json(a.out / "bench.json", config=config, summaries=runs, extra=self.extra)
        charted = a.chart and report.write_chart(a.out / "bench.png", runs, a.ttft_slo_ms)
        print()
        print(report.lag_table(runs))
        if replicas := report.replica_table(runs):
            print()
            print(replicas)
        if app := report.app_table(runs):
            print()
            print(app)
        closed = [s for s in runs if s.window_s == 0 and s.path in ("raw", "app", "http") and s.mode in report.ARTICLE]
        if closed:
            print()
            print(report.article_table(closed))
        for key, rate in within.items():
            print(f"highest offered rate with p99 TTFT <= {a.ttft_slo_ms:.0f} ms (every run passing), {key}: {rate}")
        if self.skipped:
            print(f"skipped (deadline): {'; '.join(self.skipped)}")
        print(f"wrote {a.out / 'bench.json'}" + (f" and {a.out / 'bench.png'}" if charted else ""))
        print()
        print(report.table(runs))
        return 0 if runs else 1

    # -- stopping ----------------------------------------------------------------------------

    async def close(self) -> None:
        if self.app_process is not None:
            await asyncio.to_thread(self.app_process.stop)
        if self.server is not None:
            await self.server.close()
        if self.services is not None:
            self.services.db.close()
        if self.cluster is not None:
            await asyncio.to_thread(self.cluster.stop)  # a start still under way then fails and stops too
            if self.cluster_ready is not None:
                await asyncio.gather(self.cluster_ready, return_exceptions=True)
                await asyncio.to_thread(self.cluster.stop)
        if self.engine is not None:
            self.engine.shutdown()
        if hasattr(self, "settings"):  # everything listed there has stopped
            (self.settings.data_dir / "bench-pgids.txt").unlink(missing_ok=True)
