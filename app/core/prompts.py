"""Prompt assembly: a template chain and a conversation become the exact token ids sent to vLLM.

vLLM reuses KV blocks only when their tokens are identical, so a template's system prompt must
render byte-identically for every request: the system segment is tokenized on its own and always
placed first. Everything after it is text from customers (and, through the APIs, from clients),
so it is tokenized with special tokens split: a typed ``<|im_end|>`` is text, never the control
token that ends a turn. Only the chat template's own pieces around each message are control.

Most chat templates (ChatML among them) frame each message on its own: the conversation renders
as the system segment, then ``pre(role) + content + post(role)`` per message, then the generation
prompt. ``PromptBuilder`` checks that once with probes; for such templates each message is
tokenized once and the oldest turns are dropped by summing their lengths (linear in the
conversation). For other templates it renders the whole conversation with sentinels and halves
the dropped range until it fits (a few renders, not one per dropped turn).
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from app.core.refusals import Refused

PARENT_SEPARATOR = "\n\n"
MIN_ANSWER_TOKENS = 16


class PromptError(Refused, ValueError):
    """The prompt cannot be built (``code``: app/core/refusals.py); the message says what the user or operator
    should do."""

    def __init__(self, code: str, **params):
        super().__init__(self._refuse(code, params))


class PromptTooLong(PromptError):
    def __init__(self, code: str, *, num_tokens: int, limit: int):
        super().__init__(code, num_tokens=num_tokens, limit=limit, over=num_tokens - limit)
        self.num_tokens = num_tokens
        self.limit = limit


class PrefixUnstable(PromptError):
    """The model's chat template puts something variable before or inside the system prompt."""

    def __init__(self) -> None:
        super().__init__("prefix_unstable")


@dataclass(frozen=True)
class Turn:
    role: str  # "user" or "assistant"
    text: str


@dataclass(frozen=True)
class Prompt:
    token_ids: list[int]
    prefix_tokens: int  # tokens of the system segment, shared by every request of the template
    dropped_turns: int  # oldest exchanges left out to fit the context
    max_tokens: int  # answer budget left by the context


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading token ids ``a`` and ``b`` share: the most a prefix cache can reuse between them."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def system_text(chain: Sequence[str]) -> str:
    """A template's system prompt: its ancestors' texts first, then its own, root first."""
    return PARENT_SEPARATOR.join(text.strip() for text in chain)


class PromptBuilder:
    """Renders prompts with the model's own chat template and tokenizer."""

    def __init__(self, tokenizer_path: str | Path, *, max_model_len: int, max_tokens: int,
                 drop_oldest_turns: bool, trust_remote_code: bool = False):
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_path), trust_remote_code=trust_remote_code)
        self.max_model_len = max_model_len
        self.max_tokens = max_tokens
        self.drop_oldest_turns = drop_oldest_turns
        self._sentinel = f"\ue000pd{secrets.token_hex(6)}\ue001"  # a private-use marker no text contains
        self.framed = self._check_framed()

    # -- public ------------------------------------------------------------------------------

    def count(self, text: str) -> int:
        return len(self._encode(text))

    @functools.lru_cache(maxsize=256)
    def prefix_ids(self, system: str) -> tuple[int, ...]:
        """Token ids of the rendered system segment; raises PrefixUnstable if it is not fixed."""
        segment = self._render([{"role": "system", "content": system}], add_generation_prompt=False)
        for probe in ("a", "b"):
            full = self._render([{"role": "system", "content": system}, {"role": "user", "content": probe}])
            if not full.startswith(segment):
                raise PrefixUnstable()
        return tuple(self._encode(segment))

    def content_ids(self, text: str) -> list[int]:
        """Token ids of text from a customer or client: special tokens in it are plain text."""
        return list(self.tokenizer(text, add_special_tokens=False, split_special_tokens=True).input_ids)

    def build(self, system: str, history: Sequence[Turn], message: str) -> Prompt:
        """Token ids for ``system`` + ``history`` + ``message``, oldest exchanges dropped if allowed.

        Raises PromptTooLong with the numbers when the message (or, without dropping, the
        conversation) does not fit in max_model_len with room for an answer.
        """
        prefix = list(self.prefix_ids(system))
        turns = [Turn(t.role, t.text.strip()) for t in history]
        message = message.strip()
        fit = self._fit_framed if self.framed else self._fit_rendered
        ids, dropped = fit(system, prefix, turns, message)
        return Prompt(token_ids=ids, prefix_tokens=len(prefix), dropped_turns=dropped,
                      max_tokens=min(self.max_tokens, self.max_model_len - len(ids)))

    def build_continuation(self, system: str, history: Sequence[Turn], partial: str) -> Prompt:
        """Token ids that go on with ``partial``, the conversation's last answer, as the same answer: ``system``
        + ``history`` (ending with its question), then the answer's own opening and its text so far, with no end
        of turn and no new question (what transformers calls continue_final_message). Raises PromptTooLong when
        it does not fit, PromptError("not_continuable") for a chat template that does not frame messages."""
        if not self.framed:
            raise PromptError("not_continuable")
        prefix = list(self.prefix_ids(system))
        pre, _ = self._frame("assistant")
        tail = [*pre, *self.content_ids(partial)]
        turns = [Turn(t.role, t.text.strip()) for t in history]
        ids, dropped = self._fit_framed(system, prefix, turns, "", tail=tail)
        return Prompt(token_ids=ids, prefix_tokens=len(prefix), dropped_turns=dropped,
                      max_tokens=min(self.max_tokens, self.max_model_len - len(ids)))

    # -- fitting -----------------------------------------------------------------------------

    @property
    def _limit(self) -> int:
        return self.max_model_len - MIN_ANSWER_TOKENS

    def _fit_framed(self, system: str, prefix: list[int], turns: list[Turn], message: str, *,
                    tail: list[int] | None = None) -> tuple[list[int], int]:
        """``tail``: what ends the prompt in place of ``message`` as a new question (a continued answer)."""
        tail = tail if tail is not None else self._message_ids("user", message) + self._generation_ids()
        budget = self._limit - len(prefix) - len(tail)
        if budget < 0:
            self._too_long_message(len(prefix) + len(tail))
        # Newest first: turns that can never fit are not even tokenized.
        kept: list[list[int]] = []
        used = 0
        start = len(turns)
        while start > 0:
            ids = self._message_ids(turns[start - 1].role, turns[start - 1].text)
            if used + len(ids) > budget:
                break
            kept.append(ids)
            used += len(ids)
            start -= 1
        start = _exchange_start(turns, start)
        if start and not self.drop_oldest_turns:
            needed = len(prefix) + len(tail) + used + sum(len(self._message_ids(t.role, t.text)) for t in turns[:start])
            self._too_long_conversation(needed)
        ids = list(prefix)
        for chunk in reversed(kept[:len(turns) - start]):
            ids += chunk
        return ids + tail, _exchanges(turns[:start])

    def _fit_rendered(self, system: str, prefix: list[int], turns: list[Turn], message: str) -> tuple[list[int], int]:
        def ids_from(start: int) -> list[int]:
            return prefix + self._rest_ids(system, turns[start:], message)

        ids = ids_from(0)
        if len(ids) <= self._limit:
            return ids, 0
        if not self.drop_oldest_turns:
            self._too_long_conversation(len(ids))
        last = ids_from(len(turns))
        if len(last) > self._limit:
            self._too_long_message(len(last))
        # The smallest start that fits: dropping more never makes a prompt longer.
        lo, hi = 1, len(turns)
        while lo < hi:
            mid = (lo + hi) // 2
            if len(ids_from(_exchange_start(turns, mid))) <= self._limit:
                hi = mid
            else:
                lo = mid + 1
        start = _exchange_start(turns, lo)
        return ids_from(start), _exchanges(turns[:start])

    def _too_long_message(self, num_tokens: int) -> None:
        raise PromptTooLong("message_too_long", num_tokens=num_tokens, limit=self._limit)

    def _too_long_conversation(self, num_tokens: int) -> None:
        raise PromptTooLong("conversation_too_long", num_tokens=num_tokens, limit=self._limit)

    # -- rendering ---------------------------------------------------------------------------

    @functools.lru_cache(maxsize=8)
    def _frame(self, role: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The chat template's own token ids before and after a ``role`` message's content."""
        system = [{"role": "system", "content": "s"}]
        segment = self._render(system, add_generation_prompt=False)
        one = self._render(system + [{"role": role, "content": self._sentinel}], add_generation_prompt=False)
        pre, _, post = one[len(segment):].partition(self._sentinel)
        return tuple(self._encode(pre)), tuple(self._encode(post))

    @functools.lru_cache(maxsize=1)
    def _generation_ids(self) -> list[int]:
        system = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
        closed = self._render(system, add_generation_prompt=False)
        return self._encode(self._render(system)[len(closed):])

    def _message_ids(self, role: str, text: str) -> list[int]:
        pre, post = self._frame(role)
        return [*pre, *self.content_ids(text), *post]

    def _rest_ids(self, system: str, turns: Sequence[Turn], message: str) -> list[int]:
        """Everything after the system segment, rendered whole: template pieces as control tokens,
        message contents as text."""
        contents = [t.text for t in turns] + [message]
        messages = [{"role": "system", "content": system}]
        messages += [{"role": t.role, "content": f"{self._sentinel}{i}{self._sentinel}"} for i, t in enumerate(turns)]
        messages.append({"role": "user", "content": f"{self._sentinel}{len(turns)}{self._sentinel}"})
        segment = self._render(messages[:1], add_generation_prompt=False)
        parts = self._render(messages)[len(segment):].split(self._sentinel)
        ids: list[int] = []
        for i, part in enumerate(parts):  # template, index, template, index, ..., template
            ids += self.content_ids(contents[int(part)]) if i % 2 else self._encode(part)
        return ids

    def _check_framed(self) -> bool:
        """Whether the chat template frames each message on its own (see the module docstring)."""
        turns = [Turn("user", "甲 a"), Turn("assistant", "乙 b"), Turn("user", "丙 c")]
        try:
            framed = [t for turn in turns[:-1] for t in self._message_ids(turn.role, turn.text)]
            framed += self._message_ids("user", turns[-1].text) + self._generation_ids()
            return framed == self._rest_ids("s", turns[:-1], turns[-1].text)
        except Exception:  # a template that refuses a lone message cannot be framed
            return False

    def _render(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)


def _exchange_start(turns: Sequence[Turn], start: int) -> int:
    """The first index at or after ``start`` where a kept history can begin: a user turn."""
    while start < len(turns) and turns[start].role != "user":
        start += 1
    return start


def _exchanges(dropped: Sequence[Turn]) -> int:
    """How many exchanges ``dropped`` holds: a user turn with the answers after it, or a lone answer."""
    count, i = 0, 0
    while i < len(dropped):
        i += 2 if dropped[i].role == "user" and i + 1 < len(dropped) and dropped[i + 1].role == "assistant" else 1
        count += 1
    return count
