"""The help desk's chat logic, free of any UI: one message in, a stored, streamed answer out.

The path of a message: validate → store the user's message → assemble the prompt (template chain
+ history) → stream from the engine → store the answer with its stats. The user's message is
stored before generation starts, and the answer row is always finished — ok, stopped or error —
so nothing is lost, whatever happens to the request.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import hmac
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from app.engine import Delta, Engine, EngineBusy, EngineError, RequestStats
from app.prompts import PromptBuilder, PromptError, Turn, system_text
from app.store import AnswerResult, MessageRow, Store, StoreError, TemplateInfo, TemplateNotFound

log = logging.getLogger(__name__)

MAX_MESSAGE_CHARS = 20_000
STOPPED = "stopped before the answer was complete"
PROGRESS_INTERVAL_S = 0.05  # at most 20 screen updates a second per answer


class DeskInputError(ValueError):
    """The request cannot be answered as sent; the message tells the user what to do."""


@dataclass(frozen=True)
class Progress:
    """The answer so far (the whole text, not a delta)."""

    text: str
    conversation_id: int


@dataclass(frozen=True)
class Finished:
    """The stored answer row (status ok, stopped or error) and how the prompt was fitted."""

    message: MessageRow
    dropped_turns: int = 0


class Desk:
    def __init__(self, *, store: Store, engine: Engine, prompts: PromptBuilder, rate_limit_per_minute: int = 0,
                 salt_secret: str = ""):
        self.store = store
        self.engine = engine
        self.prompts = prompts
        self.rate_limit_per_minute = rate_limit_per_minute
        self._salt_secret = salt_secret
        self._sent: dict[str, collections.deque[float]] = collections.defaultdict(collections.deque)

    def tenant_salt(self, tenant: str) -> str | None:
        """The cache_salt of ``tenant``: its prompts share blocks with each other and with no one else."""
        if not tenant:
            return None
        return hmac.new(self._salt_secret.encode(), tenant.encode(), hashlib.sha256).hexdigest()[:32]

    def templates(self) -> list[TemplateInfo]:
        return self.store.published_templates()

    def prefix_ids(self, template: TemplateInfo) -> tuple[int, ...]:
        return self.prompts.prefix_ids(system_text(template.chain))

    async def answer(
        self,
        *,
        session_key: str,
        template_name: str,
        history: Sequence[Turn],
        message: str,
        conversation_id: int | None = None,
        tenant: str = "",
        cache_salt: str | None = None,
        max_tokens: int | None = None,
        ignore_eos: bool = False,
    ) -> AsyncIterator[Progress | Finished]:
        """Stream ``Progress`` events, then exactly one ``Finished`` with the stored answer.

        Raises DeskInputError (nothing stored) for an empty message or an unknown template or
        conversation. Every later failure is stored with the answer and reported in Finished.
        """
        message = _clean(message)
        if not message.strip():
            raise DeskInputError("Please type a question before sending.")
        if len(message) > MAX_MESSAGE_CHARS:
            raise DeskInputError(
                f"This message has {len(message):,} characters; the limit is {MAX_MESSAGE_CHARS:,}. "
                "Please shorten it or split it into several messages."
            )
        self._check_rate(session_key)
        try:
            template = self.store.get_published(template_name)
        except TemplateNotFound as exc:
            raise DeskInputError(str(exc)) from None
        if conversation_id is not None and self.store.conversation_owner(conversation_id) != session_key:
            raise DeskInputError("That conversation does not exist here; please start a new one.")

        try:
            conversation_id, answer_id = self.store.begin_turn(
                session_key=session_key, conversation_id=conversation_id, template_id=template.id,
                template_version_id=template.version_id, text=message, tenant=tenant,
            )
        except StoreError as exc:
            raise DeskInputError(f"Your message could not be saved, so it was not sent: {exc}.") from None

        text = ""
        result: AnswerResult | None = None
        dropped = 0
        try:
            prompt = self.prompts.build(system_text(template.chain), _clean_turns(history), message)
            dropped = prompt.dropped_turns
            budget = min(prompt.max_tokens, max_tokens or prompt.max_tokens)
            cache_salt = cache_salt or self.tenant_salt(tenant)
            # aclosing: a stop or disconnect closes the engine stream at once, which aborts the
            # request in vLLM instead of leaving it to the garbage collector.
            async with contextlib.aclosing(
                self.engine.stream(prompt.token_ids, max_tokens=budget, cache_salt=cache_salt, ignore_eos=ignore_eos)
            ) as stream:
                shown_at = 0.0
                async for event in stream:
                    if isinstance(event, Delta):
                        text += event.text
                        # Coalesce: each update re-sends the text so far to the browser, so
                        # one per token would cost the server O(n^2) work on long answers.
                        if (now := time.monotonic()) - shown_at >= PROGRESS_INTERVAL_S:
                            shown_at = now
                            yield Progress(text, conversation_id)
                    elif isinstance(event, RequestStats) and event.finish_reason == "abort":
                        result = _result(text, "stopped", STOPPED, event)
                    elif isinstance(event, RequestStats):
                        result = _result(text, "ok", None, event)
        except PromptError as exc:
            result = AnswerResult(text="", status="error", error=str(exc))
        except EngineBusy as exc:
            result = AnswerResult(text="", status="error", error=f"The help desk is busy right now: {exc}.")
        except EngineError as exc:
            result = AnswerResult(text=text, status="error", error=f"The answer broke off: {exc}.")
        except (asyncio.CancelledError, GeneratorExit):
            result = AnswerResult(text=text, status="stopped", error=STOPPED)
            self._finish(answer_id, result)
            raise
        finally:
            if result is None:  # an unexpected exception is on its way up
                result = AnswerResult(text=text, status="error", error="internal error; the answer was not completed")
                self._finish(answer_id, result)
        yield Finished(self._finish(answer_id, result), dropped)

    def _check_rate(self, session_key: str) -> None:
        if not self.rate_limit_per_minute:
            return
        now = time.monotonic()
        sent = self._sent[session_key]
        while sent and sent[0] <= now - 60:
            sent.popleft()
        if len(sent) >= self.rate_limit_per_minute:
            wait_s = int(sent[0] + 60 - now) + 1
            raise DeskInputError(
                f"You are sending messages faster than {self.rate_limit_per_minute} a minute; "
                f"please wait {wait_s} s and send again."
            )
        sent.append(now)

    def _finish(self, answer_id: int, result: AnswerResult) -> MessageRow:
        try:
            return self.store.finish_answer(answer_id, result)
        except StoreError:
            log.exception("could not store answer %s (%s)", answer_id, result.status)
            raise


def caption(message: MessageRow, language: str = "en") -> str:
    """The one line shown under an answer, e.g. ``cached 592 / 631 prompt tokens · first token 41 ms · 38 tok/s``."""
    if message.prompt_tokens is None:
        return ""
    if language == "zh":
        return (f"缓存命中 {message.num_cached_tokens} / {message.prompt_tokens} 个提示 token · "
                f"首 token {message.ttft_ms:.0f} ms · {message.decode_tokens_per_s:.0f} tok/s")
    return (f"cached {message.num_cached_tokens} / {message.prompt_tokens} prompt tokens · "
            f"first token {message.ttft_ms:.0f} ms · {message.decode_tokens_per_s:.0f} tok/s")


def _result(text: str, status: str, error: str | None, stats: RequestStats) -> AnswerResult:
    return AnswerResult(
        text=text, status=status, error=error, prompt_tokens=stats.prompt_tokens,
        num_cached_tokens=stats.num_cached_tokens, ttft_ms=round(stats.ttft_ms, 1),
        output_tokens=stats.output_tokens, decode_tokens_per_s=round(stats.decode_tokens_per_s, 1),
    )


def _clean(text: str) -> str:
    """Drop control characters (keeping newlines and tabs) and unpaired surrogates."""
    text = text.encode("utf-8", "replace").decode("utf-8", "replace") if _has_surrogates(text) else text
    return "".join(ch for ch in text if ch in "\n\t" or ch.isprintable() or ch == " ")


def _has_surrogates(text: str) -> bool:
    return any("\ud800" <= ch <= "\udfff" for ch in text)


def _clean_turns(history: Sequence[Turn]) -> list[Turn]:
    return [Turn(t.role, _clean(t.text)) for t in history if t.role in ("user", "assistant") and t.text.strip()]
