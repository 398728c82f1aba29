"""The cache view's numbers, from real requests stored in a fresh database."""

import re
import uuid
from datetime import timedelta

import pytest
from sqlalchemy import update

from app import template_files
from app.core.background import CacheSampler
from app.core.cache_view import read_cache_view
from app.core.catalog import TemplateCatalog
from app.core.desk import Finished
from app.core.prompts import system_text
from app.db import metrics as db_metrics
from app.db import open_database
from app.db import templates as db_templates
from app.db.models import Message, utcnow
from app.db.rows import TtftSplit
from tests.helpers.browser import DESKTOP, PHONE, admin_page, assert_tidy, picture, resize, screenshot, table_rows
from tests.helpers.desks import desk_for
from tests.helpers.servers import OUTPUT_DIR, collect, operator
from tests.helpers.waiting import eventually, wait_until


@pytest.fixture()
def fresh_desk(services, tmp_path):
    """The session engine and prompts with a database of their own, so every stored row is ours."""
    db = open_database(f"sqlite:///{tmp_path / 'view.db'}")
    db.run(db_templates.seed, template_files.read_folder(services.settings.templates_dir))
    catalog = TemplateCatalog(db, services.prompts)
    catalog.load()
    yield desk_for(services, db=db, catalog=catalog, tenant_secret="view")
    db.close()


def ask(aio, desk, template, message, tenant=""):
    events = aio(collect(desk.answer(session_key="view", client="192.0.2.30", template_name=template, message=message,
                                     tenant=tenant, max_tokens=2, ignore_eos=True)))
    assert isinstance(events[-1], Finished)
    return events[-1].message


def test_per_template_hit_rate_is_cached_over_prompt_tokens_of_the_stored_answers(fresh_desk, aio):
    salt = uuid.uuid4().hex  # a tenant of its own: a namespace no other test has warmed
    electronics = [ask(aio, fresh_desk, "电子产品", q, salt) for q in ("手机保修多久？", "屏幕碎了怎么办？", "电池能换吗？")]
    english = [ask(aio, fresh_desk, "support-en", q, salt) for q in ("Where is my order?", "How do refunds work?")]
    # First request of each template misses; the later ones reuse its 9 (12) prefix blocks of 32 tokens.
    assert [m.num_cached_tokens for m in electronics] == [0, 288, 288]
    assert [m.num_cached_tokens for m in english] == [0, 384]

    usage = fresh_desk.db.run(db_metrics.template_usage)
    assert set(usage) == {"电子产品", "support-en"}
    for name, rows in (("电子产品", electronics), ("support-en", english)):
        prompt = sum(m.prompt_tokens for m in rows)
        cached = sum(m.num_cached_tokens for m in rows)
        assert usage[name] == (len(rows), prompt, cached)

    # Known first-token times on the stored answers (misses 100 and 300 ms, hits 10, 30 and 20 ms): the medians
    # of each kind are then known too.
    known_ms = dict(zip((m.id for m in electronics + english), (100.0, 10.0, 30.0, 300.0, 20.0)))
    fresh_desk.db.run(lambda s: [s.execute(update(Message).where(Message.id == i).values(ttft_ms=ms))
                                 for i, ms in known_ms.items()])
    ttft = fresh_desk.db.run(db_metrics.ttft_split, since=utcnow() - timedelta(minutes=5))
    assert ttft == TtftSplit(hit_p50_ms=20.0, miss_p50_ms=200.0, num_hits=3, num_misses=2)


def test_a_reading_adds_up_and_survives_in_the_samples_table(fresh_desk, aio):
    engine = fresh_desk.engine
    engine.residency.wait_quiet()
    before = aio(read_cache_view(engine=engine, db=fresh_desk.db))
    asked = ask(aio, fresh_desk, "电子产品", "包邮吗？", uuid.uuid4().hex)  # a new salt: every block is new
    engine.residency.wait_quiet()

    def reading():
        view = aio(read_cache_view(engine=engine, db=fresh_desk.db))
        return view, (view.queries - before.queries, view.hits - before.hits, view.blocks_cached - before.blocks_cached,
                      view.prompt_tokens.computed - before.prompt_tokens.computed,
                      view.prompt_tokens.local_cache_hit - before.prompt_tokens.local_cache_hit)

    # vLLM counts the request's queries and hits a step after it, and caches every full block of the tokens it
    # computed: the prompt and the first of its 2 answer tokens; every prompt token was computed, none came from
    # the cache.
    added = (asked.prompt_tokens, 0, (asked.prompt_tokens + 1) // 32, asked.prompt_tokens, 0)
    assert eventually(lambda: reading()[1], added) == added
    view = reading()[0]
    assert (view.num_blocks, view.block_size) == (4096, 32)  # 64 MiB of 32-token blocks
    assert (view.blocks_used, view.running) == (0, 0)  # nothing runs between requests
    # Every usable block in one state: nothing held between requests, so the cached ones are all evictable, and
    # vLLM's "free" is the empty and the evictable ones together.
    b = view.blocks
    cached = engine.residency.num_cached_blocks()
    assert (b.usable, b.held, b.held_cached, b.evictable, b.empty, b.free) == (4095, 0, 0, cached, 4095 - cached, 4095)
    assert view.blocks_cached == cached and view.prompt_tokens.external_kv_transfer == 0
    assert view.preemptions == 0 and (view.waiting_by_reason.capacity, view.waiting_by_reason.deferred) == (0, 0)
    assert view.evictions is None  # PREFIXDESK_KV_CACHE_METRICS is off
    assert (view.customers_recent.num_answers, view.customers_recent.prompt_tokens) == (1, asked.prompt_tokens)
    assert view.memory.device == "cpu" and view.memory.kv_cache_bytes == 64 << 20
    assert view.kv_events.missed_batches == 0

    sampler = CacheSampler(engine=engine, db=fresh_desk.db, interval_s=2, retention_h=1)
    started = utcnow()
    aio(sampler.tick())
    [row] = fresh_desk.db.run(db_metrics.samples_since, since=started)
    assert (row.blocks_used, row.running, row.blocks_cached) == (0, 0, view.blocks_cached)  # nothing ran since
    assert row.memory_bytes > 0 and 0 <= row.recent_hit_rate <= 1  # this process's memory; a rate


CACHE_OPERATOR = ("op-cache", "cache view secret 7")


def test_an_operator_sees_the_live_view_the_tree_and_plots_with_points(services, aio, server_url, browser):
    # services before browser: an AsyncLLM built while Playwright's loop is current binds to that loop.
    import time

    account = operator(services, *CACHE_OPERATOR)
    for template, question in (("电子产品", "手机保修多久？"), ("服装鞋包", "尺码不合适能换吗？"),
                               ("电子产品", "屏幕碎了怎么办？")):
        ask(aio, services.desk, template, question)
    wait_until(lambda: len(services.db.run(db_metrics.samples_since, since=utcnow() - timedelta(minutes=5))) >= 3,
               30, "the sampler to write 3 samples", poll_s=0.5)

    page = admin_page(browser, server_url, account, width=1500, height=1300)
    try:
        page.get_by_role("tab", name="缓存").click()
        page.locator("#cache-numbers").get_by_text("运行中请求占用").wait_for(timeout=120_000)
        page.locator("#cache-tree").get_by_text("商城通用规则").wait_for(timeout=120_000)
        page.locator("#cache-tree").get_by_text("电子产品").wait_for(timeout=120_000)
        page.locator("#cache-tree").get_by_text("电子产品 — 9/9").wait_for(timeout=120_000)  # 电子产品 resident
        for plot in ("#plot-hit-rate", "#plot-kv", "#plot-ttft", "#plot-requests"):
            page.locator(f"{plot} canvas, {plot} svg.marks").first.wait_for(timeout=120_000)
        time.sleep(1)  # let the plots draw before the picture
        picture(page, OUTPUT_DIR / "cache-view.png")

        # The tab redraws its plots every 2 s: on a starved machine they never hold still long enough for a click's
        # checks that the button stopped moving. The buttons are clicked as they are, once shown.
        page.locator("#reset-cache").dispatch_event("click")
        page.locator("#reset-cache-confirm").wait_for(state="visible", timeout=120_000)
        page.locator("#reset-cache-confirm").dispatch_event("click")
        page.locator("#reset-status").get_by_text("前缀缓存已重置").wait_for(timeout=120_000)
        page.locator("#cache-tree").get_by_text("前缀缓存为空。").wait_for(timeout=120_000)
        picture(page, OUTPUT_DIR / "cache-view-after-reset.png")
    finally:  # a live console page left open redraws its plots for the rest of the run
        page.close()


def card_values(page) -> dict[str, str]:
    """The cache cards' numbers by their key (data-key on each row)."""
    return page.locator("#cache-numbers").evaluate("""el => Object.fromEntries([...el.querySelectorAll('.pd-row')]
        .map(r => [r.dataset.key, r.querySelector('b').innerText.trim()]))""")


def tree_numbers(page) -> dict[str, tuple[int, int, int]]:
    """Per template drawn in the tree: (resident blocks, prefix blocks, conversations counted under it)."""
    items = page.locator("#cache-tree").evaluate("""el => [...el.querySelectorAll('li')].filter(li => li.querySelector(':scope > b'))
        .map(li => [li.querySelector(':scope > b').innerText, li.querySelector(':scope > .pd-detail').innerText])""")
    out = {}
    for title, detail in items:
        conversations = re.search(r"(\d+) 段对话", detail)
        for part in title.split(" · "):
            name, _, blocks = part.rpartition(" — ")
            resident, total = map(int, blocks.split("/"))
            out[name] = (resident, total, int(conversations.group(1)) if conversations else 0)
    return out


def test_the_cache_page_adds_up_and_its_tree_and_table_show_the_same_numbers(services, aio, server_url, browser,
                                                                          console):
    from app.core.demo import cold_vs_warm, demo_questions

    account = operator(services, *CACHE_OPERATOR)
    aio(services.engine.reset_prefix_cache())
    asked = (("电子产品", "手机保修多久，换新要多长时间呢？请详细说明流程"), ("服装鞋包", "尺码不合适能换吗？"),
             ("support-en", "Where is my order?"))
    for template, question in asked:
        ask(aio, services.desk, template, question)
    answers_before = aio(services.db.read(db_metrics.customer_hit_rate, since=utcnow() - timedelta(minutes=5)))
    # The demo's traffic runs in namespaces of its own: never a customer's conversation, never stored.
    aio(cold_vs_warm(services.engine, services.prompts, services.catalog.get("电商客服").chain,
                     *demo_questions("zh"), max_tokens=2))
    services.engine.residency.wait_quiet()
    assert aio(services.db.read(db_metrics.customer_hit_rate, since=utcnow() - timedelta(minutes=5))) == answers_before

    page = admin_page(browser, server_url, account, **DESKTOP)
    try:
        page.get_by_role("tab", name="缓存").click()
        page.locator("#cache-tree").get_by_text("演示流量").wait_for(timeout=120_000)
        page.locator("#cache-templates [data-testid='cell-4-0']").first.wait_for(timeout=120_000)
        snap = services.engine.snapshot().blocks  # a quiet engine: its numbers stay as they are

        def numbers_shown() -> dict[str, int]:
            return {k: int(v.replace(",", "")) for k, v in card_values(page).items()
                    if k.startswith("blocks-") and k != "blocks-sum"}

        # The view refreshes on its own timer: once it has drawn the quiet engine, every figure is the engine's.
        expected = {"blocks-total": snap.usable, "blocks-held": 0, "blocks-evictable": snap.evictable,
                    "blocks-empty": snap.empty, "blocks-free": snap.free, "blocks-cached": snap.cached}
        wait_until(lambda: numbers_shown() == expected, 120, lambda: f"the view to show {expected}: {numbers_shown()}")
        numbers = numbers_shown()
        assert numbers["blocks-total"] == numbers["blocks-held"] + numbers["blocks-evictable"] + numbers["blocks-empty"]
        assert numbers["blocks-free"] == numbers["blocks-empty"] + numbers["blocks-evictable"]
        assert card_values(page)["blocks-sum"] == f"0 + {snap.evictable:,} + {snap.empty:,}"
        assert snap.cached == services.engine.residency.num_cached_blocks()

        tree = tree_numbers(page)
        table = {r[0]: tuple(int(x) for x in r[3:6]) for r in table_rows(page, "#cache-templates")}
        assert set(tree) == {"商城通用规则", "电子产品", "服装鞋包", "support-en"}
        assert {name: table[name] for name in tree} == tree  # the same numbers in both
        # The demo asked with 电商客服's prefix, in its own namespace: none of it is the customers' 电商客服.
        prefix_blocks = len(services.catalog.prefix_ids("电商客服")) // services.engine.info.block_size
        assert table["电商客服"] == (0, prefix_blocks, 0)
        # A customer's conversation is cached past its template's prefix once its prompt and answer (2 tokens; the last
        # one's block not yet stored) fill a block beyond the prefix's full blocks.
        block = services.engine.info.block_size
        expected = {}
        for template, question in asked:
            prompt = services.prompts.build(system_text(services.catalog.get(template).chain), [], question)
            expected[template] = int((len(prompt.token_ids) + 1) // block > prompt.prefix_tokens // block)
        assert {name: tree[name][2] for name in expected} == expected == {"电子产品": 1, "服装鞋包": 1, "support-en": 0}
        demo_line = page.locator("#cache-tree li.demo").inner_text()
        assert demo_line.startswith("演示流量（演示页，非顾客）：1 个命名空间 · ")
        assert_tidy(page)
        screenshot(page, "cache-adds-up")
        resize(page, PHONE)
        assert_tidy(page)
        screenshot(page, "cache-adds-up")
    finally:  # a live console page left open redraws its plots for the rest of the run
        page.close()


def test_the_tree_says_one_block_and_one_conversation_in_the_singular():
    from admin.i18n import TEXT
    from app.core.cache_tree import CacheTree, TemplateOnNode, TreeNode, render_tree_html

    node = TreeNode((TemplateOnNode("support-en", 1, False, 1, 1, 40),), 1, 1, 1, ())
    tree = CacheTree((node,), salted_namespaces=1, salted_blocks=1, demo_namespaces=2, demo_blocks=3,
                     other_branches=0, other_blocks=0)
    html = render_tree_html(tree, t=TEXT["en"])
    assert "1 block · 1 conversation · 1 block<" in html
    assert "demo traffic (Demo tab, not customers): 2 namespaces · 3 blocks" in html
    assert "private namespaces (tenants, benchmarks): 1 namespace · 1 block" in html
    assert "1 blocks" not in html and "1 conversations" not in html
