"""The remote engine: an OpenAI-compatible server, normally vllm-router in front of ``vllm serve`` replicas.

The app still assembles every prompt as token ids, so a template's prefix is byte-identical on
every replica; ``stream`` posts them to ``/v1/completions`` with the request's ``cache_salt`` and
its routing key, and reads the streamed usage for ``num_cached_tokens`` (vLLM sends it when the
server runs with ``--enable-prompt-tokens-details``). Closing the stream closes the HTTP response,
which makes vLLM abort the request. Per-replica numbers come from ``app.engine.replicas``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import quote

from app.engine.replicas import ClusterResidency, Replicas, replica_urls
from app.engine.blocks import block_counts
from app.engine.types import (STEP_DELAY_ARG, BlockCounts, CacheSnapshot, Delta, EngineBusy, EngineError, EngineInfo,
                              EngineRejected, EngineStartError, Health, ReplicaView, RequestStats)
from app.log_text import printable
from app.settings import Settings, kv_event_sources

log = logging.getLogger(__name__)

# vllm-router 0.1.17's consistent_hash policy keys on the first of x-session-id, x-user-id,
# x-tenant-id, x-correlation-id, x-request-id, x-trace-id (src/policies/hash_key.rs).
ROUTING_HEADER = "x-session-id"
# Added by app.cluster.replica_header on the replicas the launcher starts: which one answered.
REPLICA_HEADER = "x-prefixdesk-replica"
RETRY_STATUSES = (500, 502, 504)  # before the first token: the router could not reach the replica
RETRY_DELAYS_S = (0.5, 1.0, 2.0)  # longer together than the launcher's router health interval (1 s)
CONCURRENCY_PER_REPLICA = 256  # the app's cap on answers in flight, per replica, unless set


@dataclass
class _Call:
    """One request in flight; ``abort_all`` closes its response."""

    response: object | None = None
    aborted: bool = False
    token_ids: list[int] = field(default_factory=list)  # the prompt: the blocks it holds on its replica
    cache_salt: str | None = None
    replica: str = ""  # known once the response names it


class _Answer:
    """One answer's server-sent events, read as they arrive by a task of its own.

    vLLM's server sends a chunk per token; a reader that takes one chunk per screen update would show ten
    tokens a second however fast the replica is. So the chunks are read here as they come, and ``pieces``
    hands a reader that fell behind all the text that arrived since its last read in one piece (what vLLM's
    own output collector does for the in-process engine). The timing is measured as the chunks arrive.
    """

    def __init__(self, lines: AsyncIterator[str]):
        self.first: float | None = None  # perf_counter() of the first and the last token's chunk
        self.last: float | None = None
        self.chunks = 0
        self.usage: dict = {}
        self.finish_reason = "abort"
        self.finished = False  # a chunk gave the finish reason: the text so far is the whole answer
        self.done = False  # the server said [DONE]
        self._lines = lines
        self._text: list[str] = []
        self._arrived = asyncio.Event()
        self._task = asyncio.ensure_future(self._read())

    async def pieces(self) -> AsyncIterator[tuple[str, bool]]:
        """(text, last) for the text that arrived since the previous piece; ``last``: the answer's final text.
        Raises what reading raised (a transport error, EngineError for an error the server sent)."""
        while True:
            await self._arrived.wait()
            self._arrived.clear()
            if self._text:
                text, self._text = "".join(self._text), []
                yield text, self.finished
            if self._task.done():
                self._task.result()
                return

    async def close(self) -> None:
        """Stop reading (an answer closed early: the response's own close aborts it in vLLM)."""
        if not self._task.done():
            self._task.cancel()
        await asyncio.wait({self._task})
        if not self._task.cancelled():
            self._task.exception()  # retrieved here; pieces() raised it to the reader that was there
        await self._lines.aclose()

    async def _read(self) -> None:
        try:
            async for line in self._lines:
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    self.done = True
                    return
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    log.error("the model server failed mid-answer: %s", printable(chunk["error"]))
                    raise EngineError("the model failed while answering; please try again")
                self.usage = chunk.get("usage") or self.usage
                for choice in chunk.get("choices", ()):
                    now = time.perf_counter()
                    self.first, self.last, self.chunks = self.first or now, now, self.chunks + 1
                    if choice.get("finish_reason"):
                        self.finish_reason, self.finished = choice["finish_reason"], True
                    if choice.get("text"):
                        self._text.append(choice["text"])
                self._arrived.set()
        finally:
            self._arrived.set()


class RemoteEngine:
    """The Engine protocol over HTTP; see the module docstring."""

    def __init__(self, settings: Settings, *, base_url: str, served_model: str, info: EngineInfo,
                 replicas: Replicas):
        self._settings = settings
        self.base_url = base_url
        self.served_model = served_model
        self.info = info
        self._replicas = replicas
        self.residency = ClusterResidency(replicas.mirrors, info.block_size) if replicas.mirrors else None
        self.max_concurrent_requests = info.max_concurrent_requests
        self._active: dict[int, _Call] = {}
        self._ids = itertools.count()
        self._client = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._resets = 0

    @classmethod
    def connect(cls, settings: Settings, model_path: Path | str) -> RemoteEngine:
        """Wait for ``settings.engine_url`` to serve a model, find its replicas and their block size.

        Raises EngineStartError naming the setting to fix when the endpoint does not answer, serves
        a shorter context than PREFIXDESK_MAX_MODEL_LEN, or its replicas disagree on the block size.
        """
        base_url = settings.engine_url.rstrip("/")
        # httpx logs every request at INFO; the replica scraper alone would add several lines a second.
        logging.getLogger("httpx").setLevel(logging.WARNING)
        headers = auth_headers(settings)
        model = _wait_for_model(base_url, settings.engine_connect_timeout_s, headers)
        max_model_len = int(model.get("max_model_len") or settings.max_model_len)
        if max_model_len < settings.max_model_len:
            raise EngineStartError(
                f"the remote engine at PREFIXDESK_ENGINE_URL={base_url} serves a context of {max_model_len} tokens, "
                f"less than PREFIXDESK_MAX_MODEL_LEN={settings.max_model_len}; lower PREFIXDESK_MAX_MODEL_LEN to "
                f"{max_model_len} or start the replicas with --max-model-len {settings.max_model_len}")
        urls = replica_urls(base_url, settings.replica_urls, headers=headers)
        replicas = Replicas(urls, kv_events=kv_event_sources(settings.replica_kv_events), headers=headers)
        replicas.scrape_all()
        block_size = _block_size(replicas, settings)
        replicas.start(block_size)
        metrics = [m for m in (replicas.metrics(u) for u in urls) if m is not None]
        info = EngineInfo(
            model=str(model_path),
            is_demo_model=settings.uses_demo_model,
            device="remote",
            block_size=block_size,
            num_blocks=sum(m.num_blocks for m in metrics),
            kv_cache_bytes=sum(m.kv_cache_bytes for m in metrics),
            max_model_len=max_model_len,
            max_num_seqs=settings.max_num_seqs,
            max_concurrent_requests=settings.max_concurrent_requests or CONCURRENCY_PER_REPLICA * len(urls),
            backend="remote",
        )
        log.info("remote engine %s: model %s, %d replicas, block size %d", base_url, model["id"], len(urls), block_size)
        return cls(settings, base_url=base_url, served_model=model["id"], info=info, replicas=replicas)

    # -- serving -----------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        return len(self._active)

    async def stream(
        self,
        prompt_token_ids: Sequence[int],
        *,
        max_tokens: int,
        cache_salt: str | None = None,
        ignore_eos: bool = False,
        request_id: str | None = None,
        routing_key: str | None = None,
        step_delay_ms: int = 0,
        warmup: bool = False,  # vllm serve has no way to keep it out of its counters: a replica counts it
    ) -> AsyncIterator[Delta | RequestStats]:
        """Yield the answer as ``Delta``s, then one ``RequestStats``.

        Raises EngineBusy when too many answers are in flight or the servers say so (429/503),
        EngineRejected when vLLM refuses the request (400), and EngineError when a server fails or
        stops mid-answer. Closing the iterator early closes the HTTP stream, which aborts the
        request in vLLM.
        """
        import httpx

        if len(self._active) >= self.max_concurrent_requests:
            raise EngineBusy(f"the help desk is busy ({len(self._active)} answers in progress); "
                             "please retry in a moment")
        body = {"model": self.served_model, "prompt": list(prompt_token_ids), "max_tokens": max_tokens,
                "temperature": self._settings.temperature, "top_p": self._settings.top_p, "ignore_eos": ignore_eos,
                "stream": True, "stream_options": {"include_usage": True}}
        if cache_salt:
            body["cache_salt"] = cache_salt
        if request_id:
            body["request_id"] = request_id
        if step_delay_ms:  # honoured by replicas the launcher started with PREFIXDESK_ENGINE_STEP_DELAYS (tests)
            body["vllm_xargs"] = {STEP_DELAY_ARG: step_delay_ms}
        # Header values are ASCII; template families are often Chinese, so the key is percent-encoded.
        headers = {ROUTING_HEADER: quote(routing_key, safe=":")} if routing_key else {}
        call_id, call = next(self._ids), _Call(token_ids=body["prompt"], cache_salt=cache_salt)
        self._active[call_id] = call
        started = time.perf_counter()
        answer: _Answer | None = None
        replica = ""
        try:
            async with self._open(body, headers) as response:
                call.response = response
                replica = call.replica = self._replicas.url_for(response.headers.get(REPLICA_HEADER, ""))
                answer = _Answer(response.aiter_lines())
                try:
                    async for text, last in answer.pieces():
                        yield Delta(text, last=last)
                finally:
                    await answer.close()
        except (httpx.TransportError, httpx.StreamError) as exc:
            if not call.aborted:
                log.warning("the remote engine stream broke (%s: %s)", type(exc).__name__, printable(exc))
                raise EngineError(_broken_reason(exc, replica)) from exc
        finally:
            self._active.pop(call_id, None)
        if (answer is None or not answer.done) and not call.aborted:
            raise EngineError(_broken_reason(None, replica))
        usage = answer.usage if answer is not None else {}
        output_tokens = int(usage.get("completion_tokens") or (answer.chunks if answer else 0))
        first = (answer.first if answer else None) or time.perf_counter()
        last = (answer.last if answer else None) or first
        decode_s = last - first
        yield RequestStats(
            prompt_tokens=int(usage.get("prompt_tokens") or len(body["prompt"])),
            num_cached_tokens=int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0),
            output_tokens=output_tokens,
            ttft_ms=(first - started) * 1000,
            decode_tokens_per_s=(output_tokens - 1) / decode_s if output_tokens > 1 and decode_s > 0 else 0.0,
            finish_reason="abort" if call.aborted else (answer.finish_reason if answer else "abort"),
            replica=replica,
            last_token_s=(answer.last or 0.0) if answer else 0.0,
        )

    @contextlib.asynccontextmanager
    async def _open(self, body: dict, headers: dict):
        """The streaming response of ``/v1/completions``; raises the EngineError its status means.

        Until vllm-router's next health check a dead replica stays in its ring, and a request for it
        gets a 500 before any token: those are sent again after a moment (nothing was generated).
        """
        for delay_s in (*RETRY_DELAYS_S, None):
            async with self._http().stream("POST", f"{self.base_url}/v1/completions", json=body,
                                           headers=headers) as response:
                if response.status_code == 200:
                    yield response
                    return
                text = (await response.aread()).decode(errors="replace")
            if response.status_code not in RETRY_STATUSES or delay_s is None:
                raise _http_error(response.status_code, text)
            log.warning("the router answered %d (%s); retrying in %.1f s", response.status_code, printable(text, 120),
                        delay_s)
            await asyncio.sleep(delay_s)

    async def abort_all(self) -> int:
        """Close every answer's HTTP stream (each ends with finish_reason "abort"); returns how many."""
        calls = list(self._active.values())
        for call in calls:
            call.aborted = True
            if call.response is not None:
                await call.response.aclose()
        return len(calls)

    # -- watching ----------------------------------------------------------------------------

    def replicas(self) -> tuple[ReplicaView, ...]:
        """Every replica as of its latest scrape (about once a second), with its blocks split where it
        publishes KV events (the prompts running on it count as held; their answers' blocks are not known here)."""
        running: dict[str, list] = {}
        for call in list(self._active.values()):
            if call.replica:
                running.setdefault(call.replica, []).append((call.token_ids, call.cache_salt))
        return tuple(
            replace(v, blocks=block_counts(num_blocks=v.num_blocks, kv_cache_usage=v.kv_cache_usage,
                                           residency=v.mirror, running=running.get(v.url, ())))
            if v.mirror is not None and v.up and v.num_blocks else v
            for v in self._replicas.views())

    def snapshot(self) -> CacheSnapshot:
        snap = self._replicas.snapshot(resets=self._resets)
        views = [v for v in self.replicas() if v.up]
        if not views or any(v.blocks is None for v in views):
            return snap
        parts = [v.blocks for v in views]
        return replace(snap, blocks=BlockCounts(*(sum(getattr(b, f) for b in parts)
                                                  for f in ("usable", "held", "held_cached", "evictable"))))

    def reset_max_running_seen(self) -> None:
        self._replicas.reset_max_running_seen()

    @property
    def restarts(self) -> int:
        """Replicas that came back after being down (each restarted with an empty cache)."""
        return self._replicas.recoveries

    @property
    def restarting(self) -> bool:
        return False  # replicas restart on their own; the router routes around one that is down

    async def health(self) -> Health:
        """Up while the router answers and at least one replica is up (the router avoids the others)."""
        import httpx

        try:
            await self._http().get(f"{self.base_url}/health", timeout=5)
        except httpx.HTTPError as exc:
            return Health(False, f"the model server at {self.base_url} is not answering ({type(exc).__name__})")
        views = self._replicas.views()
        if not any(v.up for v in views):
            return Health(False, "no replica is up: " + "; ".join(f"{v.url}: {v.reason}" for v in views))
        return Health(True)

    async def reset_prefix_cache(self) -> bool:
        """Reset the prefix cache of every replica; True when each one did.

        vLLM serves ``POST /reset_prefix_cache`` only with VLLM_SERVER_DEV_MODE=1 (the launcher sets
        it); a replica without it answers 404 and this returns False.
        """
        import httpx

        async def reset(url: str) -> bool:
            try:
                response = await self._http().post(f"{url}/reset_prefix_cache", timeout=30)
            except httpx.HTTPError as exc:
                log.warning("prefix-cache reset of %s failed: %s", url, type(exc).__name__)
                return False
            if response.status_code == 404:
                log.warning("%s has no /reset_prefix_cache; start it with VLLM_SERVER_DEV_MODE=1", url)
                return False
            return response.status_code == 200 and bool(response.json().get("success"))

        done = all(await asyncio.gather(*(reset(u) for u in self._replicas.urls)))
        if self.residency is not None:
            self.residency.clear()  # the replicas publish AllBlocksCleared with their next step
        self._resets += 1
        return done

    def shutdown(self) -> None:
        self._replicas.close()
        client, self._client = self._client, None
        if client is not None and self._loop.is_running():  # the client belongs to its loop
            self._loop.call_soon_threadsafe(lambda: self._loop.create_task(client.aclose()))

    def _http(self):
        """One pooled HTTP/1.1 client per engine, made on the loop that first uses it."""
        import httpx

        if self._client is None:
            stall_s = self._settings.engine_stall_timeout_s
            self._client = httpx.AsyncClient(
                headers=auth_headers(self._settings),
                timeout=httpx.Timeout(10.0, read=stall_s),
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))
            self._loop = asyncio.get_running_loop()
        return self._client


def auth_headers(settings: Settings) -> dict[str, str]:
    """The Authorization header for the remote engine: vLLM's --api-key as a Bearer token (vllm-router
    passes a client's Authorization on to the replica it picks)."""
    return {"Authorization": f"Bearer {settings.engine_api_key}"} if settings.engine_api_key else {}


def _wait_for_model(base_url: str, timeout_s: float, headers: dict[str, str]) -> dict:
    import httpx

    deadline = time.monotonic() + timeout_s
    problem = "no answer"
    while time.monotonic() < deadline:
        try:
            response = httpx.get(f"{base_url}/v1/models", timeout=5, headers=headers)
            if response.status_code == 401:
                raise EngineStartError(
                    f"PREFIXDESK_ENGINE_URL={base_url} answered 401 Unauthorized at /v1/models: "
                    + ("PREFIXDESK_ENGINE_API_KEY is not the replicas' --api-key" if headers else
                       "its replicas ask for an API key; set PREFIXDESK_ENGINE_API_KEY to their --api-key"))
            if response.status_code == 200 and response.json().get("data"):
                return response.json()["data"][0]
            problem = f"HTTP {response.status_code}"
        except (httpx.HTTPError, ValueError) as exc:
            problem = type(exc).__name__
        time.sleep(1)
    raise EngineStartError(
        f"PREFIXDESK_ENGINE_URL={base_url} did not serve a model at /v1/models within {timeout_s:.0f} s ({problem}); "
        "start the cluster (python -m app.cluster) or fix PREFIXDESK_ENGINE_URL")


def _block_size(replicas: Replicas, settings: Settings) -> int:
    sizes = {u: m.block_size for u in replicas.urls if (m := replicas.metrics(u)) and m.block_size}
    if len(set(sizes.values())) > 1:
        raise EngineStartError(f"the replicas disagree on the KV block size ({sizes}); start them all with the "
                               "same --block-size, or prompts will hit the cache on some and not on others")
    if sizes:
        return next(iter(sizes.values()))
    if settings.block_size:
        return settings.block_size
    raise EngineStartError("the replicas do not report their block size in /metrics (vllm:cache_config_info); "
                           "set PREFIXDESK_BLOCK_SIZE to the --block-size they run with")


def _http_error(status: int, body: str) -> EngineError:
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = body[:200]
    if status in (429, 503):
        return EngineBusy(f"the model servers are busy (HTTP {status}); please retry in a moment")
    if status == 400:
        return EngineRejected(f"the model refused this request: {message}")
    log.error("the model server answered HTTP %d: %s", status, printable(message))
    return EngineError(f"the model server failed (HTTP {status}); please try again")


def _broken_reason(exc: Exception | None, replica: str) -> str:
    cause = f" ({type(exc).__name__})" if exc is not None else ""
    if not replica:  # no answer began: the router itself is unreachable
        return f"the model server is not reachable{cause}; please retry in a moment"
    return f"the model server {replica} stopped while answering{cause}; please retry"
