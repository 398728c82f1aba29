"""The routing key of a request: which replica's cache should serve it.

A template family (a root template and every template below it) shares its KV blocks, so its
requests carry the family's name and a prefix-affine router sends them to one replica. A family
too busy for one replica is split into ``shards`` keys (``family:k``); a conversation keeps its
shard, so its own history blocks stay warm too.
"""

from __future__ import annotations

import hashlib


def routing_key(family: str, *, shards: int = 1, shard_seed: str = "") -> str:
    """``family`` alone, or ``family:k`` with k in [0, shards) chosen stably from ``shard_seed``."""
    if shards <= 1:
        return family
    k = int.from_bytes(hashlib.sha256(shard_seed.encode()).digest()[:8], "big") % shards
    return f"{family}:{k}"
