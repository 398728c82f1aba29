"""Prompt assembly: a template chain and a conversation become the exact token ids sent to vLLM.

vLLM reuses KV blocks only when their tokens are identical, so a template's system prompt must
render byte-identically for every request. The system segment is therefore tokenized on its own
and always placed first; the turns that follow are tokenized after it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

PARENT_SEPARATOR = "\n\n"
MIN_ANSWER_TOKENS = 16


class PromptError(ValueError):
    """The prompt cannot be built; the message says what the user or operator should do."""


class PromptTooLong(PromptError):
    def __init__(self, message: str, *, num_tokens: int, limit: int):
        super().__init__(message)
        self.num_tokens = num_tokens
        self.limit = limit


class PrefixUnstable(PromptError):
    """The model's chat template puts something variable before or inside the system prompt."""


@dataclass(frozen=True)
class Turn:
    role: str  # "user" or "assistant"
    text: str


@dataclass(frozen=True)
class Prompt:
    token_ids: list[int]
    prefix_tokens: int  # tokens of the system segment, shared by every request of the template
    dropped_turns: int  # oldest history turns left out to fit the context
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

    def count(self, text: str) -> int:
        return len(self._encode(text))

    @functools.lru_cache(maxsize=256)
    def prefix_ids(self, system: str) -> tuple[int, ...]:
        """Token ids of the rendered system segment; raises PrefixUnstable if it is not fixed."""
        segment = self._render([{"role": "system", "content": system}], add_generation_prompt=False)
        for probe in ("a", "b"):
            full = self._render([{"role": "system", "content": system}, {"role": "user", "content": probe}])
            if not full.startswith(segment):
                raise PrefixUnstable(
                    "the model's chat template renders the system prompt differently from request to "
                    "request, so it can never be cached; use a chat template without dates or defaults"
                )
        return tuple(self._encode(segment))

    def build(self, system: str, history: Sequence[Turn], message: str) -> Prompt:
        """Token ids for ``system`` + ``history`` + ``message``, oldest turns dropped if allowed.

        Raises PromptTooLong with the numbers when the message (or, without dropping, the
        conversation) does not fit in max_model_len with room for an answer.
        """
        prefix = list(self.prefix_ids(system))
        limit = self.max_model_len - MIN_ANSWER_TOKENS
        turns = list(history)
        dropped = 0
        while True:
            rest = self._render_rest(system, turns, message)
            ids = prefix + self._encode(rest)
            if len(ids) <= limit:
                break
            if not turns:
                over = len(ids) - limit
                raise PromptTooLong(
                    f"This message is too long: with the system prompt it needs {len(ids):,} tokens, "
                    f"{over:,} more than the {limit:,} this model allows. Please shorten it.",
                    num_tokens=len(ids), limit=limit,
                )
            if not self.drop_oldest_turns:
                raise PromptTooLong(
                    f"This conversation is too long for the model ({len(ids):,} tokens, limit {limit:,}). "
                    "Please start a new conversation.",
                    num_tokens=len(ids), limit=limit,
                )
            # Drop a whole exchange so the history still starts with a user turn.
            turns = turns[2:] if len(turns) > 1 and turns[1].role == "assistant" else turns[1:]
            dropped += 1
        return Prompt(
            token_ids=ids,
            prefix_tokens=len(prefix),
            dropped_turns=dropped,
            max_tokens=min(self.max_tokens, self.max_model_len - len(ids)),
        )

    def _render_rest(self, system: str, turns: Sequence[Turn], message: str) -> str:
        messages = [{"role": "system", "content": system}]
        messages += [{"role": t.role, "content": t.text} for t in turns]
        messages.append({"role": "user", "content": message})
        full = self._render(messages)
        segment = self._render(messages[:1], add_generation_prompt=False)
        return full[len(segment):]

    def _render(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)
