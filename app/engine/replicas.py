"""The replicas behind a remote engine, as the console sees them: one ``ReplicaView`` each.

Every replica is a ``vllm serve`` process. A background thread asks each one for ``/health`` and
``/metrics`` once a second and keeps the latest answer; a replica that does not answer is shown
down with the reason, and its last numbers are kept for the totals. A replica that only answers
late (a busy machine) stays up, with its numbers and its mirror, until it has answered nothing in
time for SLOW_BEFORE_DOWN_S; one that refuses the connection is down at once. vLLM's own metric names are
read (``vllm:prefix_cache_queries_total``, ``vllm:kv_cache_usage_perc``, ...), so an operator can
match every number to vLLM's docs. Each replica may also publish its KV-cache events; then it has
a ``ResidencyMirror`` of its own, and ``ClusterResidency`` answers for all of them together.
"""

from __future__ import annotations

import collections
import logging
import re
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from urllib.parse import urlsplit

from app.engine.monitor import HIT_RATE_WINDOW_S
from app.engine.residency import CacheBranch, KVEventStats, ResidencyMatch, ResidencyMirror
from app.engine.types import CacheSnapshot, EvictionSample, PromptTokenSources, ReplicaView, WaitingReasons

log = logging.getLogger(__name__)

SCRAPE_INTERVAL_S = 1.0
SCRAPE_TIMEOUT_S = 2.0
SLOW_BEFORE_DOWN_S = 10.0  # scrapes timing out for this long before an up replica is shown down
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class ReplicaMetrics:
    """One scrape of a replica's ``/metrics`` (counters are vLLM's, since the replica started)."""

    running: int  # vllm:num_requests_running
    waiting: int  # vllm:num_requests_waiting
    kv_cache_usage: float  # vllm:kv_cache_usage_perc, 0-1
    queries: int  # vllm:prefix_cache_queries_total (prompt tokens looked up)
    hits: int  # vllm:prefix_cache_hits_total
    requests: int  # vllm:time_to_first_token_seconds_count: requests that started answering (aborted too)
    generation_tokens: int  # vllm:generation_tokens_total
    block_size: int  # vllm:cache_config_info{block_size}; 0 when the replica does not say
    num_blocks: int  # vllm:cache_config_info{num_gpu_blocks}
    kv_cache_bytes: int  # vllm:cache_config_info{kv_cache_memory_bytes}; 0 when sized from GPU memory
    # None where the replica's vLLM exports no such series (older releases; evictions without --kv-cache-metrics)
    prompt_tokens: PromptTokenSources | None = None  # vllm:prompt_tokens_by_source, vllm:prompt_tokens_cached
    preemptions: int | None = None  # vllm:num_preemptions
    waiting_by_reason: WaitingReasons | None = None  # vllm:num_requests_waiting_by_reason
    evictions: EvictionSample | None = None  # vllm:kv_block_lifetime_seconds, vllm:kv_block_idle_before_evict_seconds


class Replicas:
    """The latest ``ReplicaView`` of every replica, refreshed by a scraper thread."""

    def __init__(self, urls: Sequence[str], *, kv_events: Mapping[str, str] | None = None,
                 headers: Mapping[str, str] | None = None):
        """``headers``: sent with every scrape (the replicas' API key)."""
        import httpx

        self.urls = tuple(u.rstrip("/") for u in urls)
        self._kv_events = {u.rstrip("/"): e for u, e in (kv_events or {}).items()}
        self._http = httpx.Client(timeout=SCRAPE_TIMEOUT_S, headers=dict(headers or {}))
        self._lock = threading.Lock()
        self._latest: dict[str, ReplicaMetrics] = {}
        self._reasons: dict[str, str] = {u: "not scraped yet" for u in self.urls}
        self._totals = {"queries": 0, "hits": 0}  # since this app started, across replica restarts
        self._window: collections.deque = collections.deque()
        self._max_running_seen = 0
        self._seen_up: set[str] = set()
        self._late_since: dict[str, float] = {}  # up replicas whose scrapes time out, since when
        self.recoveries = 0  # replicas that answered again after being down
        self.mirrors: dict[str, ResidencyMirror] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def scrape_all(self) -> None:
        """Ask every replica once (the thread does this every SCRAPE_INTERVAL_S)."""
        results = {url: self._scrape(url) for url in self.urls}
        now = time.monotonic()
        with self._lock:
            queries = hits = 0
            for url, result in results.items():
                if isinstance(result, _Late) and not self._reasons[url]:
                    if now - self._late_since.setdefault(url, now) < SLOW_BEFORE_DOWN_S:
                        continue  # slow, not down: its last numbers and its cache stand
                self._late_since.pop(url, None)
                if isinstance(result, str):
                    if not self._reasons[url] and url in self.mirrors:
                        self.mirrors[url].clear()  # a replica that went down lost its cache
                    self._reasons[url] = result
                    continue
                before = self._latest.get(url)
                if before and result.queries < before.queries and url in self.mirrors:
                    self.mirrors[url].clear()  # restarted between two scrapes: an empty cache
                if before is None:  # the first answer is the baseline: totals count from this app's start
                    dq = dh = 0
                elif result.queries < before.queries:  # a restarted replica counts from zero again
                    dq, dh = result.queries, result.hits
                else:
                    dq, dh = result.queries - before.queries, result.hits - before.hits
                queries, hits = queries + dq, hits + dh
                if self._reasons[url] and url in self._seen_up:
                    self.recoveries += 1
                self._seen_up.add(url)
                self._latest[url], self._reasons[url] = result, ""
            self._totals["queries"] += queries
            self._totals["hits"] += hits
            if queries:
                self._window.append((now, queries, hits))
            while self._window and self._window[0][0] < now - HIT_RATE_WINDOW_S:
                self._window.popleft()
            running = sum(m.running for u, m in self._latest.items() if not self._reasons[u])
            self._max_running_seen = max(self._max_running_seen, running)

    def start(self, block_size: int) -> None:
        """Start the scraper thread and one KV-event mirror per replica that publishes events."""
        for url, endpoint in self._kv_events.items():
            mirror = ResidencyMirror(endpoint, block_size)
            mirror.start()
            self.mirrors[url] = mirror
        self._thread = threading.Thread(target=self._run, name="replica-scraper", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=SCRAPE_TIMEOUT_S * len(self.urls) + 1)
        for mirror in self.mirrors.values():
            mirror.close()
        self._http.close()

    def views(self) -> tuple[ReplicaView, ...]:
        empty = ReplicaMetrics(0, 0, 0.0, 0, 0, 0, 0, 0, 0, 0)
        with self._lock:
            return tuple(
                ReplicaView(url, not self._reasons[url], self._reasons[url], **_counts(self._latest.get(url, empty)),
                            mirror=self.mirrors.get(url))
                for url in self.urls)

    def metrics(self, url: str) -> ReplicaMetrics | None:
        """The latest scrape of ``url`` (None before the first one answered)."""
        with self._lock:
            return self._latest.get(url)

    def snapshot(self, *, resets: int) -> CacheSnapshot:
        """All replicas together: the state of those up, the hit counters of all since this app started."""
        views = self.views()
        up = [v for v in views if v.up]
        scraped = [(u, m) for u in self.urls if (m := self.metrics(u)) is not None]
        latest = [m for _, m in scraped]
        with self._lock:
            blocks = sum(v.num_blocks for v in views)
            return CacheSnapshot(
                num_blocks=blocks,
                block_size=max((v.block_size for v in views), default=0),
                # Usage weighted by each replica's size: the share of the cluster's blocks in use.
                kv_cache_usage=sum(v.kv_cache_usage * v.num_blocks for v in up) / blocks if blocks else 0.0,
                running=sum(v.running for v in up),
                waiting=sum(v.waiting for v in up),
                queries=self._totals["queries"],
                hits=self._totals["hits"],
                recent_queries=sum(q for _, q, _ in self._window),
                recent_hits=sum(h for _, _, h in self._window),
                resets=resets,
                max_running_seen=self._max_running_seen,
                # Counters since each replica started (a restarted one counts from zero again).
                prompt_tokens=_sum_sources([m.prompt_tokens for m in latest]),
                preemptions=_sum_optional([m.preemptions for m in latest]),
                waiting_by_reason=_sum_reasons([m.waiting_by_reason for u, m in scraped if not self._reasons[u]]),
                evictions=_merge_evictions([m.evictions for m in latest]),
            )

    def reset_max_running_seen(self) -> None:
        with self._lock:
            self._max_running_seen = 0

    def url_for(self, address: str) -> str:
        """The replica URL whose host:port is ``address`` (the replica header), else ``address`` itself."""
        for url in self.urls:
            if urlsplit(url).netloc == address:
                return url
        return f"http://{address}" if address else ""

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.scrape_all()
            self._stop.wait(max(0.0, SCRAPE_INTERVAL_S - (time.monotonic() - started)))

    def _scrape(self, url: str) -> ReplicaMetrics | str:
        """The replica's metrics, or why it is down."""
        import httpx

        try:
            health = self._http.get(f"{url}/health")
            if health.status_code != 200:
                return f"/health answered {health.status_code}: its engine is not running"
            response = self._http.get(f"{url}/metrics")
            response.raise_for_status()
        except httpx.TimeoutException as exc:
            return _Late(f"not answering ({type(exc).__name__})")
        except httpx.HTTPError as exc:
            return f"not answering ({type(exc).__name__})"
        return parse_metrics(response.text)


class _Late(str):
    """Why a replica is down, where its scrape timed out: it may only be slow."""


def replica_urls(base_url: str, configured: str = "", *, headers: Mapping[str, str] | None = None) -> list[str]:
    """The replicas behind ``base_url``: ``configured`` (comma-separated URLs), else vllm-router's
    ``/list_workers``, else ``base_url`` itself (a single ``vllm serve``)."""
    import httpx

    urls = [u.strip().rstrip("/") for u in configured.split(",") if u.strip()]
    if urls:
        return urls
    try:
        response = httpx.get(f"{base_url}/list_workers", timeout=5, headers=dict(headers or {}))
        if response.status_code == 200:
            return sorted(u.rstrip("/") for u in response.json()["urls"])  # the router's order varies
    except (httpx.HTTPError, ValueError, KeyError):
        pass
    return [base_url]


def parse_metrics(text: str) -> ReplicaMetrics:
    """vLLM's Prometheus text format: the numbers a ``ReplicaView`` shows (absent counters are 0, absent
    optional series None)."""
    values: dict[str, float] = collections.defaultdict(float)
    by_label: dict[tuple[str, str], float] = collections.defaultdict(float)  # (name, source or reason) -> value
    config: dict[str, str] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        series, _, value = line.rpartition(" ")
        name, _, labels = series.partition("{")
        label_values = _labels(labels.rstrip("}"))
        if name == "vllm:cache_config_info":
            config = label_values
        try:
            number = float(value)
        except ValueError:
            continue
        values[name] += number  # summed over labels (several engines of one replica)
        if kind := label_values.get("source") or label_values.get("reason"):
            by_label[name, kind] += number
    return ReplicaMetrics(
        running=int(values["vllm:num_requests_running"]),
        waiting=int(values["vllm:num_requests_waiting"]),
        kv_cache_usage=values["vllm:kv_cache_usage_perc"],
        queries=int(values["vllm:prefix_cache_queries_total"]),
        hits=int(values["vllm:prefix_cache_hits_total"]),
        # vllm:request_success_total leaves aborted requests out; every request that got a first token counts here.
        requests=int(values["vllm:time_to_first_token_seconds_count"]),
        generation_tokens=int(values["vllm:generation_tokens_total"]),
        block_size=_int(config.get("block_size")),
        num_blocks=_int(config.get("num_gpu_blocks")),
        kv_cache_bytes=_int(config.get("kv_cache_memory_bytes")),
        prompt_tokens=PromptTokenSources(
            computed=int(by_label["vllm:prompt_tokens_by_source_total", "local_compute"]),
            local_cache_hit=int(by_label["vllm:prompt_tokens_by_source_total", "local_cache_hit"]),
            external_kv_transfer=int(by_label["vllm:prompt_tokens_by_source_total", "external_kv_transfer"]),
            cached=int(values["vllm:prompt_tokens_cached_total"]),
        ) if "vllm:prompt_tokens_by_source_total" in values else None,
        preemptions=int(values["vllm:num_preemptions_total"]) if "vllm:num_preemptions_total" in values else None,
        waiting_by_reason=WaitingReasons(
            capacity=int(by_label["vllm:num_requests_waiting_by_reason", "capacity"]),
            deferred=int(by_label["vllm:num_requests_waiting_by_reason", "deferred"]),
        ) if "vllm:num_requests_waiting_by_reason" in values else None,
        evictions=_evictions(values),
    )


class ClusterResidency:
    """Every replica's ``ResidencyMirror`` read as one: what ``Engine.residency`` is for a cluster.

    ``match`` answers with the replica that holds most of a sequence (where its routing key should
    send it); ``tree`` lists every replica's cached sequences; ``by_replica`` keeps them apart, so
    the console can show which replica holds which template.
    """

    def __init__(self, mirrors: Mapping[str, ResidencyMirror], block_size: int):
        self._mirrors = dict(mirrors)
        self.block_size = block_size
        self.endpoint = ", ".join(m.endpoint for m in self._mirrors.values())

    def by_replica(self) -> dict[str, ResidencyMirror]:
        return dict(self._mirrors)

    def match(self, token_ids: Sequence[int], *, cache_salt: str | None = None) -> ResidencyMatch:
        matches = [m.match(token_ids, cache_salt=cache_salt) for m in self._mirrors.values()]
        return max(matches, key=lambda m: m.resident_blocks)

    def where(self, token_ids: Sequence[int], *, cache_salt: str | None = None) -> dict[str, ResidencyMatch]:
        """Each replica's match for ``token_ids``."""
        return {url: m.match(token_ids, cache_salt=cache_salt) for url, m in self._mirrors.items()}

    def num_cached_blocks(self) -> int:
        return sum(m.num_cached_blocks() for m in self._mirrors.values())

    def tree(self) -> list[CacheBranch]:
        return [branch for m in self._mirrors.values() for branch in m.tree()]

    def stats(self) -> KVEventStats:
        parts = [m.stats() for m in self._mirrors.values()]
        return KVEventStats(self.endpoint, *(sum(getattr(s, f) for s in parts) for f in
                                             ("batches", "stored", "removed", "cleared", "missed_batches",
                                              "num_cached_blocks")))

    def wait_quiet(self, quiet_s: float = 0.3, timeout_s: float = 10.0) -> bool:
        return all([m.wait_quiet(quiet_s, timeout_s) for m in self._mirrors.values()])

    def clear(self) -> None:
        for mirror in self._mirrors.values():
            mirror.clear()

    def close(self) -> None:
        for mirror in self._mirrors.values():
            mirror.close()


def _counts(m: ReplicaMetrics) -> dict:
    # asdict would turn the nested numbers into dicts; they are frozen, so they are passed as they are.
    flat = {k: v for k, v in asdict(m).items() if k not in ("kv_cache_bytes", *_NESTED)}
    return flat | {k: getattr(m, k) for k in _NESTED}


_NESTED = ("prompt_tokens", "waiting_by_reason", "evictions")


def _evictions(values: dict[str, float]) -> EvictionSample | None:
    if "vllm:kv_block_lifetime_seconds_count" not in values:
        return None
    n = int(values["vllm:kv_block_lifetime_seconds_count"])
    idle_n = values.get("vllm:kv_block_idle_before_evict_seconds_count", 0.0)
    return EvictionSample(num_blocks=n, mean_lifetime_s=values["vllm:kv_block_lifetime_seconds_sum"] / n if n else 0.0,
                          mean_idle_s=values.get("vllm:kv_block_idle_before_evict_seconds_sum", 0.0) / idle_n
                          if idle_n else 0.0)


def _sum_optional(parts: list[int | None]) -> int | None:
    known = [p for p in parts if p is not None]
    return sum(known) if known else None


def _sum_sources(parts: list[PromptTokenSources | None]) -> PromptTokenSources | None:
    known = [p for p in parts if p is not None]
    if not known:
        return None
    return PromptTokenSources(*(sum(getattr(p, f) for p in known)
                                for f in ("computed", "local_cache_hit", "external_kv_transfer", "cached")))


def _sum_reasons(parts: list[WaitingReasons | None]) -> WaitingReasons | None:
    known = [p for p in parts if p is not None]
    return WaitingReasons(sum(p.capacity for p in known), sum(p.deferred for p in known)) if known else None


def _merge_evictions(parts: list[EvictionSample | None]) -> EvictionSample | None:
    known = [p for p in parts if p is not None]
    if not known:
        return None
    n = sum(p.num_blocks for p in known)
    return EvictionSample(n, sum(p.mean_lifetime_s * p.num_blocks for p in known) / n if n else 0.0,
                          sum(p.mean_idle_s * p.num_blocks for p in known) / n if n else 0.0)


def _labels(text: str) -> dict[str, str]:
    """``a="1",b="x"`` -> {"a": "1", "b": "x"}."""
    return dict(_LABEL.findall(text))


def _int(value: str | None) -> int:
    try:
        return int(float(value)) if value not in (None, "None") else 0
    except ValueError:
        return 0
