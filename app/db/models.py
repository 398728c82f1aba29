"""The database tables, as SQLAlchemy 2.x typed models. Schema changes go through app/db/migrations."""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import BigInteger, ForeignKey, Index, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


class Base(DeclarativeBase):
    pass


class Template(Base):
    __tablename__ = "templates"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("templates.id"))
    language: Mapped[str] = mapped_column(String(16), default="zh")
    pinned: Mapped[bool] = mapped_column(default=False)
    internal: Mapped[bool] = mapped_column(default=False)  # shared base only: never offered to customers
    # What customers see of it: its name in the topic picker (the template's name when empty), and the
    # questions an empty chat suggests, one per line.
    title: Mapped[str] = mapped_column(String(200), default="")
    examples: Mapped[str] = mapped_column(Text, default="")
    published_version_id: Mapped[int | None] = mapped_column(
        ForeignKey("template_versions.id", use_alter=True, name="fk_templates_published_version")
    )
    # A live split: new conversations get this version with probability candidate_share (0-1), the rest the
    # published one; each conversation stays on the version it started with.
    candidate_version_id: Mapped[int | None] = mapped_column(
        ForeignKey("template_versions.id", use_alter=True, name="fk_templates_candidate_version")
    )
    candidate_share: Mapped[float] = mapped_column(default=0.0)
    candidate_since: Mapped[datetime | None]  # when the split began: its arms are compared from then on
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    deleted_at: Mapped[datetime | None]

    parent: Mapped[Template | None] = relationship(remote_side=[id])
    versions: Mapped[list[TemplateVersion]] = relationship(
        back_populates="template", foreign_keys="TemplateVersion.template_id", order_by="TemplateVersion.number"
    )
    published_version: Mapped[TemplateVersion | None] = relationship(foreign_keys=[published_version_id])


class TemplateVersion(Base):
    """An immutable text of a template; saving creates a new one."""

    __tablename__ = "template_versions"
    __table_args__ = (UniqueConstraint("template_id", "number"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    template_id: Mapped[int] = mapped_column(ForeignKey("templates.id"))
    number: Mapped[int]
    text: Mapped[str] = mapped_column(Text)
    created_by: Mapped[str] = mapped_column(String(100), default="seed")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    template: Mapped[Template] = relationship(back_populates="versions", foreign_keys=[template_id])


class Conversation(Base):
    __tablename__ = "conversations"
    __table_args__ = (Index("ix_conversations_session_key", "session_key"),
                      Index("ix_conversations_template_id", "template_id"),
                      Index("ix_conversations_template_version_id", "template_version_id"),
                      Index("ix_conversations_handoff", "handoff"),
                      Index("ix_conversations_tenant", "tenant"))

    id: Mapped[int] = mapped_column(primary_key=True)
    session_key: Mapped[str] = mapped_column(String(64))
    template_id: Mapped[int] = mapped_column(ForeignKey("templates.id"))
    title: Mapped[str] = mapped_column(String(200), default="")
    tenant: Mapped[str] = mapped_column(String(100), default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # The version it started on (it stays there, also through a live split); None for conversations older
    # than the column, which follow the published version.
    template_version_id: Mapped[int | None] = mapped_column(ForeignKey("template_versions.id"))
    # Who answers: "" the model, "waiting" the customer asked for a person, "person" an operator took it.
    handoff: Mapped[str] = mapped_column(String(16), default="")
    handoff_requested_at: Mapped[datetime | None]
    handoff_operator: Mapped[str] = mapped_column(String(100), default="")
    # The client (address, or an IPv6 /64) that asked for the person: the key of the per-client cap on waiting
    # conversations (app/db/person_queue.py).
    handoff_client: Mapped[str] = mapped_column(String(64), default="")
    deleted_at: Mapped[datetime | None]  # the customer deleted it: gone from their list, kept for the record

    template: Mapped[Template] = relationship()
    messages: Mapped[list[Message]] = relationship(back_populates="conversation", order_by="Message.id")


class Message(Base):
    __tablename__ = "messages"
    __table_args__ = (Index("ix_messages_conversation_id", "conversation_id"),
                      Index("ix_messages_template_version_id", "template_version_id"),
                      Index("ix_messages_finished_at", "finished_at"))

    id: Mapped[int] = mapped_column(primary_key=True)
    conversation_id: Mapped[int] = mapped_column(ForeignKey("conversations.id"))
    role: Mapped[str] = mapped_column(String(16))  # user | assistant
    text: Mapped[str] = mapped_column(Text, default="")
    template_version_id: Mapped[int | None] = mapped_column(ForeignKey("template_versions.id"))
    prompt_tokens: Mapped[int | None]
    num_cached_tokens: Mapped[int | None]
    ttft_ms: Mapped[float | None]
    output_tokens: Mapped[int | None]
    decode_tokens_per_s: Mapped[float | None]
    # user messages: ok. answers: generating -> ok | stopped | error
    status: Mapped[str] = mapped_column(String(16), default="ok")
    error: Mapped[str | None] = mapped_column(Text)
    # Why an answer failed, as a code the chat says in the customer's words (app/core/refusals.py); "" if it did not.
    error_code: Mapped[str] = mapped_column(String(40), default="")
    replica: Mapped[str | None] = mapped_column(String(200))  # the engine replica that answered (remote engine)
    # The model's finish reason: stop, length (cut off at the answer budget) or abort; None for user messages.
    finish_reason: Mapped[str | None] = mapped_column(String(16))
    # "" the model (answers) or the customer (questions); an operator's name when a person wrote it.
    author: Mapped[str] = mapped_column(String(100), default="")
    first_visible_ms: Mapped[float | None]  # Enter to the first glyph on the customer's screen, as the browser measured
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]

    conversation: Mapped[Conversation] = relationship(back_populates="messages")


class Rating(Base):
    """A customer's thumbs up (+1) or down (-1) on one answer, with an optional reason; rating again replaces it."""

    __tablename__ = "ratings"

    id: Mapped[int] = mapped_column(primary_key=True)
    message_id: Mapped[int] = mapped_column(ForeignKey("messages.id"), unique=True)
    conversation_id: Mapped[int] = mapped_column(ForeignKey("conversations.id"), index=True)
    template_version_id: Mapped[int | None] = mapped_column(ForeignKey("template_versions.id"), index=True)
    thumbs: Mapped[int]
    reason: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class Option(Base):
    """A console setting an operator changes at run time (e.g. whether transcripts are shown); audited."""

    __tablename__ = "options"

    name: Mapped[str] = mapped_column(String(50), primary_key=True)
    value: Mapped[str] = mapped_column(Text)
    updated_by: Mapped[str] = mapped_column(String(100), default="")
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class PersonRefusal(Base):
    """How many requests for a person one cap refused in one hour (app/db/person_queue.py): a flood is a count,
    not a row per request."""

    __tablename__ = "person_refusals"

    hour: Mapped[datetime] = mapped_column(primary_key=True)  # the hour's start, UTC
    cap: Mapped[str] = mapped_column(String(16), primary_key=True)  # client | session | total
    count: Mapped[int] = mapped_column(default=0)


class CacheSample(Base):
    """One reading of the cache view, kept so the console's plots survive a restart."""

    __tablename__ = "cache_samples"

    id: Mapped[int] = mapped_column(primary_key=True)
    t: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    recent_hit_rate: Mapped[float]  # vLLM's cached / queried prompt tokens over the last minute (every request)
    customer_hit_rate: Mapped[float | None]  # the same over customers' stored answers; None: none in that minute
    kv_cache_usage: Mapped[float]
    blocks_used: Mapped[int]
    blocks_cached: Mapped[int]
    running: Mapped[int]
    waiting: Mapped[int]
    ttft_hit_ms: Mapped[float | None]
    ttft_miss_ms: Mapped[float | None]
    memory_bytes: Mapped[int] = mapped_column(BigInteger)


class AuditEntry(Base):
    __tablename__ = "audit"

    id: Mapped[int] = mapped_column(primary_key=True)
    t: Mapped[datetime] = mapped_column(default=utcnow)
    user: Mapped[str] = mapped_column(String(100))
    action: Mapped[str] = mapped_column(String(50))
    target: Mapped[str] = mapped_column(String(200))
    field: Mapped[str] = mapped_column(String(50), default="")  # what before and after measure
    before: Mapped[str | None] = mapped_column(Text)
    after: Mapped[str | None] = mapped_column(Text)


class Operator(Base):
    """An account of the admin console; the password is stored only as a salted scrypt hash."""

    __tablename__ = "operators"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    password_hash: Mapped[str] = mapped_column(String(300))
    source: Mapped[str] = mapped_column(String(16), default="cli")  # cli | settings
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    disabled_at: Mapped[datetime | None]


class AdminSession(Base):
    """A console login. The browser holds a random token; only its SHA-256 is stored."""

    __tablename__ = "admin_sessions"

    token_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    operator: Mapped[str] = mapped_column(String(100))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime]
    revoked_at: Mapped[datetime | None]
    client: Mapped[str] = mapped_column(String(100), default="")


class Lease(Base):
    """Which process runs a once-per-deployment loop (the cache sampler, keep-warm) until ``expires_at``."""

    __tablename__ = "leases"

    name: Mapped[str] = mapped_column(String(50), primary_key=True)
    holder: Mapped[str] = mapped_column(String(100))
    expires_at: Mapped[datetime]


class Revision(Base):
    """A counter bumped with every change of a kind (``templates``), so other processes notice it."""

    __tablename__ = "revisions"

    name: Mapped[str] = mapped_column(String(50), primary_key=True)
    value: Mapped[int] = mapped_column(default=0)
