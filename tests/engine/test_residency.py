"""The residency mirror (vLLM's KV events replayed in the app) against the engine's own answer.

The engine's truth for a prompt is the ``num_cached_tokens`` of a request with it: whole blocks,
capped below the prompt's last token. Before each probe the mirror predicts that number.
"""

import uuid

from app.core.cache_tree import cache_tree
from app.core.cache_view import template_residency
from app.core.prompts import system_text
from app.engine import RequestStats

from tests.helpers.servers import collect


def send(aio, engine, token_ids, salt=None) -> RequestStats:
    events = aio(collect(engine.stream(token_ids, max_tokens=2, cache_salt=salt, ignore_eos=True)))
    engine.residency.wait_quiet()
    return events[-1]


def predicted(engine, token_ids, salt=None) -> int:
    block = engine.info.block_size
    match = engine.residency.match(token_ids, cache_salt=salt)
    return min(match.resident_tokens, (len(token_ids) - 1) // block * block)


def probe(aio, engine, token_ids, salt=None) -> tuple[int, int]:
    """(what the mirror predicts, what the engine reports) for one request."""
    expected = predicted(engine, token_ids, salt)
    return expected, send(aio, engine, token_ids, salt).num_cached_tokens


def prompt_ids(services, name, message):
    template = services.catalog.get(name)
    return services.prompts.build(system_text(template.chain), [], message).token_ids


SEEDS = {"商城通用规则", "服装鞋包", "电商客服", "电子产品", "support-en"}


def resident(services, engine):
    """Residency of the seeded templates (other tests may add templates of their own)."""
    return {r.name: (r.resident_blocks, r.num_blocks)
            for r in template_residency(catalog=services.catalog, engine=engine) if r.name in SEEDS}


def reset(aio, engine):
    assert aio(engine.reset_prefix_cache()) is True
    engine.residency.wait_quiet()


def test_the_mirror_predicts_every_cached_token_count_through_warmups_salts_and_a_reset(services, engine, aio):
    mirror = engine.residency
    reset(aio, engine)
    assert mirror.num_cached_blocks() == 0
    assert resident(services, engine) == {
        "商城通用规则": (0, 5), "服装鞋包": (0, 8), "电商客服": (0, 32), "电子产品": (0, 9), "support-en": (0, 12),
    }

    # Warm one child: its own 9 prefix blocks, and the 5 it shares with its parent and sibling.
    assert probe(aio, engine, prompt_ids(services, "电子产品", "手机保修多久？")) == (0, 0)
    assert resident(services, engine) == {
        "商城通用规则": (5, 5), "服装鞋包": (5, 8), "电商客服": (0, 32), "电子产品": (9, 9), "support-en": (0, 12),
    }
    assert probe(aio, engine, prompt_ids(services, "服装鞋包", "尺码不合适能换吗？")) == (160, 160)
    assert probe(aio, engine, prompt_ids(services, "电子产品", "屏幕碎了怎么办？")) == (288, 288)
    assert resident(services, engine)["服装鞋包"] == (8, 8)

    # A salted request is its own namespace: the unsalted blocks do not count for it, and back.
    salt = uuid.uuid4().hex
    ids = prompt_ids(services, "support-en", "Where is my order?")
    assert probe(aio, engine, ids, salt) == (0, 0)
    assert resident(services, engine)["support-en"] == (0, 12)
    assert engine.residency.match(ids, cache_salt=salt).resident_blocks == (len(ids) - 1) // 32
    assert probe(aio, engine, ids) == (0, 0)
    assert probe(aio, engine, ids, salt) == ((len(ids) - 1) // 32 * 32,) * 2

    # A reset empties the mirror with the cache (AllBlocksCleared).
    reset(aio, engine)
    assert mirror.num_cached_blocks() == 0
    assert all(r == 0 for r, _ in resident(services, engine).values())
    assert probe(aio, engine, prompt_ids(services, "电子产品", "手机保修多久？")) == (0, 0)
    assert mirror.stats().missed_batches == 0


def test_the_tree_shows_the_shared_parent_with_its_children(services, engine, aio):
    reset(aio, engine)
    send(aio, engine, prompt_ids(services, "电子产品", "手机保修多久？"))
    send(aio, engine, prompt_ids(services, "服装鞋包", "尺码不合适能换吗？"))
    tree = cache_tree(catalog=services.catalog, mirror=engine.residency)
    [root] = tree.roots
    assert ([(t.name, t.resident_blocks, t.num_blocks) for t in root.templates], root.prefix_blocks) == (
        [("商城通用规则", 5, 5)], 5)
    children = {c.templates[0].name: c for c in root.children}
    assert set(children) == {"电子产品", "服装鞋包"}
    # Each child: its own prefix blocks, the table's numbers, and the one conversation turn as a count.
    electronics, apparel = children["电子产品"], children["服装鞋包"]
    assert (electronics.templates[0].resident_blocks, electronics.templates[0].num_blocks) == (9, 9)
    assert (electronics.prefix_blocks, apparel.prefix_blocks) == (9 - 5, 8 - 5)
    # Past the prefix, the full blocks of prompt + answer (2 tokens; the last token's block is not stored).
    beyond = {"电子产品": (len(prompt_ids(services, "电子产品", "手机保修多久？")) + 2 - 1) // 32 - 9,
              "服装鞋包": (len(prompt_ids(services, "服装鞋包", "尺码不合适能换吗？")) + 2 - 1) // 32 - 8}
    assert beyond == {"电子产品": 0, "服装鞋包": 1}  # this question ends inside 电子产品's last prefix block
    assert (electronics.conversations, electronics.conversation_blocks) == (0, 0)
    assert (apparel.conversations, apparel.conversation_blocks) == (1, 1)
    assert (tree.salted_namespaces, tree.other_branches) == (0, 0)
