"""Conversations and messages: a turn is written before generation and its answer row finished after.

``begin_turn`` stores the user's message and an empty answer row (status ``generating``) in one
transaction, so the question is kept even if the answer never comes; ``finish_answer`` ends that
row as ok, stopped or error with its stats.

A conversation is answered by the model until its customer asks for a person (``request_person``:
handoff "waiting"); an operator then takes it (``take``: "person"), writes replies that are stored as
answers with the operator as author (``person_reply``), and hands it back (``release``). While a
person answers, ``begin_turn`` stores the customer's message alone (no answer row for the model to
fill), and the chat polls ``messages_after`` for the person's replies. Operators' actions are
audited in the same transaction. Every function that a customer's request reaches takes the
customer's ``session_key`` and acts only on conversations it owns.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.db import audit, person_queue
from app.db.models import Conversation, Message, Rating, Template, utcnow
from app.db.person_queue import PersonCaps
from app.db.rows import AnswerResult, ConversationHeader, ConversationRow, ConversationState, MessageRow, TurnIds
from app.db.states import AnswerStatus, Handoff

TITLE_CHARS = 60
MAX_REASON_CHARS = 500
HANDOFF_STATES = tuple(Handoff)
MAX_POLL_MESSAGES = 50
STALE_GENERATING = timedelta(minutes=10)  # longer than any answer streams


class NotYours(LookupError):
    """The conversation or message does not exist, or belongs to another browser (the same answer for both)."""

    def __init__(self) -> None:
        super().__init__("That conversation does not exist here; please start a new one.")


class HandoffError(ValueError):
    """A hand-off step that does not fit the conversation's state; the message says what it is."""


class WithPerson(LookupError):
    """The conversation is answered by a person (``handoff`` "waiting" or "person"), not by the model;
    ``message_id`` is its last question."""

    def __init__(self, handoff: str, message_id: int) -> None:
        super().__init__("a person answers this conversation")
        self.handoff, self.message_id = handoff, message_id


def owner(s: Session, *, conversation_id: int) -> str | None:
    """The session key that owns the conversation, or None when it does not exist."""
    return s.scalar(select(Conversation.session_key).where(Conversation.id == conversation_id))


def header(s: Session, *, conversation_id: int) -> ConversationHeader | None:
    """The conversation's owner, template name and tenant, or None when it does not exist."""
    row = s.execute(select(Conversation.session_key, Template.name, Conversation.tenant)
                    .join(Template, Conversation.template_id == Template.id)
                    .where(Conversation.id == conversation_id)).first()
    return None if row is None else ConversationHeader(*row)


def list_for(s: Session, *, session_key: str, limit: int = 50) -> list[ConversationRow]:
    """The newest ``limit`` conversations of one browser, newest first."""
    rows = s.execute(
        select(Conversation, Template.name, func.count(Message.id))
        .join(Template, Conversation.template_id == Template.id)
        .outerjoin(Message, Message.conversation_id == Conversation.id)
        .where(Conversation.session_key == session_key, Conversation.deleted_at.is_(None))
        .group_by(Conversation.id, Template.name)
        .order_by(Conversation.id.desc())
        .limit(limit)
    ).all()
    return [ConversationRow(c.id, c.title, name, c.created_at, n, Handoff(c.handoff), c.template_version_id)
            for c, name, n in rows]


def state_of(s: Session, *, conversation_id: int) -> ConversationState | None:
    """The conversation's owner, hand-off state and version; None when it does not exist."""
    c = s.get(Conversation, conversation_id)
    return None if c is None else ConversationState(c.session_key, Handoff(c.handoff), c.template_version_id)


def template_of(s: Session, *, conversation_id: int) -> str | None:
    return s.scalar(select(Template.name).join(Conversation, Conversation.template_id == Template.id)
                    .where(Conversation.id == conversation_id))


def messages(s: Session, *, conversation_id: int) -> list[MessageRow]:
    """The conversation as shown and sent as context: answers replaced by a retry are left out."""
    rows = s.scalars(select(Message).where(Message.conversation_id == conversation_id,
                                           Message.status != AnswerStatus.REPLACED)
                     .order_by(Message.id)).all()
    ratings = {r.message_id: r for r in s.scalars(select(Rating).where(Rating.conversation_id == conversation_id))}
    return [_row(m, ratings.get(m.id)) for m in rows]


def begin_turn(s: Session, *, session_key: str, conversation_id: int | None, template_id: int,
               template_version_id: int, text: str, tenant: str = "",
               arm: Callable[[int], int] | None = None) -> TurnIds:
    """Store the user's message (and a new conversation if ``conversation_id`` is None) with an empty
    answer row of status ``generating``.

    A new conversation gets the version ``arm(conversation id)`` picks when ``arm`` is given (a live
    split), else ``template_version_id``. In a conversation a person answers, the message is stored
    alone: the returned ``answer_id`` is None and ``handoff`` says who has it.
    """
    handoff = Handoff.MODEL
    if conversation_id is None:
        conv = Conversation(session_key=session_key, template_id=template_id, title=text[:TITLE_CHARS], tenant=tenant,
                            template_version_id=template_version_id)
        s.add(conv)
        s.flush()
        conversation_id = conv.id
        if arm is not None:
            conv.template_version_id = template_version_id = arm(conv.id)
    else:
        conv = s.get(Conversation, conversation_id)
        handoff = Handoff(conv.handoff) if conv is not None else Handoff.MODEL
    now = utcnow()
    user = Message(conversation_id=conversation_id, role="user", text=text, status=AnswerStatus.OK,
                   template_version_id=template_version_id, created_at=now, finished_at=now)
    answer = None
    if not handoff:
        answer = Message(conversation_id=conversation_id, role="assistant", text="", status=AnswerStatus.GENERATING,
                         template_version_id=template_version_id)
    s.add_all([user] + ([answer] if answer else []))
    s.flush()
    return TurnIds(conversation_id, user.id, answer.id if answer else None, template_version_id, handoff)


def begin_retry(s: Session, *, session_key: str, conversation_id: int, template_version_id: int) -> TurnIds:
    """Replace the last answer of a conversation with a new empty one: the old answer row is marked
    ``replaced`` (kept for the record, never shown or sent as context again). Raises as _last_question."""
    _, rows, last_user = _last_question(s, session_key, conversation_id)
    for m in rows:
        if m.id > last_user.id and m.role == "assistant":
            m.status = AnswerStatus.REPLACED
    answer = Message(conversation_id=conversation_id, role="assistant", text="", status=AnswerStatus.GENERATING,
                     template_version_id=template_version_id)
    s.add(answer)
    s.flush()
    return TurnIds(conversation_id, last_user.id, answer.id, template_version_id)


class Stale(LookupError):
    """The question an edit replaces is no longer the conversation's last (another tab asked since)."""


def begin_edit(s: Session, *, session_key: str, conversation_id: int, text: str,
               template_version_id: int, replaces: Callable[[str], bool]) -> TurnIds:
    """Ask the conversation's last question again as ``text`` (the customer edited it): the old question and
    its answers are marked ``replaced`` (kept for the record, never shown or sent as context again), the new
    question is stored with an empty answer to fill. A conversation still titled by the old question takes the
    new one's title. ``replaces(stored text)`` tells whether the stored last question is the one the customer
    edited; raises Stale when not, else as _last_question."""
    conv, rows, last_user = _last_question(s, session_key, conversation_id)
    if not replaces(last_user.text):
        raise Stale()
    for m in rows:
        if m.id >= last_user.id:
            m.status = AnswerStatus.REPLACED
    if conv.title == last_user.text[:TITLE_CHARS] and not any(m.role == "user" and m.id < last_user.id for m in rows):
        conv.title = text[:TITLE_CHARS]
    now = utcnow()
    user = Message(conversation_id=conversation_id, role="user", text=text, status=AnswerStatus.OK,
                   template_version_id=template_version_id, created_at=now, finished_at=now)
    answer = Message(conversation_id=conversation_id, role="assistant", text="", status=AnswerStatus.GENERATING,
                     template_version_id=template_version_id)
    s.add_all([user, answer])
    s.flush()
    return TurnIds(conversation_id, user.id, answer.id, template_version_id)


def _last_question(s: Session, session_key: str, conversation_id: int) -> tuple[Conversation, list[Message], Message]:
    """(conversation, its shown messages, their last question) for Retry and an edit. Raises NotYours (another's
    or deleted), LookupError (no question), WithPerson (a person answers it), StillAnswering."""
    conv = s.get(Conversation, conversation_id)
    if conv is None or conv.session_key != session_key or conv.deleted_at is not None:
        raise NotYours()
    rows = list(s.scalars(select(Message).where(Message.conversation_id == conversation_id,
                                                Message.status != AnswerStatus.REPLACED).order_by(Message.id)))
    last_user = next((m for m in reversed(rows) if m.role == "user"), None)
    if last_user is None:
        raise LookupError("This conversation has no question yet.")
    if conv.handoff:
        raise WithPerson(conv.handoff, last_user.id)
    if _still_answering(rows, last_user.id):
        raise StillAnswering()
    return conv, rows, last_user


class StillAnswering(LookupError):
    """The conversation's last question is still being answered: Retry and an edit wait for it to end."""


def _still_answering(rows, after_id: int) -> bool:
    """Whether an answer after ``after_id`` is still being written (a row left "generating" by a process that died
    long ago does not count)."""
    since = utcnow() - STALE_GENERATING
    return any(m.id > after_id and m.status == AnswerStatus.GENERATING
               and max(m.created_at, m.finished_at or m.created_at) > since
               for m in rows)


class NothingToContinue(LookupError):
    """The conversation's last answer was not cut off at its budget."""


def begin_continue(s: Session, *, session_key: str, conversation_id: int) -> tuple[TurnIds, str]:
    """Reopen the conversation's last answer, cut off at its budget, to go on with it as the same answer: its
    row goes back to ``generating`` (finish_answer stores the whole text). Returns the turn and the text so
    far. Raises NotYours, NothingToContinue, or WithPerson while a person answers."""
    conv = s.get(Conversation, conversation_id)
    if conv is None or conv.session_key != session_key or conv.deleted_at is not None:
        raise NotYours()
    last = s.scalars(select(Message).where(Message.conversation_id == conversation_id,
                                           Message.status != AnswerStatus.REPLACED)
                     .order_by(Message.id.desc()).limit(1)).first()
    if (last is None or last.role != "assistant" or last.author or last.status != AnswerStatus.OK
            or last.finish_reason != "length"):
        raise NothingToContinue("the last answer was not cut off")
    question = s.scalar(select(func.max(Message.id)).where(Message.conversation_id == conversation_id,
                                                          Message.role == "user"))
    if conv.handoff:
        raise WithPerson(conv.handoff, question or last.id)
    last.status = AnswerStatus.GENERATING
    last.finished_at = utcnow()  # when it was reopened: Retry and an edit wait for it (_still_answering)
    s.flush()
    return TurnIds(conversation_id, question or 0, last.id, last.template_version_id), last.text


def finish_answer(s: Session, *, message_id: int, result: AnswerResult) -> MessageRow:
    """Store an answer's end; an answer a retry or an edit replaced meanwhile stays replaced (its text kept)."""
    m = s.get_one(Message, message_id)
    m.text = result.text
    m.status = result.status if m.status != AnswerStatus.REPLACED else AnswerStatus.REPLACED
    m.error = result.error
    m.error_code = result.error_code
    m.prompt_tokens = result.prompt_tokens
    m.num_cached_tokens = result.num_cached_tokens
    m.ttft_ms = result.ttft_ms
    m.output_tokens = result.output_tokens
    m.decode_tokens_per_s = result.decode_tokens_per_s
    m.replica = result.replica
    m.finish_reason = result.finish_reason
    m.finished_at = utcnow()
    s.flush()
    return _row(m)


# -- what a customer does to a conversation of their own --------------------------------------------------


def rate(s: Session, *, session_key: str, message_id: int, thumbs: int, reason: str = "") -> MessageRow:
    """Store the customer's thumbs (+1 or -1) on one of their answers, replacing an earlier rating."""
    if thumbs not in (1, -1):
        raise ValueError("thumbs must be +1 or -1")
    m = _own_answer(s, session_key, message_id)
    rating = s.scalar(select(Rating).where(Rating.message_id == m.id))
    if rating is None:
        rating = Rating(message_id=m.id, conversation_id=m.conversation_id, template_version_id=m.template_version_id,
                        thumbs=thumbs, reason=reason[:MAX_REASON_CHARS])
        s.add(rating)
    else:
        rating.thumbs, rating.reason, rating.updated_at = thumbs, reason[:MAX_REASON_CHARS], utcnow()
    s.flush()
    return _row(m, rating)


def set_first_visible(s: Session, *, session_key: str, message_id: int, ms: float) -> None:
    """Keep when the answer's first glyph reached the customer's screen (their browser measured it); the
    first report counts, a later one for the same answer is ignored."""
    m = _own_answer(s, session_key, message_id)
    if m.first_visible_ms is None:
        m.first_visible_ms = round(ms, 1)


def first_visible_of_last(s: Session, *, session_key: str, conversation_id: int, ms: float,
                          since: datetime) -> MessageRow | None:
    """Keep ``ms`` as when the conversation's last answer first showed on its customer's screen: only a model's
    answer (no person's), finished, begun after ``since``, not reported before, and no sooner than the engine's
    first token (the page's clock starts before the question is sent). The answer, or None."""
    _own(s, session_key, conversation_id)
    m = s.scalars(select(Message).where(Message.conversation_id == conversation_id, Message.role == "assistant",
                                        Message.status != AnswerStatus.REPLACED)
                     .order_by(Message.id.desc()).limit(1)).first()
    if (m is None or m.author or m.status not in (AnswerStatus.OK, AnswerStatus.STOPPED)
            or m.first_visible_ms is not None
            or m.created_at < since or (m.ttft_ms is not None and ms < m.ttft_ms)):
        return None
    m.first_visible_ms = round(ms, 1)
    s.flush()
    return _row(m)


def rename(s: Session, *, session_key: str, conversation_id: int, title: str) -> None:
    _own(s, session_key, conversation_id).title = title[:TITLE_CHARS]


def delete(s: Session, *, session_key: str, conversation_id: int) -> None:
    """Take the conversation off the customer's list (the record stays for the operators)."""
    _own(s, session_key, conversation_id).deleted_at = utcnow()


def request_person(s: Session, *, session_key: str, conversation_id: int, client: str = "",
                   caps: PersonCaps = PersonCaps()) -> bool:
    """Mark the conversation as waiting for a person, asked by ``client`` (app/db/person_queue.py); False when it
    already waits or is with one. Raises QueueFull (nothing written) when one of ``caps`` is reached."""
    c = _own(s, session_key, conversation_id)
    if c.handoff:
        return False
    key = person_queue.client_key(client)
    if full := person_queue.full_cap(s, session_key=session_key, client=key, caps=caps):
        raise full
    c.handoff, c.handoff_requested_at, c.handoff_client = Handoff.WAITING, utcnow(), key
    return True


def messages_after(s: Session, *, session_key: str, conversation_id: int, after_id: int,
                   limit: int = MAX_POLL_MESSAGES) -> list[MessageRow]:
    """The conversation's finished messages with an id above ``after_id``, oldest first, at most ``limit``:
    what a chat that shows messages up to ``after_id`` polls for (a person's replies). One indexed query."""
    _own(s, session_key, conversation_id)
    rows = s.scalars(select(Message).where(Message.conversation_id == conversation_id, Message.id > after_id,
                                           Message.status.not_in((AnswerStatus.GENERATING, AnswerStatus.REPLACED)))
                     .order_by(Message.id).limit(max(1, min(limit, MAX_POLL_MESSAGES)))).all()
    return [_row(m) for m in rows]


def handoff_of(s: Session, *, conversation_id: int) -> Handoff:
    """Who answers the conversation; Handoff.MODEL for a conversation that does not exist."""
    return Handoff(s.scalar(select(Conversation.handoff).where(Conversation.id == conversation_id)) or "")


# -- what an operator does (audited) ----------------------------------------------------------------------


def take(s: Session, *, conversation_id: int, operator: str) -> None:
    """An operator takes a conversation that waits for a person (or one a colleague holds)."""
    c = s.get(Conversation, conversation_id)
    if c is None:
        raise LookupError(f"conversation {conversation_id} does not exist")
    if not c.handoff:
        raise HandoffError(f"conversation {conversation_id} did not ask for a person")
    before = c.handoff_operator or c.handoff
    c.handoff, c.handoff_operator = Handoff.PERSON, operator
    audit.record(s, user=operator, action="take conversation", target=str(conversation_id), field="answered by",
                 before=before, after=operator)


def person_reply(s: Session, *, conversation_id: int, operator: str, text: str) -> MessageRow:
    """Store an operator's reply as an answer of the conversation, with the operator as its author."""
    c = s.get(Conversation, conversation_id)
    if c is None or c.handoff != Handoff.PERSON or c.handoff_operator != operator:
        raise HandoffError(f"take conversation {conversation_id} before replying to it")
    now = utcnow()
    m = Message(conversation_id=conversation_id, role="assistant", text=text, status=AnswerStatus.OK, author=operator,
                template_version_id=c.template_version_id, created_at=now, finished_at=now)
    s.add(m)
    s.flush()
    audit.record(s, user=operator, action="reply as a person", target=str(conversation_id), field="characters",
                 after=len(text))
    return _row(m)


def release(s: Session, *, conversation_id: int, operator: str) -> None:
    """Hand the conversation back to the model."""
    c = s.get(Conversation, conversation_id)
    if c is None or not c.handoff:
        raise HandoffError(f"conversation {conversation_id} is not with a person")
    before = c.handoff_operator or c.handoff
    c.handoff, c.handoff_operator, c.handoff_requested_at, c.handoff_client = "", "", None, ""
    audit.record(s, user=operator, action="release conversation", target=str(conversation_id), field="answered by",
                 before=before, after="model")


def message_row(m: Message, rating: Rating | None = None) -> MessageRow:
    """A stored message (with its rating) as the frozen row callers get."""
    return _row(m, rating)


def _own(s: Session, session_key: str, conversation_id: int) -> Conversation:
    c = s.get(Conversation, conversation_id)
    if c is None or c.session_key != session_key or c.deleted_at is not None:
        raise NotYours()
    return c


def _own_answer(s: Session, session_key: str, message_id: int) -> Message:
    m = s.get(Message, message_id)
    if m is None or m.role != "assistant" or m.status in (AnswerStatus.GENERATING, AnswerStatus.REPLACED):
        raise NotYours()
    _own(s, session_key, m.conversation_id)
    return m


def _row(m: Message, rating: Rating | None = None) -> MessageRow:
    return MessageRow(
        id=m.id, conversation_id=m.conversation_id, role=m.role, text=m.text, status=AnswerStatus(m.status),
        error=m.error, template_version_id=m.template_version_id, prompt_tokens=m.prompt_tokens,
        num_cached_tokens=m.num_cached_tokens, ttft_ms=m.ttft_ms, output_tokens=m.output_tokens,
        decode_tokens_per_s=m.decode_tokens_per_s, replica=m.replica, created_at=m.created_at,
        finish_reason=m.finish_reason, author=m.author, first_visible_ms=m.first_visible_ms,
        rating=rating.thumbs if rating else None, rating_reason=rating.reason if rating else "",
        error_code=m.error_code or "",
    )
