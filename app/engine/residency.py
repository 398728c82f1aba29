"""Which token sequences the prefix cache holds, mirrored from vLLM's KV-cache events.

vLLM publishes every change to its prefix-cache hash table over ZMQ: ``BlockStored`` (block hashes,
the parent's hash, the token ids), ``BlockRemoved`` (evicted hashes) and ``AllBlocksCleared`` (a
reset). ``ResidencyMirror`` replays them into a map hash -> (parent, tokens), so the app can tell
which sequences are cached without reaching into the scheduler. Hashes depend on vLLM's hash
function and seed, so prompts are matched by token ids along the parent chain; the cache salt is
part of a first block's key, so salted blocks never match an unsalted prompt.

Events are decoded from their msgpack wire form (a batch is ``[ts, [event, ...], dp_rank?]``, an
event a map tagged with ``type``), not through vLLM's classes: a web process in front of remote
replicas needs no vLLM, and replicas of another vLLM version still decode.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

BlockHash = bytes | int


@dataclass(frozen=True)
class ResidencyMatch:
    """How much of a token sequence the prefix cache holds, in whole blocks from the start."""

    block_size: int
    num_blocks: int  # full blocks of the sequence
    resident_blocks: int  # leading blocks found in the cache (a lookup stops at the first miss)
    block_ids: tuple[int, ...]  # the mirror's ids of those blocks, root first

    @property
    def resident_tokens(self) -> int:
        return self.resident_blocks * self.block_size

    @property
    def fully_resident(self) -> bool:
        return self.resident_blocks == self.num_blocks


@dataclass(frozen=True)
class CacheBranch:
    """A run of cached blocks where no other cached sequence branches off (a radix-tree edge)."""

    block_ids: tuple[int, ...]  # the mirror's ids, parent first
    token_ids: tuple[int, ...]  # the tokens of those blocks
    children: tuple[CacheBranch, ...]
    cache_salt: str | None  # set on a root branch whose first block belongs to a salted namespace

    @property
    def num_blocks(self) -> int:
        return len(self.block_ids)

    @property
    def num_blocks_below(self) -> int:
        """Blocks of this branch and everything under it."""
        return self.num_blocks + sum(c.num_blocks_below for c in self.children)


@dataclass(frozen=True)
class KVEventStats:
    endpoint: str
    batches: int  # event batches received
    stored: int  # BlockStored events (one may carry several blocks)
    removed: int
    cleared: int
    missed_batches: int  # gaps in the publisher's sequence; a prefix-cache reset resynchronises
    num_cached_blocks: int  # blocks the mirror holds now


@dataclass
class _MirrorBlock:
    id: int
    parent: BlockHash | None
    token_ids: tuple[int, ...]
    extra: tuple | None
    copies: int = 1  # vLLM may cache the same content twice (two requests filling it at once)


class ResidencyMirror:
    """The prefix cache's contents as the app sees them.

    ``apply`` is called with each decoded event batch by the subscriber thread (or a test); every
    reader takes the lock, so the console and tests see a consistent state.
    """

    def __init__(self, endpoint: str, block_size: int):
        self.endpoint = endpoint
        self.block_size = block_size
        self._lock = threading.Lock()
        self._blocks: dict[BlockHash, _MirrorBlock] = {}
        self._index: dict[tuple, BlockHash] = {}  # (parent, tokens, extra) -> hash
        self._ids = itertools.count(1)
        self._batches = self._stored = self._removed = self._cleared = self._missed = 0
        self._last_seq: int | None = None
        self._last_event = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- reading -----------------------------------------------------------------------------

    def match(self, token_ids: Sequence[int], *, cache_salt: str | None = None) -> ResidencyMatch:
        """The leading full blocks of ``token_ids`` (in namespace ``cache_salt``) that are cached."""
        size = self.block_size
        num_blocks = len(token_ids) // size
        ids: list[int] = []
        parent: BlockHash | None = None
        with self._lock:
            for i in range(num_blocks):
                extra = (cache_salt,) if i == 0 and cache_salt else None
                key = (parent, tuple(token_ids[i * size:(i + 1) * size]), extra)
                block_hash = self._index.get(key)
                if block_hash is None:
                    break
                ids.append(self._blocks[block_hash].id)
                parent = block_hash
        return ResidencyMatch(size, num_blocks, len(ids), tuple(ids))

    def num_cached_blocks(self) -> int:
        """Cache entries the mirror holds (a block cached twice counts twice, as in vLLM's pool)."""
        with self._lock:
            return sum(b.copies for b in self._blocks.values())

    def tree(self) -> list[CacheBranch]:
        """The cached sequences as a radix tree: one root branch per distinct first block."""
        with self._lock:
            children: dict[BlockHash | None, list[BlockHash]] = collections.defaultdict(list)
            for block_hash, block in self._blocks.items():
                # A block whose parent was evicted can never be hit; it is shown as a root.
                parent = block.parent if block.parent in self._blocks else None
                children[parent].append(block_hash)
            return [self._branch(h, children) for h in sorted(children[None], key=lambda h: self._blocks[h].id)]

    def stats(self) -> KVEventStats:
        with self._lock:
            return KVEventStats(self.endpoint, self._batches, self._stored, self._removed, self._cleared,
                                self._missed, sum(b.copies for b in self._blocks.values()))

    def wait_quiet(self, quiet_s: float = 0.3, timeout_s: float = 10.0) -> bool:
        """Block until no event batch arrived for ``quiet_s``; False if that took over ``timeout_s``.

        vLLM publishes a step's events from a thread of its own, after the step, so a caller that
        just finished a request waits here before comparing the mirror with the engine.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                idle = time.monotonic() - self._last_event
            if idle >= quiet_s:
                return True
            time.sleep(min(quiet_s - idle, 0.05) + 0.01)
        return False

    # -- writing -----------------------------------------------------------------------------

    def apply(self, events: Sequence[Mapping[str, Any]], seq: int | None = None) -> None:
        """Replay one batch of KV events, each a map tagged ``type``: BlockStored, BlockRemoved,
        AllBlocksCleared (others are ignored)."""
        with self._lock:
            self._batches += 1
            self._last_event = time.monotonic()
            if seq is not None:
                if self._last_seq is not None and seq > self._last_seq + 1:
                    self._missed += seq - self._last_seq - 1
                self._last_seq = seq
            for event in events:
                kind = event.get("type")
                if kind == "BlockStored":
                    self._stored += 1
                    self._store(event)
                elif kind == "BlockRemoved":
                    self._removed += 1
                    for block_hash in event["block_hashes"]:
                        self._remove(block_hash)
                elif kind == "AllBlocksCleared":
                    self._cleared += 1
                    self._blocks.clear()
                    self._index.clear()

    def clear(self) -> None:
        """Forget every block: the engine's prefix cache was reset or the engine replaced."""
        with self._lock:
            self._blocks.clear()
            self._index.clear()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._subscribe, name="kv-events", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self.endpoint.startswith("ipc://"):
            Path(self.endpoint.removeprefix("ipc://")).unlink(missing_ok=True)

    def _store(self, event: Mapping[str, Any]) -> None:
        size = event["block_size"]
        parent = event.get("parent_block_hash")
        hashes = event["block_hashes"]
        token_ids = event["token_ids"]
        extras = event.get("extra_keys") or [None] * len(hashes)
        for i, block_hash in enumerate(hashes):
            tokens = tuple(token_ids[i * size:(i + 1) * size])
            extra = tuple(extras[i]) if extras[i] else None
            block = self._blocks.get(block_hash)
            if block is not None:
                block.copies += 1
            else:
                self._blocks[block_hash] = _MirrorBlock(next(self._ids), parent, tokens, extra)
                self._index[(parent, tokens, extra)] = block_hash
            parent = block_hash

    def _remove(self, block_hash: BlockHash) -> None:
        block = self._blocks.get(block_hash)
        if block is None:
            return
        block.copies -= 1
        if block.copies == 0:
            del self._blocks[block_hash]
            self._index.pop((block.parent, block.token_ids, block.extra), None)

    def _branch(self, block_hash: BlockHash, children) -> CacheBranch:
        root = self._blocks[block_hash]
        salt = str(root.extra[0]) if root.extra else None
        ids, tokens = [], []
        while True:
            block = self._blocks[block_hash]
            ids.append(block.id)
            tokens.extend(block.token_ids)
            below = children.get(block_hash, [])
            if len(below) != 1:
                break
            block_hash = below[0]
        kids = sorted(below, key=lambda h: self._blocks[h].id)
        return CacheBranch(tuple(ids), tuple(tokens), tuple(self._branch(h, children) for h in kids), salt)

    def _subscribe(self) -> None:
        import msgspec
        import zmq

        context = zmq.Context.instance()
        socket = context.socket(zmq.SUB)
        socket.setsockopt(zmq.SUBSCRIBE, b"")
        socket.setsockopt(zmq.RCVHWM, 0)  # never drop: a lost BlockRemoved would show a stale block
        socket.connect(subscriber_address(self.endpoint))
        try:
            while not self._stop.is_set():
                if not socket.poll(100):
                    continue
                _topic, seq_bytes, payload = socket.recv_multipart()
                try:
                    events = decode_batch(msgspec.msgpack.decode(payload))
                except (msgspec.DecodeError, ValueError):
                    log.warning("undecodable KV event batch skipped; the residency view may be off until a reset")
                    continue
                self.apply(events, int.from_bytes(seq_bytes, "big", signed=True))
        finally:
            socket.close(linger=0)


def decode_batch(batch: Any) -> list[Mapping[str, Any]]:
    """The events of one decoded batch (``[ts, events, ...]``); raises ValueError for another shape."""
    if not isinstance(batch, list) or len(batch) < 2 or not isinstance(batch[1], list):
        raise ValueError("not a KV event batch")
    return [e for e in batch[1] if isinstance(e, dict)]


def publisher_endpoint(endpoint: str) -> str:
    """The endpoint to give vLLM so that its publisher binds ``endpoint``'s address, and only that one.

    vLLM binds an endpoint that contains ``*`` or ``::`` (or is ipc) and connects to any other
    (``ZmqEventPublisher._is_bind_endpoint``, vllm/distributed/kv_events.py): given
    ``tcp://127.0.0.1:5557`` it would wait for a subscriber to listen there. The IPv4-mapped form
    ``tcp://[::ffff:127.0.0.1]:5557`` names the same address, makes vLLM bind, and ZMQ binds it as the
    IPv4 address 127.0.0.1 alone; ``0.0.0.0`` becomes vLLM's own wildcard ``*``.
    """
    if not endpoint.startswith("tcp://"):
        return endpoint
    host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
    if host in ("*", "0.0.0.0"):
        return f"tcp://*:{port}"
    if host.startswith("[::ffff:"):
        return endpoint
    return f"tcp://[::ffff:{host}]:{port}"


def subscriber_address(endpoint: str) -> str:
    """Where a subscriber connects for the publisher bound at ``endpoint`` (``publisher_endpoint``):
    the address itself, and for one bound on every address, this host's 127.0.0.1."""
    if not endpoint.startswith("tcp://"):
        return endpoint
    host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
    if host in ("*", "0.0.0.0"):
        host = "127.0.0.1"
    return f"tcp://{host.removeprefix('[::ffff:').removesuffix(']')}:{port}"
