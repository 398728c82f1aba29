"""What the database hands out: frozen rows, never ORM objects, so no session leaks past app/db."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from app.db.states import AnswerStatus, Arm, Handoff


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
    # A live split: new conversations get the candidate version with probability candidate_share.
    candidate_version_id: int | None = None
    candidate_share: float = 0.0  # 0-1
    title: str = ""  # the topic's name for customers ("" shows ``name``)
    examples: tuple[str, ...] = ()  # questions an empty chat suggests

    @property
    def shown_name(self) -> str:
        """The topic as customers see it named."""
        return self.title or self.name


@dataclass(frozen=True)
class ConversationState:
    """Who owns a conversation, who answers it, and the template version it stays on."""

    session_key: str
    handoff: Handoff
    template_version_id: int | None  # None for conversations older than the column: the published version


@dataclass(frozen=True)
class TurnIds:
    """The rows ``begin_turn`` wrote: the conversation, the user's message and the answer to fill."""

    conversation_id: int
    user_message_id: int
    answer_id: int | None  # None when a person answers this conversation: no answer row was written
    template_version_id: int | None = None  # the version the turn is answered with
    handoff: Handoff = Handoff.MODEL  # the conversation's hand-off state when the turn was stored


@dataclass(frozen=True)
class MessageRow:
    id: int
    conversation_id: int
    role: str
    text: str
    status: AnswerStatus
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
    error_code: str = ""  # why an answer failed, for the customer's own words (app/core/refusals.py)
    # In a customer's copy (app/core/cache_figures.py): the answer's own template version's prefix in whole KV
    # blocks, which the caption's reuse is a share of; None in the stored row.
    shared_tokens: int | None = None

    @property
    def cut_off(self) -> bool:
        """The answer ended at its token budget, not where the model meant to stop."""
        return self.status == AnswerStatus.OK and self.finish_reason == "length"


@dataclass(frozen=True)
class ConversationHeader:
    """Who owns a conversation, and what it runs on."""

    session_key: str
    template: str
    tenant: str


@dataclass(frozen=True)
class ConversationRow:
    id: int
    title: str
    template: str
    created_at: datetime
    num_messages: int
    handoff: Handoff = Handoff.MODEL
    template_version_id: int | None = None


@dataclass(frozen=True)
class AnswerResult:
    text: str
    status: AnswerStatus  # OK, STOPPED or ERROR
    error: str | None = None
    prompt_tokens: int | None = None
    num_cached_tokens: int | None = None
    ttft_ms: float | None = None
    output_tokens: int | None = None
    decode_tokens_per_s: float | None = None
    replica: str | None = None
    finish_reason: str | None = None
    error_code: str = ""


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
    title: str = ""
    examples: tuple[str, ...] = ()

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
    customer_hit_rate: float | None = None  # over customers' answers of the last minute; None: there were none


@dataclass(frozen=True)
class HitRate:
    """Cached over prompt tokens of customers' stored answers (demo, A/B and warmups are never stored)."""

    num_answers: int
    prompt_tokens: int
    num_cached_tokens: int

    @property
    def hit_rate(self) -> float | None:
        return self.num_cached_tokens / self.prompt_tokens if self.prompt_tokens else None


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
class AdminSessionRow:
    operator: str
    created_at: datetime
    expires_at: datetime


# -- the operator's review (app/db/review.py) ------------------------------------------------------------


@dataclass(frozen=True)
class ReviewFilter:
    """Which conversations an operator looks at; empty fields match everything."""

    text: str = ""  # in a message or the title
    template: str = ""
    version: int | None = None  # the template version the conversation is on
    rating: str = ""  # "up", "down" (an answer rated so), "unrated"
    status: str = ""  # "ok", "stopped", "error" (an answer ended so), "waiting", "person" (the hand-off)
    tenant: str | None = None  # None: every tenant; "" conversations without one


@dataclass(frozen=True)
class ReviewRow:
    """One conversation in the operator's list."""

    id: int
    created_at: datetime
    last_at: datetime  # its newest message
    title: str
    template: str
    version: int | None  # the version number it is on; None before versions were kept per conversation
    tenant: str
    handoff: str  # "", "waiting", "person"
    handoff_requested_at: datetime | None
    handoff_operator: str
    num_messages: int
    status: str  # its answers' worst end: "error", "stopped", "generating", "ok"; "" before the first answer
    ups: int
    downs: int
    deleted: bool  # the customer took it off their list


@dataclass(frozen=True)
class ReviewPage:
    rows: tuple[ReviewRow, ...]
    total: int  # conversations matching the filter
    page: int  # from 1
    page_size: int

    @property
    def num_pages(self) -> int:
        return max(1, -(-self.total // self.page_size))


@dataclass(frozen=True)
class PersonQueue:
    """The customers waiting for a person: how many, the longest waiting (oldest request first, with when each
    asked) and the ids of the latest to ask (newest first), by which a console tells a new one."""

    total: int
    oldest: tuple[tuple[int, datetime], ...]  # (conversation id, handoff requested at, UTC)
    newest_ids: tuple[int, ...]


@dataclass(frozen=True)
class Transcript:
    conversation: ReviewRow
    messages: tuple[MessageRow, ...]  # as the customer saw them (answers replaced by a retry left out)


@dataclass(frozen=True)
class VersionStats:
    """How a template version's answers went, as customers felt them (model answers only)."""

    number: int
    version_id: int
    published: bool
    candidate: bool
    num_conversations: int
    num_answers: int
    ups: int
    downs: int
    stopped: int
    errors: int
    first_visible_p50_ms: float | None  # Enter to the first glyph on the customer's screen
    ttft_p50_ms: float | None  # the engine's first token
    prompt_tokens: int
    num_cached_tokens: int

    @property
    def num_rated(self) -> int:
        return self.ups + self.downs

    @property
    def up_share(self) -> float | None:
        return self.ups / self.num_rated if self.num_rated else None

    @property
    def cached_share(self) -> float | None:
        return self.num_cached_tokens / self.prompt_tokens if self.prompt_tokens else None


@dataclass(frozen=True)
class SplitView:
    """A template's live split, if any, and its versions judged side by side."""

    template: str
    published: int | None
    candidate: int | None
    share: float  # of new conversations the candidate gets
    since: datetime | None  # when the split started; its arms count conversations from then on
    versions: tuple[VersionStats, ...]  # every version, newest first, over all their answers
    arms: tuple[VersionStats, ...]  # published then candidate, over conversations since the split began


@dataclass(frozen=True)
class RatingCount:
    """Stored thumbs of one template version's answers, one way (up or down)."""

    template: str
    version: int
    thumbs: int  # +1 or -1
    count: int


@dataclass(frozen=True)
class SplitArm:
    """One arm of a live split: conversations started on its version since the split began."""

    template: str
    version: int
    candidate: bool  # the candidate arm (else the published one)
    share: float  # of new conversations this arm gets
    num_conversations: int

    @property
    def arm(self) -> Arm:
        return Arm.CANDIDATE if self.candidate else Arm.PUBLISHED


@dataclass(frozen=True)
class StoredFigures:
    """What /metrics reads from the database when it is scraped (app/db/metrics.py's ``scrape_figures``)."""

    person_waiting: int  # conversations waiting for a person
    person_answering: int  # conversations a person holds
    oldest_wait_s: float  # seconds the longest-waiting of them has waited; 0 when none waits
    ratings: tuple[RatingCount, ...]
    splits: tuple[SplitArm, ...]
