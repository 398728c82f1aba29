"""The loops that run once per deployment: the cache sampler and keep-warm, and the start-up warmup.

Several web processes may share one database; each loop runs only in the process that holds its
lease (app/db/leases.py), renewed every tick. When that process dies, its lease expires and another
process's loop takes over within a few seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

from app.core.cache_view import read_cache_view, sample_of
from app.core.catalog import TemplateCatalog
from app.core.routing import family_keys
from app.core.warmup import probe_token, touch, warm_all
from app.db import Database
from app.db import leases as db_leases
from app.db import metrics as db_metrics
from app.db import operators as db_operators
from app.engine import Engine
from app.settings import Settings

log = logging.getLogger(__name__)

HOLDER = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
PRUNE_EVERY = 500  # samples between deletions of old ones


class Loop:
    """A named tick, run every ``interval_s`` while this process holds the lease ``name``."""

    def __init__(self, name: str, db: Database, interval_s: float):
        self.name, self.db, self.interval_s = name, db, interval_s
        self.ticks = 0

    async def tick(self) -> None:
        raise NotImplementedError

    async def run(self) -> None:
        ttl_s = max(3 * self.interval_s, 5.0)
        while True:
            try:
                if await self.db.write(db_leases.acquire, name=self.name, holder=HOLDER, ttl_s=ttl_s):
                    await self.tick()
                    self.ticks += 1
            except Exception:  # a locked database or a busy engine must not end the loop
                log.exception("%s tick failed", self.name)
            await asyncio.sleep(self.interval_s)


class CacheSampler(Loop):
    """Stores a reading every ``interval_s``, so the console's plots survive a restart."""

    def __init__(self, *, engine: Engine, db: Database, interval_s: float, retention_h: int):
        super().__init__("cache-sampler", db, interval_s)
        self.engine, self.retention_h = engine, retention_h

    async def tick(self) -> None:
        view = await read_cache_view(engine=self.engine, db=self.db)
        await self.db.write(db_metrics.add_sample, sample=sample_of(view))
        if self.ticks % PRUNE_EVERY == 0:
            await self.db.write(db_metrics.prune_samples, older_than=view.t - timedelta(hours=self.retention_h))
            await self.db.write(db_operators.prune_sessions, now=view.t)  # console logins that ended


class KeepWarm(Loop):
    """Touches every pinned template each tick (admin/warmup.touch, the same request as warmup), which
    moves its blocks to the young end of vLLM's LRU queue, or computes them again if evicted."""

    def __init__(self, *, engine: Engine, db: Database, catalog: TemplateCatalog, probe_id: int, interval_s: float,
                 shards: int = 1):
        super().__init__("keep-warm", db, interval_s)
        self.engine, self.catalog, self.probe_id, self.shards = engine, catalog, probe_id, shards

    async def tick(self) -> None:
        for entry in self.catalog.entries():  # a pinned template's split candidate is kept warm too
            if entry.template.pinned:
                for key in family_keys(entry.template.family, shards=self.shards):
                    await touch(self.engine, entry.prefix_ids, probe_id=self.probe_id, key=key)


async def warm_published(*, engine: Engine, catalog: TemplateCatalog, probe_id: int, shards: int = 1) -> int:
    """Warm every published template and split candidate (pinned first); returns how many. Run before the
    chat reports ready."""
    return len([r async for r in warm_all(engine, catalog, probe_id=probe_id, shards=shards)])


@contextlib.asynccontextmanager
async def background(*, settings: Settings, engine: Engine, db: Database, catalog: TemplateCatalog,
                     tokenizer) -> AsyncIterator[None]:
    """Runs the catalog watch in every process, and the sampler and keep-warm (when
    ``keep_warm_interval_s`` > 0) in the one process holding their leases."""
    probe_id = probe_token(tokenizer)
    shards = settings.family_shards
    loops = [CacheSampler(engine=engine, db=db, interval_s=settings.sample_interval_s,
                          retention_h=settings.sample_retention_h).run(), catalog.watch()]
    if settings.keep_warm_interval_s > 0:
        loops.append(KeepWarm(engine=engine, db=db, catalog=catalog, probe_id=probe_id,
                              interval_s=settings.keep_warm_interval_s, shards=shards).run())
    tasks = [asyncio.create_task(loop) for loop in loops]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            for name in ("cache-sampler", "keep-warm"):
                await db.write(db_leases.release, name=name, holder=HOLDER)


