"""The database: opening it (migrations, WAL), seeding templates, and the queries the app runs.

Every write is one transaction. Callers get the project's own frozen dataclasses back, never ORM
objects, so no SQLAlchemy session leaks out of this module.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sqlalchemy import create_engine, event, func, select
from sqlalchemy.engine import Engine as SqlEngine
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from app import template_files
from app.models import Conversation, Message, Template, TemplateVersion, utcnow

MIGRATIONS = Path(__file__).parent / "migrations"


class StoreError(RuntimeError):
    """The database refused a read or write; the message says what to check."""


class TemplateNotFound(LookupError):
    def __init__(self, name: str, available: list[str]):
        shown = ", ".join(available) or "none"
        super().__init__(f"There is no published template named {name!r}. Choose one of: {shown}.")
        self.name = name


class ConversationNotFound(LookupError):
    pass


@dataclass(frozen=True)
class TemplateInfo:
    """A published template as the chat uses it."""

    id: int
    name: str
    language: str
    parent: str
    pinned: bool
    version_id: int
    version_number: int
    chain: tuple[str, ...]  # texts from the root ancestor down to this template


@dataclass(frozen=True)
class MessageRow:
    id: int
    conversation_id: int
    role: str
    text: str
    status: str
    error: str | None
    template_version_id: int | None
    prompt_tokens: int | None
    num_cached_tokens: int | None
    ttft_ms: float | None
    output_tokens: int | None
    decode_tokens_per_s: float | None
    created_at: datetime


@dataclass(frozen=True)
class ConversationRow:
    id: int
    title: str
    template: str
    created_at: datetime
    num_messages: int


@dataclass(frozen=True)
class AnswerResult:
    text: str
    status: str  # ok | stopped | error
    error: str | None = None
    prompt_tokens: int | None = None
    num_cached_tokens: int | None = None
    ttft_ms: float | None = None
    output_tokens: int | None = None
    decode_tokens_per_s: float | None = None


class Store:
    def __init__(self, database_url: str):
        self.url = database_url
        self.engine = _create_engine(database_url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def session(self) -> Iterator[Session]:
        """One transaction: committed on success, rolled back on any error."""
        session = self._sessions()
        try:
            yield session
            session.commit()
        except OperationalError as exc:
            session.rollback()
            raise StoreError(
                f"the database could not be written ({exc.orig}); check that {self.url} is writable "
                "and not locked by another program"
            ) from exc
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    # -- templates ---------------------------------------------------------------------------

    def seed_templates(self, folder: Path) -> int:
        """Load ``folder``'s template files into an empty database; returns how many were added."""
        with self.session() as s:
            if s.scalar(select(func.count(Template.id))):
                return 0
            by_name: dict[str, Template] = {}
            for f in template_files.read_folder(folder):
                template = Template(name=f.name, language=f.language, pinned=f.pinned,
                                    parent=by_name.get(f.parent))
                version = TemplateVersion(template=template, number=1, text=f.text, created_by="seed")
                s.add_all([template, version])
                s.flush()
                template.published_version_id = version.id
                by_name[f.name] = template
            return len(by_name)

    def published_templates(self) -> list[TemplateInfo]:
        with self.session() as s:
            rows = s.scalars(
                select(Template)
                .where(Template.deleted_at.is_(None), Template.published_version_id.is_not(None))
                .order_by(Template.id)
            ).all()
            return [_template_info(t) for t in rows]

    def get_published(self, name: str) -> TemplateInfo:
        """The published template called ``name``; raises TemplateNotFound listing the others."""
        with self.session() as s:
            t = s.scalar(select(Template).where(Template.name == name, Template.deleted_at.is_(None)))
            if t is not None and t.published_version is not None:
                return _template_info(t)
        raise TemplateNotFound(name, [t.name for t in self.published_templates()])

    # -- conversations -----------------------------------------------------------------------

    def conversation_owner(self, conversation_id: int) -> str | None:
        with self.session() as s:
            return s.scalar(select(Conversation.session_key).where(Conversation.id == conversation_id))

    def list_conversations(self, *, session_key: str) -> list[ConversationRow]:
        with self.session() as s:
            rows = s.execute(
                select(Conversation, Template.name, func.count(Message.id))
                .join(Template, Conversation.template_id == Template.id)
                .outerjoin(Message, Message.conversation_id == Conversation.id)
                .where(Conversation.session_key == session_key)
                .group_by(Conversation.id)
                .order_by(Conversation.id.desc())
            ).all()
            return [ConversationRow(c.id, c.title, name, c.created_at, n) for c, name, n in rows]

    def messages(self, *, conversation_id: int) -> list[MessageRow]:
        with self.session() as s:
            rows = s.scalars(
                select(Message).where(Message.conversation_id == conversation_id).order_by(Message.id)
            ).all()
            return [_message_row(m) for m in rows]

    def begin_turn(self, *, session_key: str, conversation_id: int | None, template_id: int,
                   template_version_id: int, text: str, tenant: str = "") -> tuple[int, int]:
        """Store the user's message (and a new conversation if ``conversation_id`` is None) with an
        empty answer row of status ``generating``, in one transaction; returns (conversation, answer) ids."""
        with self.session() as s:
            if conversation_id is None:
                conv = Conversation(session_key=session_key, template_id=template_id, title=text[:60], tenant=tenant)
                s.add(conv)
                s.flush()
                conversation_id = conv.id
            now = utcnow()
            answer = Message(conversation_id=conversation_id, role="assistant", text="", status="generating",
                             template_version_id=template_version_id)
            s.add_all([
                Message(conversation_id=conversation_id, role="user", text=text, status="ok",
                        template_version_id=template_version_id, created_at=now, finished_at=now),
                answer,
            ])
            s.flush()
            return conversation_id, answer.id

    def finish_answer(self, message_id: int, result: AnswerResult) -> MessageRow:
        with self.session() as s:
            m = s.get_one(Message, message_id)
            m.text = result.text
            m.status = result.status
            m.error = result.error
            m.prompt_tokens = result.prompt_tokens
            m.num_cached_tokens = result.num_cached_tokens
            m.ttft_ms = result.ttft_ms
            m.output_tokens = result.output_tokens
            m.decode_tokens_per_s = result.decode_tokens_per_s
            m.finished_at = utcnow()
            s.flush()
            return _message_row(m)

    def get_message(self, message_id: int) -> MessageRow:
        with self.session() as s:
            return _message_row(s.get_one(Message, message_id))

    def close(self) -> None:
        self.engine.dispose()


def open_store(database_url: str) -> Store:
    """Open (creating if needed) the database at ``database_url`` and migrate it to the newest schema."""
    if database_url.startswith("sqlite:///"):
        Path(database_url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    store = Store(database_url)
    migrate(store.engine)
    return store


def migrate(engine: SqlEngine) -> None:
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "head")


def _create_engine(url: str) -> SqlEngine:
    engine = create_engine(url, connect_args={"timeout": 10} if url.startswith("sqlite") else {})
    if url.startswith("sqlite"):

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection, _record):
            cursor = dbapi_connection.cursor()
            # WAL lets the chat read while an answer is being written; foreign keys are off in
            # SQLite unless asked for.
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

    return engine


def _template_info(t: Template) -> TemplateInfo:
    chain: list[str] = []
    node: Template | None = t
    while node is not None:
        version = node.published_version or (node.versions[-1] if node.versions else None)
        chain.append(version.text if version else "")
        node = node.parent
    version = t.published_version
    assert version is not None
    return TemplateInfo(
        id=t.id, name=t.name, language=t.language, parent=t.parent.name if t.parent else "",
        pinned=t.pinned, version_id=version.id, version_number=version.number, chain=tuple(reversed(chain)),
    )


def _message_row(m: Message) -> MessageRow:
    return MessageRow(
        id=m.id, conversation_id=m.conversation_id, role=m.role, text=m.text, status=m.status, error=m.error,
        template_version_id=m.template_version_id, prompt_tokens=m.prompt_tokens,
        num_cached_tokens=m.num_cached_tokens, ttft_ms=m.ttft_ms, output_tokens=m.output_tokens,
        decode_tokens_per_s=m.decode_tokens_per_s, created_at=m.created_at,
    )
