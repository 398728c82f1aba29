"""The routing key of a request: which replica's prefix cache should answer it.

A template family (a root template and every template below it) shares the root's KV blocks, so
all its requests carry one key, the root's name, and vllm-router's ``consistent_hash`` policy sends
equal keys to one replica: the family's blocks are computed once in the cluster, not once per
replica. A family too busy for one replica is split into ``shards`` keys ``family:0`` ...
``family:k-1``; each conversation keeps its shard (the key is chosen from the conversation id), so
the replica that holds its history blocks keeps answering it. Every shard's replica computes the
family's prefix once, so k shards cost k copies of it and spread its load over up to k replicas.

The key is plain text; ``app.engine.remote`` percent-encodes it for the HTTP header. The in-process
engine ignores it.
"""

from __future__ import annotations

import hashlib


def routing_key(family: str, *, shards: int = 1, shard_seed: str = "") -> str:
    """``family`` when ``shards`` is 1, else ``family:k`` with k in [0, shards) chosen stably from
    ``shard_seed`` (the same seed always gives the same k, in every process and on every run)."""
    if shards <= 1:
        return family
    k = int.from_bytes(hashlib.sha256(shard_seed.encode()).digest()[:8], "big") % shards
    return f"{family}:{k}"


def family_keys(family: str, *, shards: int = 1) -> list[str]:
    """Every key of ``family``: warmup and keep-warm send the prefix once per key, so each shard's
    replica holds it before a customer arrives."""
    return [family] if shards <= 1 else [f"{family}:{k}" for k in range(shards)]
