"""Template management for the console: listing with usage, immutable versions, publish and roll back.

A template's versions are never changed: saving adds version n+1, and publishing picks which version
the chat uses. Every change is checked against the context (prefix + max_tokens must fit
max_model_len) for the template and every template that inherits it, and recorded in the audit log
in the same transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from admin import audit
from app import template_files
from app.models import Message, Template, TemplateVersion, utcnow
from app.prompts import PromptBuilder, common_prefix_len, system_text
from app.store import Store


MAX_NAME_CHARS = 100


class TemplateAdminError(ValueError):
    """A template change was refused; nothing was written. The message says what to do."""


class UnknownTemplate(TemplateAdminError):
    pass


class UnknownVersion(TemplateAdminError):
    pass


class TemplateExists(TemplateAdminError):
    pass


class StaleVersion(TemplateAdminError):
    def __init__(self, name: str, base_version: int, latest_version: int):
        super().__init__(
            f"Conflict: you edited {name!r} from version {base_version}, but version {latest_version} was saved "
            f"since. Nothing was overwritten; reload version {latest_version}, apply your change again, and save."
        )
        self.latest_version = latest_version


class ParentHasChildren(TemplateAdminError):
    pass


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
    num_answers: int
    hit_rate: float | None  # sum(num_cached_tokens) / sum(prompt_tokens) over its answers; None: no answers
    last_used: datetime | None


@dataclass(frozen=True)
class VersionRow:
    number: int
    created_by: str
    created_at: datetime
    text: str


@dataclass(frozen=True)
class TemplateDetail:
    name: str
    parent: str
    language: str
    pinned: bool
    published_version: int | None
    versions: tuple[VersionRow, ...]

    @property
    def latest(self) -> VersionRow:
        return self.versions[-1]


@dataclass(frozen=True)
class Change:
    """What an action did, as the audit log records it."""

    template: str
    action: str
    before_version: int | None
    after_version: int | None


@dataclass(frozen=True)
class VersionDiff:
    text_diff: str  # unified diff of the two versions' own texts
    first_diff_token: int | None  # position in the rendered prefix; None when the prefixes are identical
    num_tokens_a: int
    num_tokens_b: int
    shared_blocks: int  # full KV blocks both prefixes have in common: still warm after the switch
    num_blocks_a: int
    num_blocks_b: int


# -- reading ---------------------------------------------------------------------------------------


def list_templates(*, store: Store, meter: PrefixMeter) -> list[TemplateRow]:
    """Every template that is not deleted, with its size in tokens and blocks and its cache hit rate."""
    with store.session() as s:
        usage = {
            template_id: (cached or 0, prompt or 0, last, n)
            for template_id, cached, prompt, last, n in s.execute(
                select(TemplateVersion.template_id, func.sum(Message.num_cached_tokens),
                       func.sum(Message.prompt_tokens), func.max(Message.created_at), func.count(Message.id))
                .join(TemplateVersion, Message.template_version_id == TemplateVersion.id)
                .where(Message.role == "assistant", Message.prompt_tokens.is_not(None))
                .group_by(TemplateVersion.template_id)
            ).all()
        }
        rows = []
        for t in _live(s):
            chain = _chain(t, _current(t).text)
            n = len(meter.prefix_ids(chain))
            cached, prompt, last, answers = usage.get(t.id, (0, 0, None, 0))
            rows.append(TemplateRow(
                name=t.name, parent=t.parent.name if t.parent else "", language=t.language,
                published_version=t.published_version.number if t.published_version else None,
                latest_version=t.versions[-1].number, num_tokens=n, num_blocks=n // meter.block_size,
                pinned=t.pinned, num_answers=answers, hit_rate=cached / prompt if prompt else None, last_used=last,
            ))
        return rows


def get_template(*, store: Store, name: str) -> TemplateDetail:
    """One template with all its versions; raises UnknownTemplate."""
    with store.session() as s:
        t = _get(s, name)
        return TemplateDetail(
            name=t.name, parent=t.parent.name if t.parent else "", language=t.language, pinned=t.pinned,
            published_version=t.published_version.number if t.published_version else None,
            versions=tuple(VersionRow(v.number, v.created_by, v.created_at, v.text) for v in t.versions),
        )


def chain_for(*, store: Store, name: str, text: str | None = None, version: int | None = None) -> tuple[str, ...]:
    """The texts the chat would join for ``name`` with ``text`` (or ``version``, or the current one)."""
    with store.session() as s:
        t = _get(s, name)
        if text is None:
            text = _version(t, version).text if version is not None else _current(t).text
        return _chain(t, text)


def parent_chain(*, store: Store, parent: str) -> tuple[str, ...]:
    """The ancestor texts a new child of ``parent`` would start with (empty for no parent)."""
    return chain_for(store=store, name=parent) if parent else ()


def diff_versions(*, store: Store, meter: PrefixMeter, name: str, version_a: int, version_b: int) -> VersionDiff:
    """How far two versions' rendered prefixes agree, token by token and in whole KV blocks.

    An edit near the end of a long template keeps most blocks shared (warm after publishing);
    an edit at the top shares none.
    """
    import difflib

    detail = get_template(store=store, name=name)
    texts = {v.number: v.text for v in detail.versions}
    for v in (version_a, version_b):
        if v not in texts:
            raise UnknownVersion(f"{name!r} has no version {v}; it has versions 1 to {detail.latest.number}")
    ids_a = meter.prefix_ids(chain_for(store=store, name=name, text=texts[version_a]))
    ids_b = meter.prefix_ids(chain_for(store=store, name=name, text=texts[version_b]))
    common = common_prefix_len(ids_a, ids_b)
    identical = ids_a == ids_b
    text_diff = "".join(difflib.unified_diff(
        texts[version_a].splitlines(keepends=True), texts[version_b].splitlines(keepends=True),
        fromfile=f"{name} v{version_a}", tofile=f"{name} v{version_b}",
    ))
    return VersionDiff(
        text_diff=text_diff, first_diff_token=None if identical else common,
        num_tokens_a=len(ids_a), num_tokens_b=len(ids_b), shared_blocks=common // meter.block_size,
        num_blocks_a=len(ids_a) // meter.block_size, num_blocks_b=len(ids_b) // meter.block_size,
    )


# -- changing --------------------------------------------------------------------------------------


def create_template(*, store: Store, meter: PrefixMeter, name: str, text: str, user: str, parent: str = "",
                    language: str = "zh") -> Change:
    """Add a template with version 1 (not yet published); raises TemplateExists, UnknownTemplate, TemplateTooLong."""
    name, text = name.strip(), text.strip()
    if not name or not text:
        raise TemplateAdminError("A template needs a name and a text.")
    if len(name) > MAX_NAME_CHARS:
        raise TemplateAdminError(
            f"A template name may have at most {MAX_NAME_CHARS} characters; this one has {len(name):,}. "
            "Choose a shorter name."
        )
    with store.session() as s:
        existing = s.scalar(select(Template).where(Template.name == name))
        if existing is not None:
            deleted = " (a deleted template keeps its name and history)" if existing.deleted_at else ""
            raise TemplateExists(f"A template named {name!r} already exists{deleted}; choose another name.")
        parent_row = _get(s, parent) if parent else None
        meter.check_fits(name, (_chain(parent_row, _current(parent_row).text) if parent_row else ()) + (text,))
        t = Template(name=name, language=language, parent=parent_row, pinned=False)
        s.add_all([t, TemplateVersion(template=t, number=1, text=text, created_by=user)])
        audit.record(s, user=user, action="create", target=name, before=None, after=1)
    return Change(name, "create", None, 1)


def save_version(*, store: Store, meter: PrefixMeter, name: str, text: str, base_version: int, user: str) -> Change:
    """Save ``text`` as the next version; the editor passes the version it started from.

    Raises StaleVersion when another version was saved since ``base_version`` (nothing is
    overwritten), and TemplateTooLong when this template or one inheriting it would not fit.
    """
    text = text.strip()
    if not text:
        raise TemplateAdminError("The text is empty; a template needs some instructions.")
    try:
        with store.session() as s:
            t = _get(s, name)
            latest = t.versions[-1].number
            if base_version != latest:
                raise StaleVersion(name, base_version, latest)
            if text == t.versions[-1].text:
                raise TemplateAdminError(f"Version {latest} of {name!r} already has this text; nothing to save.")
            _check_tree_fits(s, meter, t, text)
            s.add(TemplateVersion(template=t, number=latest + 1, text=text, created_by=user))
            audit.record(s, user=user, action="save", target=name, before=latest, after=latest + 1)
    except IntegrityError:  # another save took number latest + 1 between our read and write
        raise StaleVersion(name, base_version, base_version + 1) from None
    return Change(name, "save", latest, latest + 1)


def publish(*, store: Store, meter: PrefixMeter, name: str, version: int, user: str) -> Change:
    """Make ``version`` the one the chat uses ("rollback" when it is older than the published one)."""
    with store.session() as s:
        t = _get(s, name)
        chosen = _version(t, version)
        before = t.published_version.number if t.published_version else None
        _check_tree_fits(s, meter, t, chosen.text)
        action = "rollback" if before is not None and version < before else "publish"
        t.published_version_id = chosen.id
        audit.record(s, user=user, action=action, target=name, before=before, after=version)
    return Change(name, action, before, version)


def delete_template(*, store: Store, name: str, user: str) -> Change:
    """Soft-delete: the chat stops offering it, its versions and answers stay. Raises ParentHasChildren."""
    with store.session() as s:
        t = _get(s, name)
        children = [c.name for c in _live(s) if c.parent_id == t.id]
        if children:
            raise ParentHasChildren(
                f"{name!r} is the parent of {', '.join(map(repr, children))}; delete or re-create those first."
            )
        before = t.published_version.number if t.published_version else None
        t.deleted_at = utcnow()
        audit.record(s, user=user, action="delete", target=name, before=before, after=None)
    return Change(name, "delete", before, None)


def set_pinned(*, store: Store, name: str, pinned: bool, user: str) -> Change:
    with store.session() as s:
        t = _get(s, name)
        t.pinned = pinned
        version = t.published_version.number if t.published_version else None
        audit.record(s, user=user, action="pin" if pinned else "unpin", target=name, before=version, after=version)
    return Change(name, "pin" if pinned else "unpin", version, version)


# -- files -----------------------------------------------------------------------------------------


def export_files(*, store: Store) -> list[tuple[str, str]]:
    """``(file name, content)`` in the templates/ format for every live template, current versions."""
    out = []
    with store.session() as s:
        for t in _live(s):
            f = template_files.TemplateFile(name=t.name, text=_current(t).text,
                                            parent=t.parent.name if t.parent else "", language=t.language,
                                            pinned=t.pinned)
            out.append((_file_name(t.name), template_files.render(f)))
    return out


def import_files(*, store: Store, meter: PrefixMeter, contents: list[tuple[str, str]], user: str) -> list[Change]:
    """Create or update templates from template files and publish what changed.

    New names are created; a known name whose text differs gets a new version. Parents must come
    from the same files or already exist. Raises template_files.TemplateFileError for a bad file.
    """
    files = [template_files.parse(content, source=source) for source, content in contents]
    names = {f.name for f in files}
    ordered = sorted(files, key=lambda f: f.parent in names)  # parents among the files go first
    changes = []
    for f in ordered:
        try:
            detail = get_template(store=store, name=f.name)
        except UnknownTemplate:
            create_template(store=store, meter=meter, name=f.name, text=f.text, user=user, parent=f.parent,
                            language=f.language)
            version = 1
        else:
            if detail.latest.text == f.text:
                continue
            version = save_version(store=store, meter=meter, name=f.name, text=f.text,
                                   base_version=detail.latest.number, user=user).after_version
        change = publish(store=store, meter=meter, name=f.name, version=version, user=user)
        if f.pinned:
            set_pinned(store=store, name=f.name, pinned=True, user=user)
        changes.append(Change(f.name, "import", change.before_version, version))
    return changes


# -- helpers ---------------------------------------------------------------------------------------


def _live(s: Session) -> list[Template]:
    return list(s.scalars(select(Template).where(Template.deleted_at.is_(None)).order_by(Template.id)).all())


def _get(s: Session, name: str) -> Template:
    t = s.scalar(select(Template).where(Template.name == name, Template.deleted_at.is_(None)))
    if t is None:
        shown = ", ".join(repr(x.name) for x in _live(s)) or "none"
        raise UnknownTemplate(f"There is no template named {name!r}; the templates are: {shown}.")
    return t


def _version(t: Template, number: int) -> TemplateVersion:
    for v in t.versions:
        if v.number == number:
            return v
    raise UnknownVersion(f"{t.name!r} has no version {number}; it has versions 1 to {t.versions[-1].number}.")


def _current(t: Template) -> TemplateVersion:
    """The version the chat uses, or the newest while none is published (as app.store does)."""
    return t.published_version or t.versions[-1]


def _chain(t: Template, text: str) -> tuple[str, ...]:
    chain = [text]
    node = t.parent
    while node is not None:
        chain.append(_current(node).text)
        node = node.parent
    return tuple(reversed(chain))


def _check_tree_fits(s: Session, meter: PrefixMeter, t: Template, text: str) -> None:
    """``t`` with ``text``, and every live template below it, must leave room for an answer."""
    meter.check_fits(t.name, _chain(t, text))
    live = _live(s)

    def visit(node: Template, chain: tuple[str, ...]) -> None:
        for child in (c for c in live if c.parent_id == node.id):
            child_chain = chain + (_current(child).text,)
            meter.check_fits(child.name, child_chain)
            visit(child, child_chain)

    visit(t, _chain(t, text))


def _file_name(name: str) -> str:
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in name).strip("-")
    return f"{safe or 'template'}.txt"
