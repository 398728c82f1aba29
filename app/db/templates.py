"""Template queries: the published catalog, listings, immutable versions, publish and roll back.

A template's versions are never changed: saving adds version n+1, publishing picks which version
the chat uses, and a live split (``start_split``) offers a candidate version to a share of new
conversations until it is promoted or ended. Every change bumps the ``templates`` revision (other processes poll it to refresh
their catalog) and is audited in the same transaction. Size rules need the tokenizer, so changes
take a ``check_fits(name, chain)`` that raises when a template would not fit the context.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app import template_files
from app.db import audit
from app.db.models import Message, Revision, Template, TemplateVersion, utcnow
from app.db.rows import Change, TemplateDetail, TemplateInfo, TemplateListing, VersionRow

MAX_NAME_CHARS = 100
REVISION = "templates"
MIN_SPLIT_SHARE, MAX_SPLIT_SHARE = 0.01, 0.99

CheckFits = Callable[[str, tuple[str, ...]], object]


class TemplateAdminError(ValueError):
    """A template change was refused; nothing was written. The message says what to do."""


class UnknownTemplate(TemplateAdminError, LookupError):
    pass


class UnknownVersion(TemplateAdminError):
    pass


class TemplateExists(TemplateAdminError):
    pass


class ParentHasChildren(TemplateAdminError):
    def __init__(self, name: str, children: list[str]):
        super().__init__(f"{name!r} is the parent of {', '.join(map(repr, children))}; delete or re-create those first.")
        self.name, self.children = name, tuple(children)  # the console says it in its own language


class PresentationRefused(TemplateAdminError):
    def __init__(self, refused: template_files.PresentationError):
        super().__init__(str(refused)[:1].upper() + str(refused)[1:])
        self.code, self.params = refused.code, refused.params  # the console says it in its own language


class StaleVersion(TemplateAdminError):
    def __init__(self, name: str, base_version: int, latest_version: int):
        super().__init__(
            f"Conflict: you edited {name!r} from version {base_version}, but version {latest_version} was saved "
            f"since. Nothing was overwritten; reload version {latest_version}, apply your change again, and save."
        )
        self.name, self.base_version, self.latest_version = name, base_version, latest_version


# -- reading ---------------------------------------------------------------------------------------


def revision(s: Session) -> int:
    """The templates' revision: it changes with every template change, in any process."""
    return s.scalar(select(Revision.value).where(Revision.name == REVISION)) or 0


def published(s: Session) -> list[TemplateInfo]:
    """Every live template with a published version, in creation order."""
    rows = s.scalars(
        select(Template)
        .where(Template.deleted_at.is_(None), Template.published_version_id.is_not(None))
        .order_by(Template.id)
    ).all()
    return [_info(t) for t in rows]


def candidates(s: Session) -> list[TemplateInfo]:
    """The candidate version of every live split, as the chat uses it (``version_id`` is the candidate's)."""
    rows = s.scalars(
        select(Template)
        .where(Template.deleted_at.is_(None), Template.published_version_id.is_not(None),
               Template.candidate_version_id.is_not(None))
        .order_by(Template.id)
    ).all()
    return [_info(t, _by_id(t, t.candidate_version_id)) for t in rows]


def version_info(s: Session, *, template_id: int, version_id: int) -> TemplateInfo | None:
    """Version ``version_id`` of the live, published template ``template_id`` as the chat uses it (ancestors
    at their published texts); None when the template or version is gone."""
    t = s.get(Template, template_id)
    if t is None or t.deleted_at is not None or t.published_version is None:
        return None
    version = next((v for v in t.versions if v.id == version_id), None)
    return None if version is None else _info(t, version)


def listing(s: Session) -> list[TemplateListing]:
    """Every live template with its current chain and its usage over the stored answers."""
    usage = {
        template_id: (n, int(prompt or 0), int(cached or 0), last)
        for template_id, n, prompt, cached, last in s.execute(
            select(TemplateVersion.template_id, func.count(Message.id), func.sum(Message.prompt_tokens),
                   func.sum(Message.num_cached_tokens), func.max(Message.created_at))
            .join(TemplateVersion, Message.template_version_id == TemplateVersion.id)
            .where(Message.role == "assistant", Message.prompt_tokens.is_not(None))
            .group_by(TemplateVersion.template_id)
        ).all()
    }
    out = []
    for t in _live(s):
        n, prompt, cached, last = usage.get(t.id, (0, 0, 0, None))
        out.append(TemplateListing(
            name=t.name, parent=t.parent.name if t.parent else "", language=t.language, pinned=t.pinned,
            internal=t.internal, published_version=t.published_version.number if t.published_version else None,
            latest_version=t.versions[-1].number, chain=_chain(t, _current(t).text), num_answers=n,
            prompt_tokens=prompt, num_cached_tokens=cached, last_used=last,
        ))
    return out


def detail(s: Session, *, name: str) -> TemplateDetail:
    """One template with all its versions; raises UnknownTemplate."""
    t = _get(s, name)
    return TemplateDetail(
        name=t.name, parent=t.parent.name if t.parent else "", language=t.language, pinned=t.pinned,
        internal=t.internal, published_version=t.published_version.number if t.published_version else None,
        versions=tuple(VersionRow(v.number, v.created_by, v.created_at, v.text) for v in t.versions),
        title=t.title, examples=_examples(t),
    )


def chain_for(s: Session, *, name: str, text: str | None = None, version: int | None = None) -> tuple[str, ...]:
    """The texts the chat would join for ``name`` with ``text`` (or ``version``, or the current one)."""
    t = _get(s, name)
    if text is None:
        text = _version(t, version).text if version is not None else _current(t).text
    return _chain(t, text)


def parent_chain(s: Session, *, parent: str) -> tuple[str, ...]:
    """The ancestor texts a new child of ``parent`` would start with (empty for no parent)."""
    return chain_for(s, name=parent) if parent else ()


def version_chains(s: Session, *, name: str, versions: Sequence[int]) -> dict[int, tuple[str, tuple[str, ...]]]:
    """For each of ``versions``: its own text and the chain it renders; raises UnknownVersion."""
    t = _get(s, name)
    return {v: (_version(t, v).text, _chain(t, _version(t, v).text)) for v in versions}


def export_files(s: Session) -> list[tuple[str, str]]:
    """``(file name, content)`` in the templates/ format for every live template, current versions."""
    out = []
    for t in _live(s):
        f = template_files.TemplateFile(name=t.name, text=_current(t).text, parent=t.parent.name if t.parent else "",
                                        language=t.language, pinned=t.pinned, internal=t.internal, title=t.title,
                                        examples=_examples(t))
        out.append((_file_name(t.name), template_files.render(f)))
    return out


# -- changing --------------------------------------------------------------------------------------


def seed(s: Session, files: Sequence[template_files.TemplateFile]) -> int:
    """Load template files (parents first) into an empty database; returns how many were added."""
    if s.scalar(select(func.count(Template.id))):
        return 0
    by_name: dict[str, Template] = {}
    for f in files:
        template = Template(name=f.name, language=f.language, pinned=f.pinned, internal=f.internal,
                            parent=by_name.get(f.parent), title=f.title, examples="\n".join(f.examples))
        version = TemplateVersion(template=template, number=1, text=f.text, created_by="seed")
        s.add_all([template, version])
        s.flush()
        template.published_version_id = version.id
        by_name[f.name] = template
    _bump(s)
    return len(by_name)


def create(s: Session, *, name: str, text: str, user: str, check_fits: CheckFits, parent: str = "",
           language: str = "zh", internal: bool = False) -> Change:
    """Add a template with version 1 (not yet published); raises TemplateExists, UnknownTemplate, or
    what ``check_fits`` raises."""
    name, text = name.strip(), text.strip()
    if not name or not text:
        raise TemplateAdminError("A template needs a name and a text.")
    if len(name) > MAX_NAME_CHARS:
        raise TemplateAdminError(f"A template name may have at most {MAX_NAME_CHARS} characters; this one has "
                                 f"{len(name):,}. Choose a shorter name.")
    if language not in ("zh", "en"):
        raise TemplateAdminError(f"The language must be zh or en, not {language!r}.")
    existing = s.scalar(select(Template).where(Template.name == name))
    if existing is not None:
        deleted = " (a deleted template keeps its name and history)" if existing.deleted_at else ""
        raise TemplateExists(f"A template named {name!r} already exists{deleted}; choose another name.")
    parent_row = _get(s, parent) if parent else None
    check_fits(name, (_chain(parent_row, _current(parent_row).text) if parent_row else ()) + (text,))
    t = Template(name=name, language=language, parent=parent_row, pinned=False, internal=internal)
    s.add_all([t, TemplateVersion(template=t, number=1, text=text, created_by=user)])
    audit.record(s, user=user, action="create", target=name, field="latest version", after=1)
    _bump(s)
    return Change(name, "create", None, 1)


def save_version(s: Session, *, name: str, text: str, base_version: int, user: str, check_fits: CheckFits) -> Change:
    """Save ``text`` as the next version; the editor passes the version it started from.

    Raises StaleVersion when another version was saved since ``base_version`` (nothing is
    overwritten), or what ``check_fits`` raises for this template or one inheriting it.
    """
    text = text.strip()
    if not text:
        raise TemplateAdminError("The text is empty; a template needs some instructions.")
    t = _get(s, name)
    latest = t.versions[-1].number
    if base_version != latest:
        raise StaleVersion(name, base_version, latest)
    if text == t.versions[-1].text:
        raise TemplateAdminError(f"Version {latest} of {name!r} already has this text; nothing to save.")
    _check_tree_fits(s, check_fits, t, text)
    s.add(TemplateVersion(template=t, number=latest + 1, text=text, created_by=user))
    try:
        s.flush()
    except IntegrityError:  # another save took number latest + 1 between our read and write
        raise StaleVersion(name, base_version, latest + 1) from None
    audit.record(s, user=user, action="save", target=name, field="latest version", before=latest, after=latest + 1)
    _bump(s)
    return Change(name, "save", latest, latest + 1)


def publish(s: Session, *, name: str, version: int, user: str, check_fits: CheckFits) -> Change:
    """Make ``version`` the one the chat uses ("rollback" when it is older than the published one)."""
    t = _get(s, name)
    chosen = _version(t, version)
    before = t.published_version.number if t.published_version else None
    _check_tree_fits(s, check_fits, t, chosen.text)
    action = "rollback" if before is not None and version < before else "publish"
    t.published_version_id = chosen.id
    if t.candidate_version_id == chosen.id:  # publishing the candidate to everyone ends its split
        t.candidate_version_id, t.candidate_share, t.candidate_since = None, 0.0, None
    audit.record(s, user=user, action=action, target=name, field="published version", before=before, after=version)
    _bump(s)
    return Change(name, action, before, version)


def delete(s: Session, *, name: str, user: str) -> Change:
    """Soft-delete: the chat stops offering it, its versions and answers stay. Raises ParentHasChildren."""
    t = _get(s, name)
    children = [c.name for c in _live(s) if c.parent_id == t.id]
    if children:
        raise ParentHasChildren(name, children)
    before = t.published_version.number if t.published_version else None
    t.deleted_at = utcnow()
    t.candidate_version_id, t.candidate_share, t.candidate_since = None, 0.0, None
    audit.record(s, user=user, action="delete", target=name, field="published version", before=before, after=None)
    _bump(s)
    return Change(name, "delete", before, None)


def set_flag(s: Session, *, name: str, flag: str, value: bool, user: str) -> Change:
    """Set ``pinned`` (kept warm) or ``internal`` (never offered to customers)."""
    if flag not in ("pinned", "internal"):
        raise ValueError(f"unknown template flag {flag!r}")
    t = _get(s, name)
    before = getattr(t, flag)
    setattr(t, flag, value)
    action = {("pinned", True): "pin", ("pinned", False): "unpin",
              ("internal", True): "mark internal", ("internal", False): "offer to customers"}[flag, value]
    audit.record(s, user=user, action=action, target=name, field=flag, before=_yes_no(before), after=_yes_no(value))
    _bump(s)
    version = t.published_version.number if t.published_version else None
    return Change(name, action, version, version)


def set_presentation(s: Session, *, name: str, title: str, examples: Sequence[str], user: str) -> Change:
    """Set what customers see of ``name``: its title in the topic picker ("" shows the name) and the questions
    an empty chat suggests. Raises TemplateAdminError saying what to change (template_files.check_presentation)."""
    t = _get(s, name)
    try:
        title, questions = template_files.check_presentation(title, tuple(examples))
    except template_files.PresentationError as exc:
        raise PresentationRefused(exc) from None
    before = (t.title, _examples(t))
    if before != (title, questions):
        t.title, t.examples = title, "\n".join(questions)
        audit.record(s, user=user, action="present", target=name, field="title | suggested questions",
                     before=" | ".join((before[0], *before[1])), after=" | ".join((title, *questions)))
        _bump(s)
    version = t.published_version.number if t.published_version else None
    return Change(name, "present", version, version)


def start_split(s: Session, *, name: str, version: int, share: float, user: str, check_fits: CheckFits) -> Change:
    """Offer ``version`` to ``share`` (0.01-0.99) of new conversations beside the published version; a
    running split of ``name`` is replaced. Conversations keep the version they started on."""
    t = _get(s, name)
    if t.published_version is None:
        raise TemplateAdminError(f"Publish a version of {name!r} before splitting it.")
    if isinstance(share, bool) or not isinstance(share, (int, float)) or \
            not MIN_SPLIT_SHARE <= share <= MAX_SPLIT_SHARE:
        raise TemplateAdminError(f"The candidate's share must be between {MIN_SPLIT_SHARE:.0%} and "
                                 f"{MAX_SPLIT_SHARE:.0%} of new conversations.")
    chosen = _version(t, version)
    if chosen.id == t.published_version_id:
        raise TemplateAdminError(f"v{version} is the published version of {name!r}; pick another version as the "
                                 "candidate.")
    check_fits(t.name, _chain(t, chosen.text))
    before = _number(t, t.candidate_version_id)
    before_share = t.candidate_share if t.candidate_version_id else None
    t.candidate_version_id, t.candidate_share = chosen.id, float(share)
    if before != version:
        t.candidate_since = utcnow()  # the arms are compared from the moment this candidate started
    audit.record(s, user=user, action="start split", target=name, field="candidate version", before=before,
                 after=version)
    audit.record(s, user=user, action="start split", target=name, field="candidate share",
                 before=_share(before_share), after=_share(share))
    _bump(s)
    return Change(name, "start split", before, version)


def promote_candidate(s: Session, *, name: str, user: str, check_fits: CheckFits) -> Change:
    """Publish the split's candidate to every new conversation (the split ends)."""
    t = _get(s, name)
    candidate = _number(t, t.candidate_version_id)
    if candidate is None:
        raise TemplateAdminError(f"{name!r} has no live split to promote.")
    change = publish(s, name=name, version=candidate, user=user, check_fits=check_fits)
    audit.record(s, user=user, action="promote candidate", target=name, field="candidate version",
                 before=candidate, after=None)
    return Change(name, "promote candidate", change.before_version, candidate)


def end_split(s: Session, *, name: str, user: str) -> Change:
    """Roll the split back: new conversations all get the published version again."""
    t = _get(s, name)
    candidate = _number(t, t.candidate_version_id)
    if candidate is None:
        raise TemplateAdminError(f"{name!r} has no live split to end.")
    t.candidate_version_id, t.candidate_share, t.candidate_since = None, 0.0, None
    audit.record(s, user=user, action="end split", target=name, field="candidate version", before=candidate,
                 after=None)
    _bump(s)
    published = t.published_version.number if t.published_version else None
    return Change(name, "end split", candidate, published)


def import_files(s: Session, *, files: Sequence[template_files.TemplateFile], user: str,
                 check_fits: CheckFits) -> list[Change]:
    """Create or update templates from template files and publish what changed, in one transaction.

    New names are created; a known name whose text differs gets a new version. Parents must come
    from the same files or already exist.
    """
    names = {f.name for f in files}
    changes = []
    for f in sorted(files, key=lambda f: f.parent in names):  # parents among the files go first
        t = s.scalar(select(Template).where(Template.name == f.name, Template.deleted_at.is_(None)))
        if t is None:
            create(s, name=f.name, text=f.text, user=user, check_fits=check_fits, parent=f.parent,
                   language=f.language, internal=f.internal)
            s.flush()
            version = 1
        elif t.versions[-1].text == f.text.strip():
            continue
        else:
            version = save_version(s, name=f.name, text=f.text, base_version=t.versions[-1].number, user=user,
                                   check_fits=check_fits).after_version
        s.flush()
        change = publish(s, name=f.name, version=version, user=user, check_fits=check_fits)
        if f.pinned:
            set_flag(s, name=f.name, flag="pinned", value=True, user=user)
        changes.append(Change(f.name, "import", change.before_version, version))
    changed = {c.template for c in changes}
    for f in files:  # what customers see, as each file has it (a new text or not)
        t = _get(s, f.name)
        if (t.title, _examples(t)) != (f.title, f.examples):
            change = set_presentation(s, name=f.name, title=f.title, examples=f.examples, user=user)
            if f.name not in changed:
                changes.append(Change(f.name, "import", change.before_version, change.after_version))
    return changes


# -- helpers ---------------------------------------------------------------------------------------


def _bump(s: Session) -> None:
    row = s.get(Revision, REVISION)
    if row is None:
        s.add(Revision(name=REVISION, value=1))
    else:
        row.value += 1


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


def _by_id(t: Template, version_id: int | None) -> TemplateVersion:
    return next(v for v in t.versions if v.id == version_id)


def _number(t: Template, version_id: int | None) -> int | None:
    return None if version_id is None else _by_id(t, version_id).number


def _share(share: float | None) -> str | None:
    return None if share is None else f"{share:.0%}"


def _current(t: Template) -> TemplateVersion:
    """The version the chat uses, or the newest while none is published."""
    return t.published_version or t.versions[-1]


def _chain(t: Template, text: str) -> tuple[str, ...]:
    chain = [text]
    node = t.parent
    while node is not None:
        chain.append(_current(node).text)
        node = node.parent
    return tuple(reversed(chain))


def _info(t: Template, version: TemplateVersion | None = None) -> TemplateInfo:
    """``t`` as the chat uses it at ``version`` (default: the published one)."""
    version = version or t.published_version
    assert version is not None, "published() selects templates with a published version"
    root = t
    while root.parent is not None:
        root = root.parent
    return TemplateInfo(
        id=t.id, name=t.name, language=t.language, parent=t.parent.name if t.parent else "", pinned=t.pinned,
        internal=t.internal, version_id=version.id, version_number=version.number, chain=_chain(t, version.text),
        family=root.name, candidate_version_id=t.candidate_version_id,
        candidate_share=t.candidate_share if t.candidate_version_id else 0.0, title=t.title, examples=_examples(t),
    )


def _examples(t: Template) -> tuple[str, ...]:
    return tuple(q for q in (t.examples or "").split("\n") if q)


def _check_tree_fits(s: Session, check_fits: CheckFits, t: Template, text: str) -> None:
    """``t`` with ``text``, and every live template below it, must leave room for an answer."""
    check_fits(t.name, _chain(t, text))
    live = _live(s)

    def visit(node: Template, chain: tuple[str, ...]) -> None:
        for child in (c for c in live if c.parent_id == node.id):
            child_chain = chain + (_current(child).text,)
            check_fits(child.name, child_chain)
            visit(child, child_chain)

    visit(t, _chain(t, text))


def _yes_no(value: bool) -> str:
    return "yes" if value else "no"


def _file_name(name: str) -> str:
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in name).strip("-")
    return f"{safe or 'template'}.txt"
