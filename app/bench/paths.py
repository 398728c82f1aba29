"""The serving paths a benchmark can drive, from the bare engine up to the web UI.

* ``raw``: ``LocalEngine.generate_raw`` — vLLM's AsyncLLM.generate with prompts tokenized before
  the run, nothing of the app around it (the baseline);
* ``app``: the app's serving code — ``PromptBuilder.build`` per request, then ``LocalEngine.stream``;
* ``http``: the OpenAI-compatible endpoint (``app.openai_api``) over HTTP, driven by the openai SDK;
* ``vllm-http``: vLLM's own OpenAI server on the same model, the same SDK, the system prompt sent
  as a system message;
* ``gradio``: the chat's ``/chat`` API through ``gradio_client`` (CPU runs only).

The first two run inside the server's process; the others are built in client processes by
``make_client_target``. Each ``send`` returns a ``Sample``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

from app.bench.loadgen import Sample, Timer
from app.bench.workload import BenchRequest, BenchTemplate
from app.engine import Delta, RequestStats
from app.engine.local import LocalEngine
from app.prompts import PromptBuilder

IN_PROCESS_PATHS = ("raw", "app")
CLIENT_PATHS = ("http", "vllm-http", "gradio")
PATHS = IN_PROCESS_PATHS + CLIENT_PATHS


class RawTarget:
    """AsyncLLM.generate on token ids computed before the run."""

    name = "raw"

    def __init__(self, engine: LocalEngine, token_ids: dict[int, list[int]], ignore_eos: bool = True):
        self.engine, self.token_ids, self.ignore_eos = engine, token_ids, ignore_eos

    async def send(self, req: BenchRequest, max_tokens: int, t0_wall: float) -> Sample:
        timer = Timer(req.index, req.template, t0_wall)
        n = 0
        async for new in self.engine.generate_raw(self.token_ids[req.index], max_tokens=max_tokens,
                                                  cache_salt=req.cache_salt, ignore_eos=self.ignore_eos):
            if new:
                timer.token()
                n += new
        return timer.sample(n, prompt_tokens=len(self.token_ids[req.index]))


class AppTarget:
    """The app's serving code: prompt assembly from the template chain, then the engine module."""

    name = "app"

    def __init__(self, engine: LocalEngine, prompts: PromptBuilder, templates: Sequence[BenchTemplate],
                 ignore_eos: bool = True):
        self.engine, self.prompts, self.ignore_eos = engine, prompts, ignore_eos
        self.systems = {t.name: t.system for t in templates}

    async def send(self, req: BenchRequest, max_tokens: int, t0_wall: float) -> Sample:
        timer = Timer(req.index, req.template, t0_wall)
        prompt = self.prompts.build(self.systems[req.template], [], req.question)
        stats: RequestStats | None = None
        stream = self.engine.stream(prompt.token_ids, max_tokens=min(max_tokens, prompt.max_tokens),
                                    cache_salt=req.cache_salt, ignore_eos=self.ignore_eos)
        async with contextlib.aclosing(stream):
            async for event in stream:
                if isinstance(event, Delta):
                    timer.token()
                else:
                    stats = event
        assert stats is not None  # stream() always ends with its stats
        return timer.sample(stats.output_tokens, prompt_tokens=stats.prompt_tokens,
                            cached_tokens=stats.num_cached_tokens)


@dataclass
class BenchDesk:
    """The desk the OpenAI endpoint needs, with the workload's templates instead of the database."""

    prompts: PromptBuilder
    engine: LocalEngine
    published: tuple[BenchTemplate, ...]

    def templates(self) -> Sequence[BenchTemplate]:
        return self.published

    def tenant_salt(self, tenant: str) -> str | None:
        return None  # one tenant: the benchmark's


class OpenAITarget:
    """A streaming chat completion through the openai SDK; cached tokens come from ``usage``."""

    def __init__(self, name: str, base_url: str, *, served_model: str | None = None,
                 systems: dict[str, str] | None = None, ignore_eos: bool = True):
        import openai

        try:  # the openai SDK's own HTTP library since openai 3.x
            import httpx2 as httpx
        except ImportError:
            import httpx

        self.name = name
        # The SDK's default pool stops at 1,000 connections; a saturated GPU holds more streams open.
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        self.client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0,
                                         http_client=httpx.AsyncClient(limits=limits, timeout=600))
        self.served_model, self.systems, self.ignore_eos = served_model, systems or {}, ignore_eos

    async def send(self, req: BenchRequest, max_tokens: int, t0_wall: float) -> Sample:
        timer = Timer(req.index, req.template, t0_wall)
        messages = [{"role": "user", "content": req.question}]
        if self.served_model:  # vLLM's server knows no templates: send the system prompt itself
            messages.insert(0, {"role": "system", "content": self.systems[req.template]})
        extra: dict = {"ignore_eos": self.ignore_eos}
        if req.cache_salt:
            extra["cache_salt"] = req.cache_salt
        stream = await self.client.chat.completions.create(
            model=self.served_model or req.template, messages=messages, max_tokens=max_tokens, stream=True,
            stream_options={"include_usage": True}, extra_body=extra)
        usage = None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                timer.token()
            if chunk.usage:
                usage = chunk.usage
        if usage is None:
            return timer.sample(0, error="no usage chunk in the stream")
        details = usage.prompt_tokens_details
        return timer.sample(usage.completion_tokens, prompt_tokens=usage.prompt_tokens,
                            cached_tokens=details.cached_tokens if details else None)

    async def close(self) -> None:
        await self.client.close()


class GradioTarget:
    """The chat's ``/chat`` API (message, history, template, conversation id) via gradio_client."""

    name = "gradio"

    def __init__(self, base_url: str, threads: int = 64):
        from concurrent.futures import ThreadPoolExecutor

        from gradio_client import Client

        self.client = Client(base_url, verbose=False)
        self.pool = ThreadPoolExecutor(max_workers=threads)

    async def send(self, req: BenchRequest, max_tokens: int, t0_wall: float) -> Sample:
        timer = Timer(req.index, req.template, t0_wall)
        loop = asyncio.get_running_loop()
        final = await loop.run_in_executor(self.pool, self._chat, req, timer)
        if final.get("status") != "ok":
            return timer.sample(0, error=f"{final.get('status')}: {final.get('error')}")
        return timer.sample(final["output_tokens"], prompt_tokens=final["prompt_tokens"],
                            cached_tokens=final["num_cached_tokens"])

    def _chat(self, req: BenchRequest, timer: Timer) -> dict:
        final: dict = {}
        for out in self.client.submit(req.question, [], req.template, None, api_name="/chat"):
            if out.get("done"):
                final = out
            elif out.get("text"):
                timer.token()
        return final

    async def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()


def make_client_target(kind: str, base_url: str, served_model: str | None = None,
                       systems: dict[str, str] | None = None):
    """Build a client-side target in a client process (``kind`` is http, vllm-http or gradio)."""
    if kind == "http":
        return OpenAITarget("http", base_url)
    if kind == "vllm-http":
        return OpenAITarget("vllm-http", base_url, served_model=served_model, systems=systems)
    if kind == "gradio":
        return GradioTarget(base_url)
    raise ValueError(f"no client target {kind!r}; choose one of {', '.join(CLIENT_PATHS)}")
