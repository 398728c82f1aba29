"""How the KV cache's blocks split into held, evictable and empty, from vLLM's usage and the KV-event mirror."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from app.engine.types import BlockCounts, Residency


def block_counts(*, num_blocks: int, kv_cache_usage: float, residency: Residency,
                 running: Iterable[tuple[Sequence[int], str | None]]) -> BlockCounts:
    """Split the usable blocks into held, evictable and empty (see ``BlockCounts``).

    ``running`` holds each running request's token ids so far and its cache salt: every cached block
    along such a sequence is held by it, so those blocks are cached but not evictable. The mirror
    follows the engine a step behind, so while requests run the split is that of the last step.
    """
    usable = max(num_blocks - 1, 0)  # vLLM keeps one null block out of use
    held = min(round(kv_cache_usage * usable), usable)
    on_running: set[int] = set()
    for token_ids, salt in running:
        on_running.update(residency.match(token_ids, cache_salt=salt).block_ids)
    held_cached = min(len(on_running), held)
    evictable = max(0, min(residency.num_cached_blocks() - held_cached, usable - held))
    return BlockCounts(usable=usable, held=held, held_cached=held_cached, evictable=evictable)
