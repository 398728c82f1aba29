"""Conversations and messages: a turn is written before generation and its answer row finished after.

``begin_turn`` stores the user's message and an empty answer row (status ``generating``) in one
transaction, so the question is kept even if the answer never comes; ``finish_answer`` ends that
row as ok, stopped or error with its stats.
"""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.db.models import Conversation, Message, Template, utcnow
from app.db.rows import AnswerResult, ConversationHeader, ConversationRow, MessageRow, TurnIds

TITLE_CHARS = 60


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
        .where(Conversation.session_key == session_key)
        .group_by(Conversation.id, Template.name)
        .order_by(Conversation.id.desc())
        .limit(limit)
    ).all()
    return [ConversationRow(c.id, c.title, name, c.created_at, n) for c, name, n in rows]


def template_of(s: Session, *, conversation_id: int) -> str | None:
    return s.scalar(select(Template.name).join(Conversation, Conversation.template_id == Template.id)
                    .where(Conversation.id == conversation_id))


def messages(s: Session, *, conversation_id: int) -> list[MessageRow]:
    """The conversation as shown and sent as context: answers replaced by a retry are left out."""
    rows = s.scalars(select(Message).where(Message.conversation_id == conversation_id, Message.status != "replaced")
                     .order_by(Message.id)).all()
    return [_row(m) for m in rows]


def begin_turn(s: Session, *, session_key: str, conversation_id: int | None, template_id: int,
               template_version_id: int, text: str, tenant: str = "") -> TurnIds:
    """Store the user's message (and a new conversation if ``conversation_id`` is None) with an empty
    answer row of status ``generating``."""
    if conversation_id is None:
        conv = Conversation(session_key=session_key, template_id=template_id, title=text[:TITLE_CHARS], tenant=tenant)
        s.add(conv)
        s.flush()
        conversation_id = conv.id
    now = utcnow()
    user = Message(conversation_id=conversation_id, role="user", text=text, status="ok",
                   template_version_id=template_version_id, created_at=now, finished_at=now)
    answer = Message(conversation_id=conversation_id, role="assistant", text="", status="generating",
                     template_version_id=template_version_id)
    s.add_all([user, answer])
    s.flush()
    return TurnIds(conversation_id, user.id, answer.id)


def begin_retry(s: Session, *, session_key: str, conversation_id: int, template_version_id: int) -> TurnIds:
    """Replace the last answer of a conversation with a new empty one: the old answer row is marked
    ``replaced`` (kept for the record, never shown or sent as context again). Raises LookupError when
    the conversation is not this browser's or has no question to answer again."""
    if owner(s, conversation_id=conversation_id) != session_key:
        raise LookupError("That conversation does not exist here; please start a new one.")
    rows = s.scalars(select(Message).where(Message.conversation_id == conversation_id,
                                           Message.status != "replaced").order_by(Message.id)).all()
    last_user = next((m for m in reversed(rows) if m.role == "user"), None)
    if last_user is None:
        raise LookupError("This conversation has no question to answer again.")
    for m in rows:
        if m.id > last_user.id and m.role == "assistant":
            m.status = "replaced"
    answer = Message(conversation_id=conversation_id, role="assistant", text="", status="generating",
                     template_version_id=template_version_id)
    s.add(answer)
    s.flush()
    return TurnIds(conversation_id, last_user.id, answer.id)


def finish_answer(s: Session, *, message_id: int, result: AnswerResult) -> MessageRow:
    m = s.get_one(Message, message_id)
    m.text = result.text
    m.status = result.status
    m.error = result.error
    m.prompt_tokens = result.prompt_tokens
    m.num_cached_tokens = result.num_cached_tokens
    m.ttft_ms = result.ttft_ms
    m.output_tokens = result.output_tokens
    m.decode_tokens_per_s = result.decode_tokens_per_s
    m.replica = result.replica
    m.finished_at = utcnow()
    s.flush()
    return _row(m)


def _row(m: Message) -> MessageRow:
    return MessageRow(
        id=m.id, conversation_id=m.conversation_id, role=m.role, text=m.text, status=m.status, error=m.error,
        template_version_id=m.template_version_id, prompt_tokens=m.prompt_tokens,
        num_cached_tokens=m.num_cached_tokens, ttft_ms=m.ttft_ms, output_tokens=m.output_tokens,
        decode_tokens_per_s=m.decode_tokens_per_s, replica=m.replica, created_at=m.created_at,
    )
