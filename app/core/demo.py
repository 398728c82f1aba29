"""The console's demo on the live engine: one question cold vs warm, and a short A/B of rounds.

Pure asyncio, no UI: the console's Demo tab (or a test, or a script) calls it on the app's own
engine while the app serves. Cold vs warm asks in a cache namespace of its own; the A/B's arms send
the same questions, the cold arm giving every request its own ``cache_salt`` so none can reuse a block.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from app.core.prompts import PromptBuilder, system_text
from app.engine import Delta, Engine, RequestStats

# Customers' questions, as the article's users ask them: distinct, 20-40 tokens, about an order.
PRODUCTS = ("蓝牙耳机", "智能手机", "羽绒服", "运动鞋", "电饭煲", "笔记本电脑", "洗面奶", "行李箱",
             "护眼台灯", "儿童积木", "机械键盘", "空气炸锅", "登山背包", "真丝围巾", "扫地机器人", "保温杯")
ISSUES = ("收到后发现外壳有划痕", "尺码偏小穿不上", "到现在还没有发货", "物流三天没有更新",
           "今天降价了一百块", "需要开增值税专用发票", "外包装破损严重", "少发了一个充电器",
           "用了两天就无法开机", "颜色和商品页图片不一样")
ASKS = ("应该怎么处理", "可以退货吗", "运费由谁承担", "退款多久能到账", "需要提供什么材料",
         "能不能换一个新的", "可以申请价保吗", "能帮我催一下吗")


def customer_questions(n: int, *, seed: int = 0) -> list[str]:
    """``n`` distinct customer questions of 20-40 tokens (Qwen tokenizer), like the article's users."""
    rng = random.Random(seed)
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < n:
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
                 concurrency: int = 4, max_tokens: int = 16, questions: Sequence[str] | None = None) -> ABResult:
    """Run ``n_requests`` questions twice on ``engine``: prefix warm (A), then each with a fresh salt (B).

    The warm arm first computes the prefix with one 1-token request. Both arms run ``concurrency``
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
    await _one(engine, warm_up.token_ids, 1, None)
    warm = await _arm(engine, token_ids, max_tokens, concurrency, salted=False)
    cold = await _arm(engine, token_ids, max_tokens, concurrency, salted=True)
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


async def run_ab_rounds(engine: Engine, prompts: PromptBuilder, template_chain: Sequence[str], *, rounds: int = 5,
                        per_round: int = 4, concurrency: int = 1, max_tokens: int = 16) -> ABRounds:
    """``rounds`` A/B runs of ``per_round`` requests per arm, each round with other questions.

    One request at a time by default: a first-token time is then the engine's, not a queue's, and
    the median over rounds moves little from run to run.
    """
    questions = customer_questions(rounds * per_round, seed=11)
    done = []
    for r in range(rounds):
        qs = questions[r * per_round:(r + 1) * per_round]
        done.append(await run_ab(engine, prompts, template_chain, per_round, concurrency=concurrency,
                                 max_tokens=max_tokens, questions=qs))
    return ABRounds(tuple(done))


@dataclass(frozen=True)
class ColdWarm:
    """One question asked twice in a fresh cache namespace: first everything is computed, then reused."""

    question: str
    cold: RequestStats
    warm: RequestStats
    cold_text: str
    warm_text: str

    @property
    def speedup(self) -> float:
        return self.cold.ttft_ms / self.warm.ttft_ms if self.warm.ttft_ms else 0.0


async def cold_vs_warm(engine: Engine, prompts: PromptBuilder, template_chain: Sequence[str], question: str, *,
                       max_tokens: int = 64) -> ColdWarm:
    """Ask ``question`` in a namespace of its own (a fresh ``cache_salt``: a reset for these two requests
    alone, so other customers keep their cache), then ask it again there."""
    ids = prompts.build(system_text(template_chain), [], question).token_ids
    salt = f"demo-{uuid.uuid4().hex}"
    cold_text, cold = await _answer(engine, ids, max_tokens, salt)
    warm_text, warm = await _answer(engine, ids, max_tokens, salt)
    return ColdWarm(question, cold, warm, cold_text, warm_text)


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
               salted: bool) -> ArmResult:
    run_id = uuid.uuid4().hex[:12]
    gate = asyncio.Semaphore(concurrency)
    started = time.perf_counter()

    async def limited(i: int) -> tuple[float, RequestStats]:
        async with gate:
            return await _one(engine, token_ids[i], max_tokens, f"ab-{run_id}-{i}" if salted else None)

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
