"""What the database hands out: frozen rows, never ORM objects, so no session leaks past app/db."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class TemplateInfo:
    """A published template as the chat uses it."""

    id: int
    name: str
    language: str
    parent: str
    pinned: bool
    internal: bool  # a shared base that is never offered to customers
    version_id: int
    version_number: int
    chain: tuple[str, ...]  # texts from the root ancestor down to this template
    family: str  # the root ancestor's name: parents and children share it (and their KV blocks)


@dataclass(frozen=True)
class TurnIds:
    """The rows ``begin_turn`` wrote: the conversation, the user's message and the answer to fill."""

    conversation_id: int
    user_message_id: int
    answer_id: int


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
    replica: str | None
    created_at: datetime
    finish_reason: str | None = None  # stop, length (cut off at the budget) or abort
    author: str = ""  # "" the model or the customer; the operator's name when a person wrote it
    first_visible_ms: float | None = None  # as the customer's browser measured it
    rating: int | None = None  # the customer's thumbs: +1, -1, or None
    rating_reason: str = ""

    @property
    def cut_off(self) -> bool:
        """The answer ended at its token budget, not where the model meant to stop."""
        return self.status == "ok" and self.finish_reason == "length"


@dataclass(frozen=True)
class ConversationRow:
    id: int
    title: str
    template: str
    created_at: datetime
    num_messages: int
    handoff: str = ""  # "" with the model, "waiting" for a person, "person" with an operator
    template_version_id: int | None = None


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
    replica: str | None = None
    finish_reason: str | None = None


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
    internal: bool
    published_version: int | None
    versions: tuple[VersionRow, ...]

    @property
    def latest(self) -> VersionRow:
        return self.versions[-1]


@dataclass(frozen=True)
class TemplateListing:
    """A live template with the chain its current version renders and its usage over stored answers."""

    name: str
    parent: str
    language: str
    pinned: bool
    internal: bool
    published_version: int | None
    latest_version: int
    chain: tuple[str, ...]
    num_answers: int
    prompt_tokens: int
    num_cached_tokens: int
    last_used: datetime | None

    @property
    def hit_rate(self) -> float | None:
        """Cached / prompt tokens over its stored answers; None before its first answer."""
        return self.num_cached_tokens / self.prompt_tokens if self.prompt_tokens else None


@dataclass(frozen=True)
class Change:
    """What a template action did; ``before``/``after`` are the published (or saved) version numbers."""

    template: str
    action: str
    before_version: int | None
    after_version: int | None


@dataclass(frozen=True)
class AuditRow:
    t: datetime
    user: str
    action: str
    target: str
    field: str  # what before and after measure, e.g. "published version"
    before: str | None
    after: str | None


@dataclass(frozen=True)
class SampleRow:
    t: datetime
    recent_hit_rate: float
    kv_cache_usage: float
    blocks_used: int
    blocks_cached: int
    running: int
    waiting: int
    ttft_hit_ms: float | None
    ttft_miss_ms: float | None
    memory_bytes: int


@dataclass(frozen=True)
class TtftSplit:
    hit_p50_ms: float | None
    miss_p50_ms: float | None
    num_hits: int
    num_misses: int


@dataclass(frozen=True)
class OperatorRow:
    name: str
    source: str
    created_at: datetime
    disabled: bool


@dataclass(frozen=True)
class ConsoleSession:
    operator: str
    created_at: datetime
    expires_at: datetime
