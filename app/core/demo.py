"""The console's demo on the live engine: cold vs warm, and a short A/B of rounds.

Pure asyncio, no UI: the console's Demo tab (or a test, or a script) calls it on the app's own
engine while the app serves. Cold vs warm asks one question in a cache namespace of its own, then a
different question there, so the second request shares only the template with the first; its
cached tokens are the template's full blocks. The A/B's arms send the same questions: the warm arm
in a namespace whose prefix one request computed first, the cold arm giving every request its own
``cache_salt`` so none can reuse a block. Every salt the console's demo uses starts with
``DEMO_SALT_PREFIX``: its blocks never mix with the customers', and the cache page counts them apart.
Nothing here is stored as a customer's answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from app.core.prompts import PromptBuilder, common_prefix_len, system_text
from app.engine import Delta, Engine, RequestStats

DEMO_SALT_PREFIX = "demo-"
# A question for the cold run and a different one for the warm run, in a template's language: they differ
# from their first character, so the two prompts share the template and the chat's user header, no more.
DEMO_QUESTIONS = {
    "zh": ("我昨天买的蓝牙耳机外壳有划痕，可以退货吗？", "请问价格保护怎么申请？"),
    "en": ("My parcel has not arrived after ten days. What can I do?", "Can I return shoes I wore once?"),
}

# Customers' questions, as the article's users ask them: distinct, 20-40 tokens, about an order.
PRODUCTS = ("蓝牙耳机", "智能手机", "羽绒服", "运动鞋", "电饭煲", "笔记本电脑", "洗面奶", "行李箱",
             "护眼台灯", "儿童积木", "机械键盘", "空气炸锅", "登山背包", "真丝围巾", "扫地机器人", "保温杯")
ISSUES = ("收到后发现外壳有划痕", "尺码偏小穿不上", "到现在还没有发货", "物流三天没有更新",
           "今天降价了一百块", "需要开增值税专用发票", "外包装破损严重", "少发了一个充电器",
           "用了两天就无法开机", "颜色和商品页图片不一样")
ASKS = ("应该怎么处理", "可以退货吗", "运费由谁承担", "退款多久能到账", "需要提供什么材料",
         "能不能换一个新的", "可以申请价保吗", "能帮我催一下吗")
EN_PRODUCTS = ("wireless earbuds", "smartphone", "down jacket", "pair of running shoes", "rice cooker", "laptop",
               "face wash", "suitcase", "desk lamp", "box of building blocks", "mechanical keyboard", "air fryer",
               "hiking backpack", "silk scarf", "robot vacuum", "travel mug")
EN_ISSUES = ("the case arrived scratched", "it is a size too small", "it has not shipped yet",
             "the tracking has not moved in three days", "the price dropped by 100 today", "I need a VAT invoice",
             "the box arrived badly damaged", "the charger is missing", "it stopped turning on after two days",
             "the colour differs from the photos")
EN_ASKS = ("what should I do", "can I return it", "who pays the shipping", "when will my refund arrive",
           "what documents do you need", "can I get a new one", "can I claim price protection",
           "can you chase it for me")


def demo_questions(language: str) -> tuple[str, str]:
    """The cold run's and the warm run's default questions for a template in ``language`` (zh or en)."""
    return DEMO_QUESTIONS.get(language, DEMO_QUESTIONS["zh"])


def customer_questions(n: int, *, seed: int = 0, language: str = "zh") -> list[str]:
    """``n`` distinct customer questions of 20-40 tokens (Qwen tokenizer), like the article's users, in
    Chinese or (``language="en"``) English."""
    rng = random.Random(seed)
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < n:
        if language == "en":
            q = (f"Hi, I bought a {rng.choice(EN_PRODUCTS)} {rng.randint(2, 29)} days ago (order ending "
                 f"{rng.randint(0, 9999):04d}) and {rng.choice(EN_ISSUES)}; {rng.choice(EN_ASKS)}?")
        else:
            q = (f"你好，我{rng.randint(1, 29)}天前买的{rng.choice(PRODUCTS)}（订单尾号{rng.randint(0, 9999):04d}）"
                 f"{rng.choice(ISSUES)}，请问{rng.choice(ASKS)}？")
        if q not in seen:
            seen.add(q)
            out.append(q)
    return out


@dataclass(frozen=True)
class ArmResult:
    """One arm of the A/B: per-request first-token times and cached tokens, in request order."""

    ttft_ms: tuple[float, ...]
    num_cached_tokens: tuple[int, ...]
    prompt_tokens: tuple[int, ...]
    output_tokens: int
    wall_s: float

    @property
    def req_per_s(self) -> float:
        return len(self.ttft_ms) / self.wall_s if self.wall_s else 0.0

    @property
    def output_tok_per_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s else 0.0


@dataclass(frozen=True)
class ABResult:
    """Warm prefix (A) against unique cache salts (B) on the same engine, questions and settings."""

    prefix_tokens: int  # tokens of the template's system segment
    warm: ArmResult
    cold: ArmResult

    @property
    def ttft_speedup(self) -> float:
        """Median cold TTFT over median warm TTFT."""
        return _median(self.cold.ttft_ms) / _median(self.warm.ttft_ms)

    @property
    def throughput_ratio(self) -> float:
        return self.warm.req_per_s / self.cold.req_per_s if self.cold.req_per_s else 0.0


async def run_ab(engine: Engine, prompts: PromptBuilder, template_chain: Sequence[str], n_requests: int = 8, *,
                 concurrency: int = 4, max_tokens: int = 16, questions: Sequence[str] | None = None,
                 warm_salt: str | None = None, salt_prefix: str = "ab-") -> ABResult:
    """Run ``n_requests`` questions twice on ``engine``: prefix warm (A), then each with a fresh salt (B).

    The warm arm first computes the prefix with one 1-token request, in the namespace ``warm_salt``
    (None: the customers' own). Cold salts start with ``salt_prefix``. Both arms run ``concurrency``
    requests at a time and ignore EOS, so every answer is ``max_tokens`` long. Raises ValueError for
    fewer than one request, and the engine's own errors (EngineBusy, EngineError) as they come.
    """
    if n_requests < 1 or concurrency < 1:
        raise ValueError("run_ab needs at least one request and a concurrency of at least one")
    system = system_text(template_chain)
    qs = list(questions) if questions is not None else customer_questions(n_requests, seed=11)
    if len(qs) < n_requests:
        raise ValueError(f"run_ab got {len(qs)} questions for {n_requests} requests")
    token_ids = [prompts.build(system, [], q).token_ids for q in qs[:n_requests]]
    warm_up = prompts.build(system, [], "你好")
    await _one(engine, warm_up.token_ids, 1, warm_salt)
    warm = await _arm(engine, token_ids, max_tokens, concurrency, salt=lambda i: warm_salt)
    run_id = uuid.uuid4().hex[:12]
    cold = await _arm(engine, token_ids, max_tokens, concurrency, salt=lambda i: f"{salt_prefix}{run_id}-{i}")
    return ABResult(prefix_tokens=warm_up.prefix_tokens, warm=warm, cold=cold)


@dataclass(frozen=True)
class ABRounds:
    """Several A/B rounds: the headline is the median of the rounds' speed-ups, with their spread."""

    rounds: tuple[ABResult, ...]

    @property
    def speedups(self) -> tuple[float, ...]:
        return tuple(r.ttft_speedup for r in self.rounds)

    @property
    def median_speedup(self) -> float:
        return _median(self.speedups)

    @property
    def spread(self) -> tuple[float, float]:
        """The lowest and highest round's speed-up."""
        return min(self.speedups), max(self.speedups)

    @property
    def warm_ttft_ms(self) -> tuple[float, ...]:
        return tuple(ms for r in self.rounds for ms in r.warm.ttft_ms)

    @property
    def cold_ttft_ms(self) -> tuple[float, ...]:
        return tuple(ms for r in self.rounds for ms in r.cold.ttft_ms)


async def ab_rounds(engine: Engine, prompts: PromptBuilder, template_chain: Sequence[str], *, rounds: int = 5,
                    per_round: int = 4, concurrency: int = 1, max_tokens: int = 16,
                    language: str = "zh") -> AsyncIterator[ABRounds]:
    """``rounds`` A/B runs of ``per_round`` requests per arm, each round with other questions (in
    ``language``), in the demo's own namespaces; yields the rounds so far after each round.

    One request at a time by default: a first-token time is then the engine's, not a queue's, and
    the median over rounds moves little from run to run.
    """
    questions = customer_questions(rounds * per_round, seed=11, language=language)
    done: list[ABResult] = []
    run_id = uuid.uuid4().hex[:8]
    for r in range(rounds):
        qs = questions[r * per_round:(r + 1) * per_round]
        done.append(await run_ab(engine, prompts, template_chain, per_round, concurrency=concurrency,
                                 max_tokens=max_tokens, questions=qs, warm_salt=f"{DEMO_SALT_PREFIX}ab-{run_id}-{r}",
                                 salt_prefix=f"{DEMO_SALT_PREFIX}ab-{run_id}-{r}-cold-"))
        yield ABRounds(tuple(done))


async def run_ab_rounds(engine: Engine, prompts: PromptBuilder, template_chain: Sequence[str], *, rounds: int = 5,
                        per_round: int = 4, concurrency: int = 1, max_tokens: int = 16,
                        language: str = "zh") -> ABRounds:
    """``ab_rounds`` to its end: every round."""
    last = ABRounds(())
    async for last in ab_rounds(engine, prompts, template_chain, rounds=rounds, per_round=per_round,
                                concurrency=concurrency, max_tokens=max_tokens, language=language):
        pass
    return last


@dataclass(frozen=True)
class Asked:
    question: str
    text: str
    stats: RequestStats


@dataclass(frozen=True)
class ColdWarm:
    """Two questions in a fresh cache namespace: the first computes everything, the second reuses the template."""

    prefix_tokens: int  # the template's system segment
    shared_tokens: int  # leading tokens the two prompts have in common: all the warm run can reuse
    block_size: int
    cold: Asked
    warm: Asked | None  # None while the warm question is still being asked

    @property
    def prefix_blocks(self) -> int:
        """Full KV blocks of the template: the warm run's cached tokens, when only the template is shared."""
        return self.prefix_tokens // self.block_size

    @property
    def shared_blocks(self) -> int:
        return self.shared_tokens // self.block_size

    @property
    def speedup(self) -> float:
        if self.warm is None or not self.warm.stats.ttft_ms:
            return 0.0
        return self.cold.stats.ttft_ms / self.warm.stats.ttft_ms


class SameQuestion(ValueError):
    """The warm run must ask another question than the cold one, or it would reuse the question too."""


async def cold_then_warm(engine: Engine, prompts: PromptBuilder, template_chain: Sequence[str], cold_question: str,
                         warm_question: str, *, max_tokens: int = 64) -> AsyncIterator[ColdWarm]:
    """Ask ``cold_question`` in a namespace of its own (a fresh ``cache_salt``: a reset for these requests
    alone, so customers keep their cache), then ``warm_question`` there; yields after each answer.
    Raises SameQuestion when the two are the same."""
    if cold_question.strip() == warm_question.strip():
        raise SameQuestion("Ask the warm run a different question, so that only the template is shared.")
    system = system_text(template_chain)
    cold_prompt = prompts.build(system, [], cold_question)
    warm_ids = prompts.build(system, [], warm_question).token_ids
    salt = f"{DEMO_SALT_PREFIX}{uuid.uuid4().hex}"
    shared = common_prefix_len(cold_prompt.token_ids, warm_ids)
    text, stats = await _answer(engine, cold_prompt.token_ids, max_tokens, salt)
    cold = Asked(cold_question, text, stats)
    done = ColdWarm(cold_prompt.prefix_tokens, shared, engine.info.block_size, cold, None)
    yield done
    text, stats = await _answer(engine, warm_ids, max_tokens, salt)
    yield ColdWarm(done.prefix_tokens, shared, done.block_size, cold, Asked(warm_question, text, stats))


async def cold_vs_warm(engine: Engine, prompts: PromptBuilder, template_chain: Sequence[str], cold_question: str,
                       warm_question: str, *, max_tokens: int = 64) -> ColdWarm:
    """``cold_then_warm`` to its end: both answers."""
    last = None
    async for last in cold_then_warm(engine, prompts, template_chain, cold_question, warm_question,
                                     max_tokens=max_tokens):
        pass
    assert last is not None and last.warm is not None
    return last


async def _answer(engine: Engine, token_ids: list[int], max_tokens: int, salt: str) -> tuple[str, RequestStats]:
    text, stats = "", None
    async with contextlib.aclosing(engine.stream(token_ids, max_tokens=max_tokens, cache_salt=salt)) as stream:
        async for event in stream:
            if isinstance(event, Delta):
                text += event.text
            else:
                stats = event
    assert stats is not None  # Engine.stream always ends with its stats
    return text, stats


async def _arm(engine: Engine, token_ids: list[list[int]], max_tokens: int, concurrency: int,
               salt: Callable[[int], str | None]) -> ArmResult:
    gate = asyncio.Semaphore(concurrency)
    started = time.perf_counter()

    async def limited(i: int) -> tuple[float, RequestStats]:
        async with gate:
            return await _one(engine, token_ids[i], max_tokens, salt(i))

    results = await asyncio.gather(*(limited(i) for i in range(len(token_ids))))
    wall = time.perf_counter() - started
    return ArmResult(
        ttft_ms=tuple(ttft for ttft, _ in results),
        num_cached_tokens=tuple(s.num_cached_tokens for _, s in results),
        prompt_tokens=tuple(s.prompt_tokens for _, s in results),
        output_tokens=sum(s.output_tokens for _, s in results),
        wall_s=wall,
    )


async def _one(engine: Engine, token_ids: list[int], max_tokens: int, salt: str | None) -> tuple[float, RequestStats]:
    stats = None
    stream = engine.stream(token_ids, max_tokens=max_tokens, cache_salt=salt, ignore_eos=True)
    async with contextlib.aclosing(stream):
        async for event in stream:
            if isinstance(event, RequestStats):
                stats = event
            elif not isinstance(event, Delta):
                raise TypeError(f"unexpected engine event {event!r}")
    assert stats is not None  # Engine.stream always ends with its stats
    return stats.ttft_ms, stats


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
