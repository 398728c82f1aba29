"""The editor's live preview: the exact prefix the chat would send, its size, and cache hazards.

vLLM reuses a block only when every token before it is identical, so anything in a template that
changes from request to request (a date, a clock time, a ``{placeholder}`` filled per customer,
"today") makes the prefix a miss from that point on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from admin.templates import PrefixMeter

# (pattern, kind, why it hurts caching); checked in this order, one warning per distinct match. The console says
# each kind in its own language (i18n "hazard_<kind>"); the English here is cache_hazards' own.
HAZARDS: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (re.compile(r"\{\{?[^{}\n]{1,40}\}?\}|\$\{[^}\n]{1,40}\}|%\([a-z_]+\)s"), "placeholder",
     "looks like a placeholder; if it is filled per request the prefix changes and nothing after it is "
     "cached. Put per-customer facts in the user's message instead"),
    (re.compile(r"\b\d{4}[-/.]\d{1,2}[-/.]\d{1,2}\b|\d{4}年\d{1,2}月(?:\d{1,2}[日号])?"), "date",
     "is a date; if it is updated daily, every update invalidates the cache from this token on"),
    (re.compile(r"\b\d{1,2}:\d{2}(?::\d{2})?\b"), "clock",
     "is a clock time; a time that changes per request can never be cached"),
    (re.compile(r"\b(?:today|tomorrow|yesterday|right now|current (?:date|time)|this week)\b"
                r"|今天|今日|明天|昨天|"
                r"现在时间|当前时间|当前日期|本周", re.IGNORECASE), "today",
     "refers to the current day or time; text that says it is usually updated per request, which breaks caching"),
)


@dataclass(frozen=True)
class Hazard:
    """A piece of a template's text that would change from request to request."""

    line: int  # 1-based
    found: str  # the text matched
    kind: str  # placeholder, date, clock or today


@dataclass(frozen=True)
class Preview:
    rendered: str  # the system segment exactly as the chat renders it (chat template included)
    num_tokens: int
    num_blocks: int  # full KV blocks: the part of the prefix the cache can reuse
    uncached_tail_tokens: int  # tokens after the last full block, recomputed for every request
    warnings: tuple[str, ...]  # the hazards in English (cache_hazards)
    hazards: tuple[Hazard, ...]  # the same, for the console to say in its language
    too_long: str | None  # why it does not fit the context, or None


def preview(*, meter: PrefixMeter, name: str, chain: tuple[str, ...]) -> Preview:
    """Render ``chain`` (ancestor texts, then this template's text) as the chat would send it."""
    from admin.templates import TemplateTooLong

    ids = meter.prefix_ids(chain)
    too_long = None
    try:
        meter.check_fits(name or "new template", chain)
    except TemplateTooLong as exc:
        too_long = str(exc)
    n = len(ids)
    return Preview(
        rendered=meter.prompts.tokenizer.decode(list(ids), skip_special_tokens=False),
        num_tokens=n,
        num_blocks=n // meter.block_size,
        uncached_tail_tokens=n % meter.block_size,
        warnings=cache_hazards(chain[-1] if chain else ""),
        hazards=hazards(chain[-1] if chain else ""),
        too_long=too_long,
    )


def cache_hazards(text: str) -> tuple[str, ...]:
    """One warning in English per distinct piece of ``text`` that would change from request to request."""
    why = {kind: reason for _, kind, reason in HAZARDS}
    return tuple(f"line {h.line}: {h.found!r} {why[h.kind]}." for h in hazards(text))


def hazards(text: str) -> tuple[Hazard, ...]:
    """One Hazard per distinct piece of ``text`` that would change from request to request, in HAZARDS' order."""
    seen: set[str] = set()
    out = []
    for pattern, kind, _ in HAZARDS:
        for match in pattern.finditer(text):
            found = match.group(0)
            if found in seen:
                continue
            seen.add(found)
            out.append(Hazard(text.count("\n", 0, match.start()) + 1, found, kind))
    return tuple(out)
