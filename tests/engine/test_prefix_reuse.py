"""Prefix reuse on the real engine: exact cached-token counts from the tokenizer and block size."""

import uuid

from app.core.prompts import Turn, common_prefix_len, system_text
from app.engine import RequestStats

from tests.helpers.servers import collect


def stats_of(aio, engine, token_ids, salt) -> RequestStats:
    events = aio(collect(engine.stream(token_ids, max_tokens=4, cache_salt=salt, ignore_eos=True)))
    assert isinstance(events[-1], RequestStats)
    return events[-1]


def test_second_request_reuses_the_template_prefix_in_whole_blocks(services, engine, aio):
    # A fresh salt is a fresh cache namespace: nothing any other test did is visible to it.
    salt = uuid.uuid4().hex
    template = services.catalog.get("电商客服")
    system = system_text(template.chain)
    first = services.prompts.build(system, [], "我刚买的手机屏幕碎了能退吗？")
    second = services.prompts.build(system, [], "价格保护怎么申请？")
    block = engine.info.block_size

    shared = common_prefix_len(first.token_ids, second.token_ids)
    assert (first.prefix_tokens, shared, block) == (1042, 1046, 32)  # the system segment, the user turn's opening

    assert stats_of(aio, engine, first.token_ids, salt).num_cached_tokens == 0
    got = stats_of(aio, engine, second.token_ids, salt)
    assert got.num_cached_tokens == 1024  # the 1,046 shared tokens in whole blocks
    assert got.prompt_tokens == len(second.token_ids)
    # The prefix is byte-identical whatever the conversation: history comes after it.
    with_history = services.prompts.build(system, [Turn("user", "你好"), Turn("assistant", "您好")], "发票")
    assert with_history.token_ids[: first.prefix_tokens] == first.token_ids[: first.prefix_tokens]


def test_children_of_one_parent_share_exactly_the_parents_full_blocks(services, engine, aio):
    salt = uuid.uuid4().hex
    parent = services.catalog.get("商城通用规则")
    electronics = services.catalog.get("电子产品")
    apparel = services.catalog.get("服装鞋包")
    assert electronics.chain[0] == parent.chain[0] == apparel.chain[0]
    block = engine.info.block_size

    a = services.prompts.build(system_text(electronics.chain), [], "手机保修多久？")
    b = services.prompts.build(system_text(apparel.chain), [], "手机保修多久？")
    # The parent's tokens: the rendered system header and the parent's own text.
    parent_tokens = common_prefix_len(a.token_ids, services.prompts.prefix_ids(system_text(parent.chain)))
    shared = common_prefix_len(a.token_ids, b.token_ids)
    assert parent_tokens <= shared < min(a.prefix_tokens, b.prefix_tokens)  # the children's own texts differ

    assert stats_of(aio, engine, a.token_ids, salt).num_cached_tokens == 0
    got = stats_of(aio, engine, b.token_ids, salt)
    assert got.num_cached_tokens == parent_tokens // block * block == shared // block * block
    assert got.num_cached_tokens == 160  # this parent text: 185 tokens -> 5 full blocks of 32


def test_cache_salt_isolates_identical_prompts(services, engine, aio):
    template = services.catalog.get("support-en")
    prompt = services.prompts.build(system_text(template.chain), [], "Where is my order?")
    salt_a, salt_b = uuid.uuid4().hex, uuid.uuid4().hex
    block = engine.info.block_size
    assert stats_of(aio, engine, prompt.token_ids, salt_a).num_cached_tokens == 0
    assert stats_of(aio, engine, prompt.token_ids, salt_b).num_cached_tokens == 0
    # The same salt again: everything but the last token comes from the cache, in whole blocks.
    again = stats_of(aio, engine, prompt.token_ids, salt_a).num_cached_tokens
    assert again == (len(prompt.token_ids) - 1) // block * block
