"""The published templates, held in memory: no request queries the database for its template.

The catalog loads every published template with its prefix token ids at start-up, and the candidate
version of every live split beside it (warmed like the published one). A conversation stays on the
version it started with: ``version`` finds any other version such a conversation needs, once, and
keeps the latest few. A change made in this process refreshes the catalog at once (``refresh``); a
change made by another web process on the same database bumps the ``templates`` revision, which
``watch`` polls every few seconds.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from app.core.prompts import PromptBuilder, system_text
from app.core.refusals import Refused
from app.db import Database
from app.db import templates as db_templates
from app.db.rows import TemplateInfo

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 2.0
MAX_OTHER_VERSIONS = 64  # versions neither published nor a candidate that conversations still use


class TemplateNotFound(Refused, LookupError):
    def __init__(self, name: str, available: Sequence[str]):
        super().__init__(self._refuse("no_template", {"name": name, "shown": ", ".join(available) or "none"}))
        self.name = name


@dataclass(frozen=True)
class CatalogEntry:
    template: TemplateInfo  # at this entry's version
    prefix_ids: tuple[int, ...]  # the rendered system segment: what every request of it starts with
    candidate: bool = False  # the candidate of a live split, not the published version


def split_version(template: TemplateInfo, conversation_id: int) -> int:
    """The version a new conversation of ``template`` gets: the candidate for ``candidate_share`` of
    conversations, picked from the conversation's id (so the same conversation always lands on the same
    arm), else the published one."""
    if template.candidate_version_id is None or template.candidate_share <= 0:
        return template.version_id
    digest = hashlib.sha256(f"split:{template.id}:{conversation_id}".encode()).digest()
    draw = int.from_bytes(digest[:8], "big") / 2**64
    return template.candidate_version_id if draw < template.candidate_share else template.version_id


class TemplateCatalog:
    def __init__(self, db: Database, prompts: PromptBuilder):
        self._db = db
        self._prompts = prompts
        self._entries: dict[str, CatalogEntry] = {}
        self._candidates: dict[str, CatalogEntry] = {}
        self._others: collections.OrderedDict[int, CatalogEntry] = collections.OrderedDict()
        self.revision = -1

    def load(self) -> None:
        """Read the catalog in the calling thread (start-up, or a thread of ``refresh``)."""
        revision = self._db.run(db_templates.revision)
        templates = self._db.run(db_templates.published)
        candidates = self._db.run(db_templates.candidates)
        entries = {t.name: self._entry(t) for t in templates}
        self._candidates = {t.name: self._entry(t, candidate=True) for t in candidates}
        # A parent's new text changes its children's chains: versions are looked up again after a change.
        self._entries, self._others, self.revision = entries, collections.OrderedDict(), revision

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

    async def version(self, template: TemplateInfo, version_id: int) -> TemplateInfo:
        """``template`` at ``version_id`` (a conversation's own version); the published version when that
        version is gone."""
        entry = self._by_version(template.name, version_id)
        if entry is None:
            info = await self._db.read(db_templates.version_info, template_id=template.id, version_id=version_id)
            if info is None:
                return template
            entry = await asyncio.to_thread(self._entry, info)
            self._others[version_id] = entry
            while len(self._others) > MAX_OTHER_VERSIONS:
                self._others.popitem(last=False)
        return entry.template

    # -- reading (no I/O) ----------------------------------------------------------------------

    def all(self) -> list[TemplateInfo]:
        return [e.template for e in self._entries.values()]

    def entries(self) -> list[CatalogEntry]:
        """Every version the chat starts conversations on: the published ones, then the splits' candidates."""
        return [*self._entries.values(), *self._candidates.values()]

    def customer_facing(self, language: str | None = None) -> list[TemplateInfo]:
        """Templates a customer may pick: not internal, and in ``language`` when given."""
        return [t for t in self.all() if not t.internal and (language is None or t.language == language)]

    def get(self, name: str) -> TemplateInfo:
        """The published template ``name``; raises TemplateNotFound listing the customer-facing ones."""
        entry = self._entries.get(name)
        if entry is None:
            raise TemplateNotFound(name, [t.name for t in self.customer_facing()])
        return entry.template

    def candidate(self, name: str) -> TemplateInfo | None:
        """The candidate version of ``name``'s live split, if it has one."""
        entry = self._candidates.get(name)
        return entry.template if entry else None

    def prefix_ids(self, name: str, version_id: int | None = None) -> tuple[int, ...]:
        """The prefix token ids of ``name`` at ``version_id`` when that version is held (published, a candidate or
        one a conversation used lately), else of the published version; raises KeyError for no such template."""
        entry = self._by_version(name, version_id) if version_id is not None else None
        return (entry or self._entries[name]).prefix_ids

    def version_number(self, name: str, version_id: int | None) -> int | None:
        """The number of ``name``'s version ``version_id`` if the catalog holds that version, else None."""
        entry = self._by_version(name, version_id) if version_id is not None else None
        return entry.template.version_number if entry else None

    def _by_version(self, name: str, version_id: int) -> CatalogEntry | None:
        for entry in (self._entries.get(name), self._candidates.get(name), self._others.get(version_id)):
            if entry is not None and entry.template.version_id == version_id:
                return entry
        return None

    def _entry(self, t: TemplateInfo, *, candidate: bool = False) -> CatalogEntry:
        return CatalogEntry(t, self._prompts.prefix_ids(system_text(t.chain)), candidate)
