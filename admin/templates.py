"""Template management for the console: the table with sizes and reuse, versions, diff, publish.

The rules and queries live in ``app.db.templates``; this module adds what needs the tokenizer —
sizes in tokens and KV blocks, the fit check, the diff's first differing token — and refreshes the
chat's template catalog after every change. Tokenizing runs on the database's threads or
``asyncio.to_thread``, never on the event loop.
"""

from __future__ import annotations

import asyncio
import difflib
from dataclasses import dataclass
from datetime import datetime

from app.core.catalog import TemplateCatalog
from app.core.prompts import PromptBuilder, common_prefix_len, system_text
from app.db import Database
from app.db import review as db_review
from app.db import templates as db_templates
from app.db.rows import Change, SplitView, TemplateDetail
from app.db.templates import TemplateAdminError
from app.template_files import TemplateFile, parse


class TemplateTooLong(TemplateAdminError):
    def __init__(self, name: str, num_tokens: int, max_tokens: int, max_model_len: int):
        over = num_tokens + max_tokens - max_model_len
        super().__init__(
            f"Template {name!r} would be {num_tokens:,} tokens; with answers of up to {max_tokens:,} tokens that is "
            f"{num_tokens + max_tokens:,} > max_model_len {max_model_len:,}. Shorten it by at least {over:,} tokens, "
            "or raise PREFIXDESK_MAX_MODEL_LEN (or lower PREFIXDESK_MAX_TOKENS)."
        )
        self.num_tokens = num_tokens


@dataclass(frozen=True)
class PrefixMeter:
    """Measures prefixes the way the chat sends them: the rendered system segment, in KV blocks."""

    prompts: PromptBuilder
    block_size: int
    max_model_len: int
    max_tokens: int

    def prefix_ids(self, chain: tuple[str, ...]) -> tuple[int, ...]:
        return self.prompts.prefix_ids(system_text(chain))

    def check_fits(self, name: str, chain: tuple[str, ...]) -> int:
        """The prefix's token count; raises TemplateTooLong when it leaves no room for an answer."""
        n = len(self.prefix_ids(chain))
        if n + self.max_tokens > self.max_model_len:
            raise TemplateTooLong(name, n, self.max_tokens, self.max_model_len)
        return n


@dataclass(frozen=True)
class TemplateRow:
    name: str
    parent: str
    language: str
    published_version: int | None
    latest_version: int
    num_tokens: int  # of the published (else latest) rendered prefix, ancestors included
    num_blocks: int  # full KV blocks of that prefix: what the cache can reuse
    pinned: bool
    internal: bool
    num_answers: int
    hit_rate: float | None  # cached / prompt tokens over its answers; None: no answers yet
    last_used: datetime | None


@dataclass(frozen=True)
class VersionDiff:
    text_diff: str  # unified diff of the two versions' own texts
    first_diff_token: int | None  # position in the rendered prefix; None when the prefixes are identical
    num_tokens_a: int
    num_tokens_b: int
    shared_blocks: int  # full KV blocks both prefixes have in common: still warm after the switch
    num_blocks_a: int
    num_blocks_b: int


class Templates:
    """The console's template operations; each change refreshes the chat's catalog before returning."""

    def __init__(self, db: Database, meter: PrefixMeter, catalog: TemplateCatalog):
        self.db, self.meter, self.catalog = db, meter, catalog

    async def rows(self) -> list[TemplateRow]:
        listings = await self.db.read(db_templates.listing)

        def measure() -> list[TemplateRow]:
            out = []
            for t in listings:
                n = len(self.meter.prefix_ids(t.chain))
                out.append(TemplateRow(t.name, t.parent, t.language, t.published_version, t.latest_version, n,
                                       n // self.meter.block_size, t.pinned, t.internal, t.num_answers, t.hit_rate,
                                       t.last_used))
            return out

        return await asyncio.to_thread(measure)

    async def names(self) -> list[str]:
        return [t.name for t in await self.db.read(db_templates.listing)]

    async def detail(self, name: str) -> TemplateDetail:
        return await self.db.read(db_templates.detail, name=name)

    async def chain(self, name: str, text: str | None = None) -> tuple[str, ...]:
        return await self.db.read(db_templates.chain_for, name=name, text=text)

    async def parent_chain(self, parent: str) -> tuple[str, ...]:
        return await self.db.read(db_templates.parent_chain, parent=parent)

    async def create(self, *, name: str, text: str, user: str, parent: str = "", language: str = "zh",
                     internal: bool = False) -> Change:
        return await self._change(db_templates.create, name=name, text=text, user=user, parent=parent,
                                  language=language, internal=internal, check_fits=self.meter.check_fits)

    async def save(self, *, name: str, text: str, base_version: int, user: str) -> Change:
        return await self._change(db_templates.save_version, name=name, text=text, base_version=base_version,
                                  user=user, check_fits=self.meter.check_fits)

    async def publish(self, *, name: str, version: int, user: str) -> Change:
        return await self._change(db_templates.publish, name=name, version=version, user=user,
                                  check_fits=self.meter.check_fits)

    async def start_split(self, *, name: str, version: int, share: float, user: str) -> Change:
        return await self._change(db_templates.start_split, name=name, version=version, share=share, user=user,
                                  check_fits=self.meter.check_fits)

    async def promote(self, *, name: str, user: str) -> Change:
        return await self._change(db_templates.promote_candidate, name=name, user=user,
                                  check_fits=self.meter.check_fits)

    async def end_split(self, *, name: str, user: str) -> Change:
        return await self._change(db_templates.end_split, name=name, user=user)

    async def split_view(self, name: str) -> SplitView:
        return await self.db.read(db_review.split_view, template=name)

    async def delete(self, *, name: str, user: str) -> Change:
        return await self._change(db_templates.delete, name=name, user=user)

    async def set_flag(self, *, name: str, flag: str, value: bool, user: str) -> Change:
        return await self._change(db_templates.set_flag, name=name, flag=flag, value=value, user=user)

    async def set_presentation(self, *, name: str, title: str, examples: list[str], user: str) -> Change:
        """What customers see of ``name``: its title and the questions an empty chat suggests."""
        return await self._change(db_templates.set_presentation, name=name, title=title, examples=examples, user=user)

    async def import_files(self, contents: list[tuple[str, str]], *, user: str) -> list[Change]:
        """Create or update templates from template files (name, content) and publish what changed.
        Raises TemplateFileError for a malformed file; nothing is written then."""
        files: list[TemplateFile] = [parse(content, source=source) for source, content in contents]
        return await self._change(db_templates.import_files, files=files, user=user, check_fits=self.meter.check_fits)

    async def export_files(self) -> list[tuple[str, str]]:
        return await self.db.read(db_templates.export_files)

    async def diff(self, *, name: str, version_a: int, version_b: int) -> VersionDiff:
        """How far two versions' rendered prefixes agree, token by token and in whole KV blocks."""
        chains = await self.db.read(db_templates.version_chains, name=name, versions=(version_a, version_b))
        (text_a, chain_a), (text_b, chain_b) = chains[version_a], chains[version_b]
        return await asyncio.to_thread(self._diff, name, version_a, version_b, text_a, chain_a, text_b, chain_b)

    def _diff(self, name, version_a, version_b, text_a, chain_a, text_b, chain_b) -> VersionDiff:
        ids_a, ids_b = self.meter.prefix_ids(chain_a), self.meter.prefix_ids(chain_b)
        common = common_prefix_len(ids_a, ids_b)
        size = self.meter.block_size
        return VersionDiff(text_diff=text_diff(name, version_a, version_b, text_a, text_b),
                           first_diff_token=None if ids_a == ids_b else common,
                           num_tokens_a=len(ids_a), num_tokens_b=len(ids_b), shared_blocks=common // size,
                           num_blocks_a=len(ids_a) // size, num_blocks_b=len(ids_b) // size)

    async def _change(self, fn, **kwargs):
        result = await self.db.write(fn, **kwargs)
        await self.catalog.refresh()
        return result


def text_diff(name: str, version_a: int, version_b: int, text_a: str, text_b: str) -> str:
    """The unified diff of two versions' texts, each of its lines ending in a newline: difflib leaves a version's
    last line without one when its text has none, and joined as it comes that line ran on into the next
    ("-old+new" on one line)."""
    lines = difflib.unified_diff(text_a.splitlines(keepends=True), text_b.splitlines(keepends=True),
                                 fromfile=f"{name} v{version_a}", tofile=f"{name} v{version_b}", lineterm="\n")
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)
