"""The published templates, held in memory: no request queries the database for its template.

The catalog loads every published template with its prefix token ids at start-up. A change made
in this process refreshes it at once (``refresh``); a change made by another web process on the
same database bumps the ``templates`` revision, which ``watch`` polls every few seconds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from app.core.prompts import PromptBuilder, system_text
from app.db import Database
from app.db import templates as db_templates
from app.db.rows import TemplateInfo

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 2.0


class TemplateNotFound(LookupError):
    def __init__(self, name: str, available: Sequence[str]):
        shown = ", ".join(available) or "none"
        super().__init__(f"There is no published template named {name!r}. Choose one of: {shown}.")
        self.name = name


@dataclass(frozen=True)
class CatalogEntry:
    template: TemplateInfo
    prefix_ids: tuple[int, ...]  # the rendered system segment: what every request of it starts with


class TemplateCatalog:
    def __init__(self, db: Database, prompts: PromptBuilder):
        self._db = db
        self._prompts = prompts
        self._entries: dict[str, CatalogEntry] = {}
        self.revision = -1

    def load(self) -> None:
        """Read the catalog in the calling thread (start-up, or a thread of ``refresh``)."""
        revision = self._db.run(db_templates.revision)
        templates = self._db.run(db_templates.published)
        entries = {t.name: CatalogEntry(t, self._prompts.prefix_ids(system_text(t.chain))) for t in templates}
        self._entries, self.revision = entries, revision

    async def refresh(self) -> None:
        """Read the catalog again, off the event loop (tokenizing a long template takes milliseconds)."""
        await asyncio.to_thread(self.load)

    async def watch(self, interval_s: float = POLL_INTERVAL_S) -> None:
        """Refresh whenever the revision moves (a change in another process); runs until cancelled."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                if await self._db.read(db_templates.revision) != self.revision:
                    await self.refresh()
            except Exception:  # a locked or unreachable database must not end the watch
                log.exception("template catalog refresh failed")

    # -- reading (no I/O) ----------------------------------------------------------------------

    def all(self) -> list[TemplateInfo]:
        return [e.template for e in self._entries.values()]

    def customer_facing(self, language: str | None = None) -> list[TemplateInfo]:
        """Templates a customer may pick: not internal, and in ``language`` when given."""
        return [t for t in self.all() if not t.internal and (language is None or t.language == language)]

    def get(self, name: str) -> TemplateInfo:
        """The published template ``name``; raises TemplateNotFound listing the customer-facing ones."""
        entry = self._entries.get(name)
        if entry is None:
            raise TemplateNotFound(name, [t.name for t in self.customer_facing()])
        return entry.template

    def prefix_ids(self, name: str) -> tuple[int, ...]:
        return self._entries[name].prefix_ids
