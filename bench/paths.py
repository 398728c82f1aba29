"""The serving paths a benchmark can drive, from the bare engine up to the web UI and the cluster.

In the benchmark's process (the load generator shares the engine's event loop):

* ``raw``: vLLM's ``AsyncLLM.generate`` on token ids built before the run with the model's chat
  template, nothing of the app around it (the baseline): the same engine, flags and sampling;
* ``app``: what the app's /v1 handler does, without HTTP — the real ``Desk`` finds the template,
  builds the prompt, and streams from the engine with the template family's routing key.

Over HTTP, from client processes (``make_client_target`` builds them there):

* ``http``: the real app (``create_app(build_services(settings, engine=...))``) served by uvicorn in
  the benchmark's process, its ``/v1/chat/completions``;
* ``remote``: the same ``/v1`` served by ``python -m app`` (``PREFIXDESK_ENGINE=remote``,
  ``PREFIXDESK_WEB_PROCESSES=N``) in front of vllm serve replicas;
* ``router``: vllm-router's ``/v1/completions`` with token-id prompts and the family's
  ``x-session-id``, exactly what the app's remote engine sends;
* ``replica``: one ``vllm serve`` replica's ``/v1/completions``, the same body, no router;
* ``chat``: the chat page's send event through Gradio's queue, one fresh browser session per customer,
  spoken as the browser speaks it (``bench.chatpage``), against the ``http`` path's in-process app or,
  with ``--app-engine local``, a ``python -m app`` with its own engine (whose ``/v1`` is then ``remote``);
* ``gradio``: the chat's ``/chat`` API through gradio_client (a conformance check, not a measurement:
  gradio_client cannot generate a GPU's load).

Every target's ``send(req, max_tokens, timer)`` marks the timer when the request leaves and at each
streamed token, and returns an ``Outcome``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import uuid
from collections.abc import Sequence
from urllib.parse import quote

from app.core.routing import routing_key
from bench.loadgen import Outcome, Timer
from bench.workload import BenchRequest

IN_PROCESS_PATHS = ("raw", "app")
CLIENT_PATHS = ("http", "remote", "router", "replica", "chat", "gradio")
PATHS = IN_PROCESS_PATHS + CLIENT_PATHS
ROUTING_HEADER = "x-session-id"  # what app.engine.remote sends (vllm-router's consistent_hash key)
REPLICA_HEADER = "x-prefixdesk-replica"  # added by app.cluster.replica_header on each replica
CLIENT = "127.0.0.1"  # the app path's client address for the desk's limits (off in benchmarks)


class RawTarget:
    """AsyncLLM.generate on token ids computed before the run.

    The baseline reaches past the app's ``Engine`` interface on purpose, to the ``AsyncLLM`` that
    ``LocalEngine`` drives: every path above it is measured against this one.
    """

    def __init__(self, engine, token_ids: dict[int, list[int]], ignore_eos: bool = True):
        self.engine, self.token_ids, self.ignore_eos = engine, token_ids, ignore_eos
        self._ids = itertools.count()

    async def send(self, req: BenchRequest, max_tokens: int, timer: Timer) -> Outcome:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        settings = self.engine._settings
        params = SamplingParams(max_tokens=max_tokens, temperature=settings.temperature, top_p=settings.top_p,
                                ignore_eos=self.ignore_eos, output_kind=RequestOutputKind.DELTA)
        prompt: dict = {"prompt_token_ids": list(self.token_ids[req.index])}
        if req.cache_salt:
            prompt["cache_salt"] = req.cache_salt
        n = 0
        timer.sent()
        async for out in self.engine._llm.generate(prompt, params, request_id=f"raw-{next(self._ids)}"):
            if new := len(out.outputs[0].token_ids):
                timer.token()
                n += new
        return Outcome(n, prompt_tokens=len(self.token_ids[req.index]))

    async def close(self) -> None:
        pass


class AppTarget:
    """The /v1 handler's work without HTTP: the real Desk's template, prompt and engine stream."""

    def __init__(self, desk, ignore_eos: bool = True):
        self.desk, self.ignore_eos = desk, ignore_eos

    async def send(self, req: BenchRequest, max_tokens: int, timer: Timer) -> Outcome:
        from app.engine import Delta, RequestStats

        timer.sent()
        template = self.desk.customer_template(req.template)
        self.desk.limiter.check_rate(CLIENT)
        stats: RequestStats | None = None
        with self.desk.limiter.stream(CLIENT):
            prompt = await self.desk.build_prompt(template, [], req.question)
            stream = self.desk.engine.stream(
                prompt.token_ids, max_tokens=min(max_tokens, prompt.max_tokens), cache_salt=req.cache_salt,
                ignore_eos=self.ignore_eos,
                routing_key=routing_key(template.family, shards=self.desk.family_shards, shard_seed=uuid.uuid4().hex))
            async with contextlib.aclosing(stream):
                async for event in stream:
                    if isinstance(event, Delta):
                        timer.token()
                    elif isinstance(event, RequestStats):
                        stats = event
        assert stats is not None  # Engine.stream always ends with its stats
        return Outcome(stats.output_tokens, stats.prompt_tokens, stats.num_cached_tokens, stats.replica)

    async def close(self) -> None:
        pass


class _StreamingHTTP:
    """An aiohttp session without a connection cap: a saturated GPU holds thousands of streams open."""

    def __init__(self, base_url: str):
        self.base_url = base_url.rstrip("/")
        self.session = None

    async def open(self) -> None:
        import aiohttp

        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None, keepalive_timeout=600)
        self.session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None,
                                                                                               sock_read=600))

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    async def _events(self, url: str, body: dict, headers: dict, timer: Timer):
        """POST ``body`` and yield (response headers, each SSE JSON event); raises on an HTTP error."""
        payload = json.dumps(body, ensure_ascii=False).encode()
        timer.sent()
        async with self.session.post(url, data=payload, headers={"content-type": "application/json", **headers}) as r:
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}: {(await r.text())[:200]}")
            async for raw in r.content:
                line = raw.strip()
                if not line.startswith(b"data: "):
                    continue
                if line == b"data: [DONE]":
                    return
                event = json.loads(line[6:])
                if "error" in event:
                    raise RuntimeError(f"error in the stream: {str(event['error'])[:200]}")
                yield r.headers, event


class ChatTarget(_StreamingHTTP):
    """The app's ``/v1/chat/completions``, streamed; the template is the model, as any OpenAI client sends."""

    def __init__(self, base_url: str, ignore_eos: bool = True):
        super().__init__(base_url)
        self.ignore_eos = ignore_eos

    async def send(self, req: BenchRequest, max_tokens: int, timer: Timer) -> Outcome:
        body = {"model": req.template, "messages": [{"role": "user", "content": req.question}],
                "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True},
                "ignore_eos": self.ignore_eos}
        if req.cache_salt:
            body["cache_salt"] = req.cache_salt
        usage = None
        async for _, event in self._events(f"{self.base_url}/v1/chat/completions", body, {}, timer):
            choices = event.get("choices") or ()
            if any((c.get("delta") or {}).get("content") for c in choices):
                timer.token()
            usage = event.get("usage") or usage
        return _outcome(usage)


class CompletionsTarget(_StreamingHTTP):
    """``/v1/completions`` of vllm-router or one replica with the app's token ids and routing header."""

    def __init__(self, base_url: str, *, served_model: str, prefixes: dict[str, list[int]],
                 families: dict[str, str], suffix_ids: dict[int, list[int]], temperature: float, top_p: float,
                 family_shards: int = 1, ignore_eos: bool = True, routing: bool = True):
        super().__init__(base_url)
        self.served_model, self.prefixes, self.families = served_model, prefixes, families
        self.family_shards = family_shards
        self.suffix_ids, self.temperature, self.top_p = suffix_ids, temperature, top_p
        self.ignore_eos, self.routing = ignore_eos, routing

    async def send(self, req: BenchRequest, max_tokens: int, timer: Timer) -> Outcome:
        body = {"model": self.served_model, "prompt": self.prefixes[req.template] + self.suffix_ids[req.index],
                "max_tokens": max_tokens, "temperature": self.temperature, "top_p": self.top_p,
                "ignore_eos": self.ignore_eos, "stream": True, "stream_options": {"include_usage": True}}
        if req.cache_salt:
            body["cache_salt"] = req.cache_salt
        # As the desk and app.engine.remote: the family's key (a shard of it, chosen per request, with
        # PREFIXDESK_FAMILY_SHARDS > 1), percent-encoded since header values are ASCII.
        key = routing_key(self.families[req.template], shards=self.family_shards, shard_seed=str(req.index))
        headers = {ROUTING_HEADER: quote(key, safe=":")} if self.routing else {}
        usage, replica = None, ""
        async for response_headers, event in self._events(f"{self.base_url}/v1/completions", body, headers, timer):
            replica = replica or response_headers.get(REPLICA_HEADER, "")
            if event.get("choices"):
                timer.token()
            usage = event.get("usage") or usage
        outcome = _outcome(usage)
        outcome.replica = replica
        return outcome


class GradioTarget:
    """The chat's ``/chat`` API (message, history, template, conversation id) via gradio_client."""

    def __init__(self, base_url: str, threads: int = 64):
        self.base_url, self.threads = base_url, threads
        self.client = self.pool = None
        self.parameters: list[str] = []

    async def open(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        from gradio_client import Client

        # gradio_client runs each submit() in a pool of its own (40 threads unless told): were it smaller than
        # ours, requests would queue there after timer.sent(), where the client-lag check cannot see them.
        # Telemetry stays off only when both the argument and GRADIO_ANALYTICS_ENABLED say so.
        self.client = await asyncio.to_thread(Client, self.base_url, verbose=False, max_workers=self.threads,
                                              analytics_enabled=False)
        self.pool = ThreadPoolExecutor(max_workers=self.threads)
        api = await asyncio.to_thread(self.client.view_api, print_info=False, return_format="dict")
        # (message, history, template, conversation_id, ...): whatever else it takes is sent as None.
        self.parameters = [p["parameter_name"] for p in api["named_endpoints"]["/chat"]["parameters"]]

    async def send(self, req: BenchRequest, max_tokens: int, timer: Timer) -> Outcome:
        loop = asyncio.get_running_loop()
        final = await loop.run_in_executor(self.pool, self._chat, req, timer)
        if final.get("status") != "ok":
            raise RuntimeError(f"{final.get('status')}: {final.get('error')}")
        return Outcome(final["output_tokens"], final["prompt_tokens"], final["num_cached_tokens"])

    def _chat(self, req: BenchRequest, timer: Timer) -> dict:
        final: dict = {}
        timer.sent()
        given = {"message": req.question, "history": [], "template": req.template}
        args = [given.get(name) for name in self.parameters]
        for out in self.client.submit(*args, api_name="/chat"):
            if out.get("done"):
                final = out
            elif out.get("text"):
                timer.token()
        return final

    async def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
        if self.client is not None:
            self.client.close()


def make_client_target(kind: str, base_url: str, suffix_ids: dict[int, list[int]] | None = None, **options):
    """Build a client-side target in a client process (``kind``: http, remote, router, replica, chat, gradio)."""
    if kind in ("http", "remote"):
        return ChatTarget(base_url)
    if kind == "chat":
        from bench.chatpage import ChatPageTarget

        return ChatPageTarget(base_url, **options)
    if kind in ("router", "replica"):
        return CompletionsTarget(base_url, suffix_ids=suffix_ids or {}, routing=kind == "router", **options)
    if kind == "gradio":
        return GradioTarget(base_url)
    raise ValueError(f"no client target {kind!r}; choose one of {', '.join(CLIENT_PATHS)}")


def completion_options(*, served_model: str, templates: Sequence, prefixes: dict[str, list[int]],
                       temperature: float, top_p: float, family_shards: int = 1) -> dict:
    """The part of a router/replica target description that every client process shares."""
    return {"served_model": served_model, "prefixes": prefixes, "temperature": temperature, "top_p": top_p,
            "families": {t.name: t.routing_family for t in templates}, "family_shards": family_shards}


def _outcome(usage: dict | None) -> Outcome:
    if not usage:
        raise RuntimeError("no usage in the stream")
    details = usage.get("prompt_tokens_details") or {}
    return Outcome(int(usage.get("completion_tokens") or 0), usage.get("prompt_tokens"), details.get("cached_tokens"))
