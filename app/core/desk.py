"""The help desk's chat logic, free of any UI: one message in, a stored, streamed answer out.

The path of a message: validate (sizes and limits, before any work) → store the user's message →
assemble the prompt (template chain + history) → stream from the engine → store the answer with
its stats. The user's message is stored before generation starts, and the answer row is always
finished — ok, stopped or error — so nothing is lost, whatever happens to the request. Database
calls and long tokenizing run off the event loop that streams every user's tokens.

A conversation stays on the template version it started with; a new one gets the candidate of a
live split for the candidate's share of conversations. While a person answers a conversation, the
model does not: the customer's message is stored and the desk says who has it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from functools import partial, wraps

from app.core.answering import Answering
from app.core.cache_figures import shared_prefix_tokens, shown_cached_tokens
from app.core.catalog import TemplateCatalog, TemplateNotFound, split_version
from app.core.limits import ClientLimiter, FeedbackLimiter, RateLimited
from app.core.metrics import DeskMetrics
from app.core.prompts import Prompt, PromptBuilder, PromptError, Turn, system_text
from app.core.refusals import Refused, english
from app.core.routing import routing_key
from app.core.session_keys import BROWSER_KIND, MAX_SESSION_KEY_CHARS
from app.db import Database, StoreError
from app.db import conversations as db_conversations
from app.db.models import utcnow
from app.db.person_queue import Cap, PersonCaps, QueueFull, record_refusal
from app.db.rows import AnswerResult, ConversationRow, MessageRow, TemplateInfo, TurnIds
from app.db.states import AnswerStatus, Handoff
from app.engine import Delta, Engine, EngineBusy, EngineError, EngineRejected, RequestStats

log = logging.getLogger(__name__)

MAX_MESSAGE_CHARS = 20_000
MAX_HISTORY_MESSAGES = 200
MAX_HISTORY_CHARS = 200_000
INLINE_TOKENIZE_CHARS = 1_000  # a prompt with this much text builds in 0.7 ms (2,000: 1.4 ms): on the loop
STOPPED = "stopped before the answer was complete"
PROGRESS_INTERVAL_S = 0.02  # about one screen update per frame: text appears as it is generated
WITH_PERSON = AnswerStatus.WITH_PERSON  # the status of a turn a person answers (no answer row is stored for it)
NEW_CONVERSATIONS_KEPT = 10_000  # browsers whose last new conversation a Stop can find (the newest)
MAX_FIRST_VISIBLE_MS = 600_000  # a browser's first-text measure beyond ten minutes is no measure
FIRST_VISIBLE_WITHIN = timedelta(minutes=10)  # how late a browser may still report an answer's first text
# What a template tells the model to write when only a person can help: a finished answer that holds it hands
# the conversation to a person (the model answers it no more until an operator releases it).
PERSON_MARKERS = ("【转人工】", "[[person]]")
PERSON_NOTICE = "A person is answering this conversation; their reply will appear here."


class DeskInputError(Refused, ValueError):
    """The request cannot be answered as sent: ``code`` and ``params`` say why (app/core/refusals.py), for the
    chat to say in the customer's language; the message is the precise English for the APIs."""

    counted = False  # already counted for /metrics (Desk._counting_refusals)

    def __init__(self, code: str, **params):
        super().__init__(self._refuse(code, params))

    @classmethod
    def of(cls, refusal: Refused) -> DeskInputError:
        return cls(refusal.code, **refusal.params)


@dataclass(frozen=True)
class Admitted:
    """A message the desk has taken in (``Desk.admit``): counted against its sender's rate, within the
    size limit, cleaned. Pass it to ``Desk.answer`` in place of the text to answer it."""

    client: str
    text: str


@dataclass(frozen=True)
class Progress:
    """The answer so far (the whole text, not a delta)."""

    text: str
    conversation_id: int


@dataclass(frozen=True)
class Finished:
    """The stored answer row (status ok, stopped or error), the same row as the customer may see it
    (app/core/cache_figures.py), and how the prompt was fitted.

    When a person answers the conversation (``handoff`` "waiting" or "person") nothing was generated:
    ``message`` is then no stored row but a notice of status WITH_PERSON whose id is the customer's
    stored question, the id to poll ``messages_after`` from.
    """

    message: MessageRow
    customer: MessageRow
    dropped_turns: int = 0
    handoff: str = ""
    person_refused: str = ""  # the answer asked for a person and the queue's caps refused: the refusal's code


def _refusals_counted(method):
    """A Desk method that streams events, counting a refusal (DeskInputError) for /metrics on its way out; the
    inner stream is closed with the outer, so a Stop reaches it at once."""
    @wraps(method)
    async def counted(self, **kwargs):
        with self._counting_refusals():
            async with contextlib.aclosing(method(self, **kwargs)) as events:
                async for event in events:
                    yield event
    return counted


class Desk:
    def __init__(self, *, db: Database, catalog: TemplateCatalog, engine: Engine, prompts: PromptBuilder,
                 limiter: ClientLimiter, tenant_secret: str, family_shards: int = 1, ignore_eos: bool = False,
                 step_delay_ms: int = 0, metrics: DeskMetrics | None = None, person_caps: PersonCaps = PersonCaps(),
                 feedback: FeedbackLimiter | None = None):
        self.db = db
        self.catalog = catalog
        self.engine = engine
        self.prompts = prompts
        self.limiter = limiter
        self._tenant_secret = tenant_secret
        self.family_shards = family_shards
        self.ignore_eos = ignore_eos  # PREFIXDESK_IGNORE_EOS: every answer runs to its token budget (load tests)
        self.step_delay_ms = step_delay_ms  # PREFIXDESK_STEP_DELAY_MS: answers a test can catch mid-stream
        self.metrics = metrics or DeskMetrics()  # counted here, served at /metrics (app/core/metrics.py)
        self.person_caps = person_caps  # PREFIXDESK_PERSON_WAITING_*: the person queue's caps
        # PREFIXDESK_FEEDBACK_PER_*: ratings and first-text times counted per client and browser
        self.feedback = feedback or FeedbackLimiter(per_client=0, per_session=0)
        # The answers this desk is writing, from their turn's write to their row's end (ok, stopped or error): what
        # a Stop awaits (settled_conversation). Turn writes in flight by session key (their answer ids are not
        # known yet); then each answer's id, with an event set once its row is finished.
        self._turn_writes: dict[str, set[asyncio.Future]] = {}
        self._writing: dict[int, asyncio.Event] = {}
        # The conversation each browser's last new-conversation turn on this desk created (the newest
        # NEW_CONVERSATIONS_KEPT browsers): what a Stop cut off before its page learnt the conversation's id.
        self._started: OrderedDict[str, int] = OrderedDict()
        # The answers a page asked for, each driven to its end whoever reads it (app/core/answering.py), by browser:
        # what a Stop ends, and what a page that opens the conversation meanwhile follows.
        self._answering: dict[str, set[Answering]] = {}

    def tenant_salt(self, tenant: str) -> str | None:
        """The cache_salt of ``tenant``: its prompts share blocks with each other and with no one else.

        The key is a server-side secret that no page or API ever sends, so nobody can compute the
        salt of another tenant.
        """
        if not tenant:
            return None
        return hmac.new(self._tenant_secret.encode(), tenant.encode(), hashlib.sha256).hexdigest()[:32]

    def templates(self) -> list[TemplateInfo]:
        return self.catalog.all()

    def prefix_ids(self, template: TemplateInfo) -> tuple[int, ...]:
        return self.catalog.prefix_ids(template.name)

    def shared_tokens(self, template_name: str, version_id: int | None = None) -> int:
        """Tokens of the template's prefix (at ``version_id``, a conversation's own version, when the catalog holds
        it) in whole KV blocks: what all its customers share (0 when it is no longer published)."""
        try:
            num_prefix_tokens = len(self.catalog.prefix_ids(template_name, version_id))
        except KeyError:
            return 0
        return shared_prefix_tokens(num_prefix_tokens, self.engine.info.block_size)

    def customer_template(self, name: str) -> TemplateInfo:
        """A template a customer may chat with; raises DeskInputError naming the ones there are."""
        try:
            template = self.catalog.get(name)
        except TemplateNotFound as exc:
            raise DeskInputError.of(exc) from None
        if template.internal:
            raise DeskInputError.of(TemplateNotFound(name, [t.name for t in self.catalog.customer_facing()]))
        return template

    async def build_prompt(self, template: TemplateInfo, history: Sequence[Turn], message: str) -> Prompt:
        """The prompt's token ids; long conversations are tokenized on a thread, not on the loop."""
        size = len(message) + sum(len(t.text) for t in history)
        if size <= INLINE_TOKENIZE_CHARS:
            return self.prompts.build(system_text(template.chain), history, message)
        return await asyncio.to_thread(self.prompts.build, system_text(template.chain), list(history), message)

    def admit(self, *, client: str, message: object, browser: str = "") -> Admitted:
        """Take in a message from ``client``, before anything reads or keeps it: its type, then the client's
        rate (a refused message costs its sender a turn like any other, so a flood of them stops at the
        limit), then its size, all checked before the text is even cleaned. ``browser``: the browser's key,
        checked by the caller (its own rate; the address's is then only an outer bound). Raises
        DeskInputError."""
        with self._counting_refusals():
            return self._admit(client, message, browser)

    def _admit(self, client: str, message: object, browser: str) -> Admitted:
        if not isinstance(message, str):
            raise DeskInputError("not_text")
        self._check_rate(client, browser)
        if len(message) > MAX_MESSAGE_CHARS:
            raise DeskInputError("message_chars", chars=len(message), limit=MAX_MESSAGE_CHARS)
        text = clean_text(message).strip()
        if not text:
            raise DeskInputError("empty")
        return Admitted(client, text)

    @_refusals_counted
    async def answer(
        self,
        *,
        session_key: str,
        client: str,
        template_name: str,
        message: str | Admitted,
        history: Sequence[Turn] | None = None,
        conversation_id: int | None = None,
        tenant: str = "",
        max_tokens: int | None = None,
        ignore_eos: bool = False,
    ) -> AsyncIterator[Progress | Finished]:
        """Stream ``Progress`` events, then exactly one ``Finished`` with the stored answer.

        ``message`` is the text, or what ``admit`` made of it (a caller that must know before it keeps
        anything). ``history`` is the context as the caller holds it; None means the stored conversation.
        Raises DeskInputError (nothing stored) for bad input, a limit, or an unknown template or
        conversation. Every later failure is stored with the answer and reported in Finished.
        """
        admitted = message if isinstance(message, Admitted) else \
            self.admit(client=client, message=message, browser=_browser(session_key))
        assert admitted.client == client, "a message admitted for another client"
        message = admitted.text
        if not 0 < len(session_key) <= MAX_SESSION_KEY_CHARS:
            raise DeskInputError("session")
        if history is not None:
            history = check_history(history)
        template = self.customer_template(template_name)
        if conversation_id is not None:
            state = await self._read(db_conversations.state_of, conversation_id=conversation_id)
            if state is None or state.session_key != session_key:
                raise DeskInputError("no_conversation")
            template = await self._on_version(template, state.template_version_id)
            if history is None:
                history = await self._stored_turns(conversation_id)
        # A new conversation's arm of a live split is drawn from its id, in the transaction that creates it.
        arm = partial(split_version, template) if conversation_id is None and template.candidate_version_id else None
        try:
            turn = await self._begin(
                db_conversations.begin_turn, template, session_key=session_key, conversation_id=conversation_id,
                template_id=template.id, template_version_id=template.version_id, text=message, tenant=tenant,
                arm=arm)
        except StoreError as exc:
            raise DeskInputError("not_saved", detail=str(exc)) from None
        if turn.answer_id is None:
            yield _with_person(turn.conversation_id, turn.user_message_id, turn.template_version_id, turn.handoff)
            return
        template = await self._until_generating(turn, template, self._on_version(template, turn.template_version_id))
        async for event in self._generate(turn, template, history or [], message, client=client, tenant=tenant,
                                          session_key=session_key,
                                          max_tokens=max_tokens, ignore_eos=ignore_eos):
            yield event

    @_refusals_counted
    async def retry(self, *, session_key: str, client: str, conversation_id: int,
                    tenant: str = "") -> AsyncIterator[Progress | Finished]:
        """Answer the last question of a stored conversation again; the new answer replaces the old."""
        template = await self._stored_template(client, conversation_id, browser=_browser(session_key))
        try:
            with _refusals(nothing="nothing_to_retry", not_saved="not_retried"):
                turn = await self._begin(db_conversations.begin_retry, template, session_key=session_key,
                                         conversation_id=conversation_id, template_version_id=template.version_id)
        except db_conversations.WithPerson as exc:
            yield _with_person(conversation_id, exc.message_id, template.version_id, exc.handoff)
            return
        turns = await self._until_generating(turn, template, self._stored_turns(conversation_id))
        question = turns.pop() if turns and turns[-1].role == "user" else Turn("user", "")
        async for event in self._generate(turn, template, turns, question.text, client=client, tenant=tenant,
                                          session_key=session_key):
            yield event

    @_refusals_counted
    async def edit_last(self, *, session_key: str, client: str, conversation_id: int, message: Admitted,
                        replaces: Callable[[str], bool], tenant: str = "") -> AsyncIterator[Progress | Finished]:
        """Ask the conversation's last question again as the customer edited it (``message``, from ``admit``):
        the new question and its answer replace the old ones, which are kept for the record. ``replaces(text)``
        tells whether a stored question is the one the customer edited (as their page shows it); when the
        stored last question is another (another tab asked since), raises DeskInputError("edit_stale") and
        nothing changes (checked in the edit's own transaction)."""
        assert message.client == client, "a message admitted for another client"
        template = await self._stored_template(client, conversation_id, check_rate=False)  # admit counted it
        try:
            with _refusals(nothing="nothing_to_edit", not_saved="not_saved"):
                turn = await self._begin(db_conversations.begin_edit, template, session_key=session_key,
                                         conversation_id=conversation_id, text=message.text,
                                         template_version_id=template.version_id, replaces=replaces)
        except db_conversations.WithPerson:  # the person answers what was asked: nothing is replaced under them
            raise DeskInputError("edit_with_person") from None
        except db_conversations.Stale:
            raise DeskInputError("edit_stale") from None
        turns = await self._until_generating(turn, template, self._stored_turns(conversation_id))
        if turns and turns[-1].role == "user":
            turns.pop()
        async for event in self._generate(turn, template, turns, message.text, client=client, tenant=tenant,
                                          session_key=session_key):
            yield event

    @_refusals_counted
    async def continue_answer(self, *, session_key: str, client: str, conversation_id: int,
                              tenant: str = "") -> AsyncIterator[Progress | Finished]:
        """Go on with the conversation's last answer, cut off at its budget, as the same answer: the prompt ends
        with the answer so far (no new question), and the stored row gets the whole text."""
        template = await self._stored_template(client, conversation_id, browser=_browser(session_key))
        try:
            with _refusals(nothing="nothing_to_continue", not_saved="not_retried"):
                turn, partial = await self._begin(db_conversations.begin_continue, template,
                                                  session_key=session_key,
                                                  conversation_id=conversation_id)
        except db_conversations.WithPerson as exc:
            yield _with_person(conversation_id, exc.message_id, template.version_id, exc.handoff)
            return
        template = await self._until_generating(turn, template, self._on_version(template, turn.template_version_id),
                                                partial)
        # The reopened answer is "generating": not among them.
        turns = await self._until_generating(turn, template, self._stored_turns(conversation_id), partial)
        async for event in self._generate(turn, template, turns, "", client=client, tenant=tenant, continued=partial,
                                          session_key=session_key):
            yield event

    async def _stored_template(self, client: str, conversation_id: int, *, check_rate: bool = True,
                               browser: str = "") -> TemplateInfo:
        """The template a stored conversation is answered with, at its own version, once its client's rate
        allows another answer (retry and continue; an edit's rate was checked by ``admit``)."""
        template_name = await self._read(db_conversations.template_of, conversation_id=conversation_id)
        if template_name is None:
            raise DeskInputError("no_conversation")
        template = self.customer_template(template_name)
        if check_rate:
            self._check_rate(client, browser)
        state = await self._read(db_conversations.state_of, conversation_id=conversation_id)
        return await self._on_version(template, state.template_version_id if state else None)

    async def conversation(self, *, session_key: str, conversation_id: int) -> list[MessageRow] | None:
        """The stored messages of a conversation this browser owns, as its customer may see them
        (cached-token figures capped: app/core/cache_figures.py), or None."""
        header = await self._read(db_conversations.header, conversation_id=conversation_id)
        if header is None or header.session_key != session_key:
            return None
        rows = await self._read(db_conversations.messages, conversation_id=conversation_id)
        return [_for_customer(m, self.shared_tokens(header.template, m.template_version_id),
                              own_namespace=bool(header.tenant)) for m in rows]

    async def settled_conversation(self, *, session_key: str, conversation_id: int) -> list[MessageRow] | None:
        """The conversation as ``conversation`` returns it, once every answer in it that this desk is writing has
        been stored (ok, stopped or error), however long the store takes: what the page shows after a Stop, which
        awaits the cancelled answer's own end rather than a deadline. A turn of this browser still being written
        is awaited first (its answer may be the one stopped). An answer this desk is not writing (another process's,
        or one left "generating" by a process that died) comes back as stored."""
        await self.turns_written(session_key=session_key)
        while True:
            # The answers being written as the read begins: one whose store ends while the read is on its way
            # is read "generating" and no longer listed after it, yet its event (set) sends the loop round again.
            writing = dict(self._writing)
            rows = await self.conversation(session_key=session_key, conversation_id=conversation_id)
            pending = [writing[m.id] for m in rows or () if m.status == AnswerStatus.GENERATING and m.id in writing]
            if not pending:
                return rows
            await asyncio.wait({asyncio.ensure_future(e.wait()) for e in pending})

    def keep_answering(self, events: AsyncIterator[Progress | Finished], *, session_key: str,
                       conversation_id: int | None) -> Answering:
        """``events`` (``answer``, ``retry``, ``edit_last`` or ``continue_answer`` of this browser's, asked in
        ``conversation_id``; None: a new one) run to their end whoever reads them: the page that asked reads the
        Answering, and a page that goes away meanwhile leaves the answer to be written and stored. A Stop ends it
        (``stop_answers``)."""
        answering = Answering(events, conversation_id=conversation_id, on_end=partial(self._answered, session_key))
        self._answering.setdefault(session_key, set()).add(answering)
        return answering

    def answering(self, *, session_key: str, conversation_id: int) -> Answering | None:
        """The answer this browser asked for in ``conversation_id`` that this desk is still writing, if any."""
        return next((a for a in self._answering.get(session_key, ()) if a.conversation_id == conversation_id
                     and not a.done), None)

    def answers_in_progress(self) -> int:
        """How many answers a page asked for this desk is still writing (read or not)."""
        return sum(len(ours) for ours in self._answering.values())

    async def stop_answers(self, *, session_key: str, conversation_id: int | None) -> None:
        """A Stop: this browser's answers in ``conversation_id`` end now, stored as stopped (and so does one it
        asked in a new conversation whose id is not known yet: the Stop came before its first text). Returns once
        they have ended."""
        ours = [a for a in self._answering.get(session_key, ()) if a.conversation_id in (conversation_id, None)]
        await asyncio.gather(*(a.stop() for a in ours))

    async def stop_all(self) -> None:
        """Every answer still written ends now, stored as stopped (the server is stopping)."""
        await asyncio.gather(*(a.stop() for ours in list(self._answering.values()) for a in list(ours)))

    def _answered(self, session_key: str, answering: Answering) -> None:
        ours = self._answering.get(session_key, set())
        ours.discard(answering)
        if not ours:
            self._answering.pop(session_key, None)

    async def turns_written(self, *, session_key: str) -> None:
        """Returns once the turns of this browser that this desk began storing are stored (or refused): a new
        conversation a Stop cut off is then listed, and its answer known as being written."""
        if begun := self._turn_writes.get(session_key):
            await asyncio.wait(set(begun))

    async def last_started(self, *, session_key: str) -> int | None:
        """The conversation that this browser's last new-conversation question on this desk started (once its
        turns are stored), or None: where a Stop that came before the page learnt the id cut the answer off."""
        await self.turns_written(session_key=session_key)
        return self._started.get(session_key)

    async def list_conversations(self, *, session_key: str) -> list[ConversationRow]:
        return await self._read(db_conversations.list_for, session_key=session_key)

    async def first_visible(self, *, session_key: str, conversation_id: int, ms: float,
                            client: str = "") -> MessageRow | None:
        """Keep the browser's measure of when the last answer of this browser's conversation first showed on its
        screen (``ms``: checked by the caller, 0 < ms <= MAX_FIRST_VISIBLE_MS), for an answer begun in the last
        FIRST_VISIBLE_WITHIN and not reported before, within ``client``'s and the browser's share of reports
        (FeedbackLimiter). The answer as the customer sees it, or None."""
        if not self.feedback.allow("first_visible", client=client, session_key=session_key):
            return None
        try:
            row = await self.db.write(db_conversations.first_visible_of_last, session_key=session_key,
                                      conversation_id=conversation_id, ms=ms, since=utcnow() - FIRST_VISIBLE_WITHIN)
        except (db_conversations.NotYours, StoreError):
            return None
        if row is None:
            return None
        header = await self._read(db_conversations.header, conversation_id=conversation_id)
        self.metrics.shown(template=header.template, ms=row.first_visible_ms)
        return _for_customer(row, self.shared_tokens(header.template, row.template_version_id),
                             own_namespace=bool(header.tenant))

    async def request_person(self, *, session_key: str, conversation_id: int, client: str = "") -> bool:
        """Hand this browser's conversation to a person, asked from ``client`` (its address); False when it is not
        theirs or already waits for one. Raises DeskInputError "person_queue_full" (everyone's cap) or
        "person_queue_own" (this client's or browser's) when the queue's caps refuse it; the refusal is counted
        for the operators."""
        try:
            return await self.db.write(db_conversations.request_person, session_key=session_key,
                                       conversation_id=conversation_id, client=client, caps=self.person_caps)
        except (db_conversations.NotYours, StoreError):
            return False
        except QueueFull as full:
            with contextlib.suppress(StoreError):
                await self.db.write(record_refusal, cap=full.cap)
            code = "person_queue_full" if full.cap is Cap.TOTAL else "person_queue_own"
            raise DeskInputError(code, limit=full.limit) from None

    async def rename(self, *, session_key: str, conversation_id: int, title: object) -> bool:
        """Give this browser's conversation a title of its customer's (1 to 60 characters once cleaned)."""
        text = clean_text(title).strip() if isinstance(title, str) and len(title) <= 200 else ""
        if not 0 < len(text) <= db_conversations.TITLE_CHARS:
            return False
        try:
            await self.db.write(db_conversations.rename, session_key=session_key, conversation_id=conversation_id,
                                title=text)
        except (db_conversations.NotYours, StoreError):
            return False
        return True

    async def delete(self, *, session_key: str, conversation_id: int) -> bool:
        """Take this browser's conversation off its list (the record stays for the operators)."""
        try:
            await self.db.write(db_conversations.delete, session_key=session_key, conversation_id=conversation_id)
        except (db_conversations.NotYours, StoreError):
            return False
        return True

    async def handoff(self, *, session_key: str, conversation_id: int) -> str | None:
        """"" (the model answers), "waiting" or "person" for this browser's conversation; None if not theirs."""
        header = await self._read(db_conversations.header, conversation_id=conversation_id)
        if header is None or header.session_key != session_key:
            return None
        return await self._read(db_conversations.handoff_of, conversation_id=conversation_id)

    async def rate(self, *, session_key: str, message_id: int, thumbs: int, reason: str = "", client: str = "") -> bool:
        """Keep the customer's thumbs (+1 or -1, with an optional reason) on one of their answers, within
        ``client``'s and the browser's share of ratings (FeedbackLimiter); False when not kept."""
        if not self.feedback.allow("rating", client=client, session_key=session_key):
            return False
        try:
            await self.db.write(db_conversations.rate, session_key=session_key, message_id=message_id,
                                thumbs=thumbs, reason=clean_text(reason).strip())
        except (db_conversations.NotYours, StoreError, ValueError):
            return False
        return True

    async def messages_after(self, *, session_key: str, conversation_id: int, after_id: int) -> list[MessageRow]:
        """This browser's conversation's finished messages after ``after_id`` (a person's replies, polled)."""
        try:
            return await self._read(db_conversations.messages_after, session_key=session_key,
                                    conversation_id=conversation_id, after_id=after_id)
        except db_conversations.NotYours:
            raise DeskInputError("no_conversation") from None

    # -- internals ---------------------------------------------------------------------------

    async def _generate(self, turn: TurnIds, template: TemplateInfo, history: Sequence[Turn], message: str, *,
                        client: str, tenant: str, max_tokens: int | None = None,
                        ignore_eos: bool = False, continued: str = "",
                        session_key: str = "") -> AsyncIterator[Progress | Finished]:
        """``continued``: the answer so far, which this generation goes on with (continue_answer). A finished
        answer that asks for a person (PERSON_MARKERS) hands the conversation to one."""
        text = continued
        result: AnswerResult | None = None
        dropped = 0
        try:
            with self.metrics.answering(), self.limiter.stream(client, browser=_browser(session_key)):
                prompt = (await self.build_prompt(template, history, message) if not continued else
                          await asyncio.to_thread(self.prompts.build_continuation, system_text(template.chain),
                                                  list(history), continued))
                dropped = prompt.dropped_turns
                budget = min(prompt.max_tokens, max_tokens or prompt.max_tokens)
                key = routing_key(template.family, shards=self.family_shards, shard_seed=str(turn.conversation_id))
                # aclosing: a stop or disconnect closes the engine stream at once, which aborts the
                # request in the engine instead of leaving it to the garbage collector.
                async with contextlib.aclosing(self.engine.stream(
                        prompt.token_ids, max_tokens=budget, cache_salt=self.tenant_salt(tenant),
                        ignore_eos=ignore_eos or self.ignore_eos, routing_key=key,
                        step_delay_ms=self.step_delay_ms)) as stream:
                    shown_at = 0.0
                    async for event in stream:
                        if isinstance(event, Delta):
                            text += event.text
                            # Each update re-sends the answer so far; one per frame is what the eye sees. The
                            # last text goes out with the stored answer, which follows at once.
                            if not event.last and (now := time.monotonic()) - shown_at >= PROGRESS_INTERVAL_S:
                                shown_at = now
                                yield Progress(text, turn.conversation_id)
                        elif isinstance(event, RequestStats):
                            status, error = ((AnswerStatus.STOPPED, STOPPED) if event.finish_reason == "abort"
                                             else (AnswerStatus.OK, None))
                            result = _result(text, status, error, event)
        except (RateLimited, PromptError) as exc:  # (text: a continued answer's text so far stays)
            result = _failed(text, exc.code, **exc.params)
        except EngineBusy as exc:
            result = _failed(text, "busy", detail=str(exc))
        except EngineRejected as exc:
            result = _failed(text, "rejected", detail=str(exc))
        except EngineError as exc:
            result = _failed(text, "broke_off", detail=str(exc))
        except (asyncio.CancelledError, GeneratorExit):
            await self._finish(turn.answer_id, AnswerResult(text=text, status=AnswerStatus.STOPPED, error=STOPPED),
                               template)
            raise
        except Exception:
            # An unexpected exception is on its way up; the answer row must not stay "generating".
            await self._finish(turn.answer_id, _failed(text, "internal"), template)
            raise
        stored = await self._finish(turn.answer_id, result, template)
        handoff, refused = Handoff.MODEL, ""
        if stored.status == AnswerStatus.OK and asks_for_person(stored.text) and session_key:
            try:
                asked = await self.request_person(session_key=session_key, client=client,
                                                  conversation_id=turn.conversation_id)
                handoff = Handoff.WAITING if asked else Handoff.MODEL
            except DeskInputError as exc:  # the queue's caps: the answer stands, the customer is told
                refused = exc.code
        yield Finished(stored, _for_customer(stored, self.shared_tokens(template.name, stored.template_version_id),
                                             own_namespace=bool(tenant)),
                       dropped, handoff=handoff, person_refused=refused)

    async def _on_version(self, template: TemplateInfo, version_id: int | None) -> TemplateInfo:
        """``template`` at a conversation's own version (None: the published one)."""
        if version_id is None or version_id == template.version_id:
            return template
        return await self.catalog.version(template, version_id)

    async def _begin(self, fn, template: TemplateInfo, /, **kwargs) -> TurnIds:
        """The turn's rows (``fn`` is begin_turn or begin_retry), written to the end even when a Stop cancels
        the wait for them: the answer row of a question that was stored is then finished as stopped, never
        left "generating"."""
        write = asyncio.ensure_future(self.db.write(fn, **kwargs))
        # Added before anything awaits the write, so the answer is known as being written before anyone learns the
        # turn was stored.
        self._turn_writes.setdefault(kwargs["session_key"], set()).add(write)
        new = fn is db_conversations.begin_turn and kwargs.get("conversation_id") is None
        write.add_done_callback(partial(self._turn_written, kwargs["session_key"], new))
        try:
            return await asyncio.shield(write)
        except asyncio.CancelledError:
            await asyncio.wait({write})
            if not write.cancelled() and write.exception() is None:
                # begin_continue also returns the answer's text so far: a stopped continuation keeps it.
                turn, text = write.result() if isinstance(write.result(), tuple) else (write.result(), "")
                if turn.answer_id is not None:
                    stopped = AnswerResult(text=text, status=AnswerStatus.STOPPED, error=STOPPED)
                    await self._finish(turn.answer_id, stopped, template)
            raise

    async def _until_generating(self, turn: TurnIds, template: TemplateInfo, step, text: str = ""):
        """Await ``step``, a read between storing a turn and generating its answer: a Stop that lands there
        stores the answer as stopped (with ``text``, a continued answer's words so far), never "generating"."""
        try:
            return await step
        except asyncio.CancelledError:
            if turn.answer_id is not None:
                await self._finish(turn.answer_id, AnswerResult(text=text, status=AnswerStatus.STOPPED, error=STOPPED),
                                   template)
            raise
        except Exception as exc:  # the store could not be read: the answer is stored as failed, with why
            if turn.answer_id is not None:
                code = exc.code if isinstance(exc, Refused) else "internal"
                await self._finish(turn.answer_id, AnswerResult(text=text, status=AnswerStatus.ERROR, error=str(exc),
                                                                error_code=code), template)
            raise

    def _check_rate(self, client: str, browser: str = "") -> None:
        try:
            self.limiter.check_rate(client, browser=browser)
        except RateLimited as exc:
            raise DeskInputError.of(exc) from None

    async def _read(self, fn, **kwargs):
        try:
            return await self.db.read(fn, **kwargs)
        except StoreError as exc:
            raise DeskInputError("unreadable", detail=str(exc)) from None

    async def _stored_turns(self, conversation_id: int) -> list[Turn]:
        rows = await self._read(db_conversations.messages, conversation_id=conversation_id)
        return [Turn(m.role, m.text) for m in rows
                if m.text and (m.role == "user" or m.status in (AnswerStatus.OK, AnswerStatus.STOPPED))]

    def _turn_written(self, session_key: str, new: bool, write: asyncio.Future) -> None:
        writes = self._turn_writes.get(session_key, set())
        writes.discard(write)
        if not writes:
            self._turn_writes.pop(session_key, None)
        if write.cancelled() or write.exception() is not None:
            return
        turn = write.result()[0] if isinstance(write.result(), tuple) else write.result()
        if new:
            self._started[session_key] = turn.conversation_id
            self._started.move_to_end(session_key)
            if len(self._started) > NEW_CONVERSATIONS_KEPT:
                self._started.popitem(last=False)
        if turn.answer_id is not None:
            self._writing[turn.answer_id] = asyncio.Event()

    def _answer_written(self, answer_id: int, _write: asyncio.Future) -> None:
        if (written := self._writing.pop(answer_id, None)) is not None:
            written.set()

    async def _finish(self, answer_id: int, result: AnswerResult, template: TemplateInfo) -> MessageRow:
        """Store the answer's end and count it for /metrics under ``template`` (at whichever of its versions
        the row names)."""
        # Shielded: a second cancel must not leave the row "generating"; the write runs on its
        # thread to the end either way, and its end (stored or failed) is the answer's end for settled_conversation.
        write = asyncio.ensure_future(self.db.write(db_conversations.finish_answer, message_id=answer_id,
                                                    result=result))
        write.add_done_callback(partial(self._answer_written, answer_id))
        try:
            row = await asyncio.shield(write)
        except StoreError:
            log.exception("could not store answer %s (%s)", answer_id, result.status)
            raise
        version = (template.version_number if row.template_version_id == template.version_id else
                   self.catalog.version_number(template.name, row.template_version_id))
        self.metrics.answered(row, template=template.name, version=version)
        return row

    @contextlib.contextmanager
    def _counting_refusals(self):
        """Count a DeskInputError on its way out, once however many of the desk's methods it passes."""
        try:
            yield
        except DeskInputError as exc:
            if not exc.counted:
                exc.counted = True
                self.metrics.refused(exc.code)
            raise


@contextlib.contextmanager
def _refusals(*, nothing: str, not_saved: str):
    """What Retry, an edit and Continue tell the customer when the store refuses them: another's (or a deleted)
    conversation, an answer still being written, nothing to do again (``nothing``), a failed write
    (``not_saved``). WithPerson passes through: each says it its own way."""
    try:
        yield
    except (db_conversations.WithPerson, db_conversations.Stale):
        raise
    except db_conversations.NotYours:
        raise DeskInputError("no_conversation") from None
    except db_conversations.StillAnswering:
        raise DeskInputError("answering") from None
    except LookupError:
        raise DeskInputError(nothing) from None
    except StoreError as exc:
        raise DeskInputError(not_saved, detail=str(exc)) from None


def _browser(session_key: str) -> str:
    """``session_key`` when it is a browser's key (the chat passes only keys it checked with SessionKeys.browser;
    /chat's keys are of the API kind), the key of that browser's own limits; else "" (limited by address)."""
    return session_key if session_key.startswith(BROWSER_KIND + ".") else ""


def _with_person(conversation_id: int, message_id: int, version_id: int | None, handoff: str) -> Finished:
    notice = MessageRow(id=message_id, conversation_id=conversation_id, role="assistant", text="", status=WITH_PERSON,
                        error=PERSON_NOTICE, template_version_id=version_id, prompt_tokens=None,
                        num_cached_tokens=None, ttft_ms=None, output_tokens=None, decode_tokens_per_s=None,
                        replica=None, created_at=utcnow())
    return Finished(notice, notice, handoff=handoff)


def asks_for_person(text: str) -> bool:
    """Whether a finished answer asks for a person (PERSON_MARKERS)."""
    return any(marker in text for marker in PERSON_MARKERS)


def check_history(history: Sequence[Turn]) -> list[Turn]:
    """Clean and bound a client's history before any work; raises DeskInputError past the limits."""
    if len(history) > MAX_HISTORY_MESSAGES:
        raise DeskInputError("history_messages", count=len(history), limit=MAX_HISTORY_MESSAGES)
    size = sum(len(t.text) for t in history)
    if size > MAX_HISTORY_CHARS:
        raise DeskInputError("history_chars", chars=size, limit=MAX_HISTORY_CHARS)
    turns = []
    for t in history:
        text = clean_text(t.text).strip()
        if t.role in ("user", "assistant") and text:
            turns.append(Turn(t.role, text))
    return turns


def clean_text(text: str) -> str:
    """Drop control characters (keeping newlines and tabs) and replace unpaired surrogates."""
    if any("\ud800" <= ch <= "\udfff" for ch in text):
        text = text.encode("utf-8", "replace").decode("utf-8", "replace")
    return "".join(ch for ch in text if ch in "\n\t" or ch.isprintable() or ch == " ")


def _for_customer(m: MessageRow, shared_tokens: int, *, own_namespace: bool) -> MessageRow:
    """The row as its customer may see it: cached tokens capped (app/core/cache_figures.py), with the shared prefix
    of its own version, which the caption's reuse is a share of."""
    shown = shown_cached_tokens(m.num_cached_tokens, shared_tokens=shared_tokens, own_namespace=own_namespace)
    return replace(m, num_cached_tokens=shown, shared_tokens=shared_tokens)


def _failed(text: str, code: str, **params) -> AnswerResult:
    """A failed answer: the English for the operators, the code for the customer's own words."""
    return AnswerResult(text=text, status=AnswerStatus.ERROR, error=english(code, **params), error_code=code)


def _result(text: str, status: str, error: str | None, stats: RequestStats) -> AnswerResult:
    return AnswerResult(
        text=text, status=status, error=error, prompt_tokens=stats.prompt_tokens,
        num_cached_tokens=stats.num_cached_tokens, ttft_ms=round(stats.ttft_ms, 1),
        output_tokens=stats.output_tokens, decode_tokens_per_s=round(stats.decode_tokens_per_s, 1),
        replica=stats.replica or None, finish_reason=stats.finish_reason,
    )

