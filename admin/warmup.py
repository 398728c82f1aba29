"""Warming templates into the prefix cache, and keeping pinned ones there.

Warming is an ordinary request: the template's rendered prefix plus one probe token, one output
token. vLLM then holds the prefix's full blocks in its cache. The probe token is the tokenizer's
end-of-text token, which the chat never sends right after a system prompt, so the warming request
caches exactly the prefix's full blocks and nothing a real conversation could also hit.

Pinned templates are kept warm by the keep-warm loop of admin/cache_view.py, which re-sends their
prefixes every ``keep_warm_interval_s`` seconds (vLLM's prefix cache is LRU and cannot pin).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

from admin.templates import PrefixMeter
from app.engine import Engine, RequestStats
from app.store import TemplateInfo


@dataclass(frozen=True)
class WarmupResult:
    template: str
    num_prefix_tokens: int
    num_cached_tokens: int  # of the prefix, cached after warming (a second request's hit)
    was_cached_tokens: int  # already cached before warming
    elapsed_ms: float  # the warming request, start to end


async def warm(*, engine: Engine, meter: PrefixMeter, template: TemplateInfo) -> WarmupResult:
    """Put ``template``'s prefix in the cache and measure how much of it is cached now."""
    ids = _probe_ids(meter, template)
    started = time.perf_counter()
    first = await _request(engine, ids)
    elapsed_ms = (time.perf_counter() - started) * 1000
    second = await _request(engine, ids)
    return WarmupResult(template=template.name, num_prefix_tokens=len(ids) - 1,
                        num_cached_tokens=second.num_cached_tokens, was_cached_tokens=first.num_cached_tokens,
                        elapsed_ms=round(elapsed_ms, 1))


def _probe_ids(meter: PrefixMeter, template: TemplateInfo) -> list[int]:
    probe = meter.prompts.tokenizer.eos_token_id
    return list(meter.prefix_ids(template.chain)) + [probe if probe is not None else 0]


async def _request(engine: Engine, ids: list[int]) -> RequestStats:
    stats = None
    async with contextlib.aclosing(engine.stream(ids, max_tokens=1)) as stream:
        async for event in stream:
            if isinstance(event, RequestStats):
                stats = event
    assert stats is not None, "engine.stream always ends with RequestStats"
    return stats
