"""The cache view's numbers, from real requests stored in a fresh database."""

import statistics
import uuid
from datetime import timedelta

import pytest

from admin.cache_view import CacheSampler, load_samples, read_cache_view, template_stats, ttft_split
from app.desk import Desk, Finished
from app.store import open_store

from conftest import OUTPUT_DIR, collect


@pytest.fixture()
def fresh_desk(services, tmp_path):
    """The session engine and prompts with a database of their own, so every stored row is ours."""
    store = open_store(f"sqlite:///{tmp_path / 'view.db'}")
    store.seed_templates(services.settings.templates_dir)
    yield Desk(store=store, engine=services.engine, prompts=services.prompts)
    store.close()


def ask(aio, desk, template, message, salt):
    events = aio(collect(desk.answer(session_key="view", template_name=template, history=[], message=message,
                                     cache_salt=salt, max_tokens=2, ignore_eos=True)))
    assert isinstance(events[-1], Finished)
    return events[-1].message


def test_per_template_hit_rate_is_cached_over_prompt_tokens_of_the_stored_answers(fresh_desk, aio):
    salt = uuid.uuid4().hex  # a namespace no other test has warmed
    electronics = [ask(aio, fresh_desk, "电子产品", q, salt) for q in ("手机保修多久？", "屏幕碎了怎么办？", "电池能换吗？")]
    english = [ask(aio, fresh_desk, "support-en", q, salt) for q in ("Where is my order?", "How do refunds work?")]
    # First request of each template misses; the later ones reuse its 9 (12) prefix blocks of 32 tokens.
    assert [m.num_cached_tokens for m in electronics] == [0, 288, 288]
    assert [m.num_cached_tokens for m in english] == [0, 384]

    stats = {s.name: s for s in template_stats(store=fresh_desk.store)}
    assert set(stats) == {"电子产品", "support-en"}
    for name, rows in (("电子产品", electronics), ("support-en", english)):
        prompt = sum(m.prompt_tokens for m in rows)
        cached = sum(m.num_cached_tokens for m in rows)
        assert (stats[name].requests, stats[name].prompt_tokens, stats[name].num_cached_tokens) == (
            len(rows), prompt, cached)
        assert stats[name].hit_rate == cached / prompt

    ttft = ttft_split(store=fresh_desk.store)
    rows = electronics + english
    assert (ttft.num_hits, ttft.num_misses) == (3, 2)
    assert ttft.hit_p50_ms == statistics.median(m.ttft_ms for m in rows if m.num_cached_tokens)
    assert ttft.miss_p50_ms == statistics.median(m.ttft_ms for m in rows if not m.num_cached_tokens)


def test_a_reading_adds_up_and_survives_in_the_samples_table(fresh_desk, aio):
    engine = fresh_desk.engine
    ask(aio, fresh_desk, "商城通用规则", "包邮吗？", uuid.uuid4().hex)
    engine.residency.wait_quiet()
    view = read_cache_view(engine=engine, store=fresh_desk.store)
    assert (view.num_blocks, view.block_size) == (engine.info.num_blocks, engine.info.block_size)
    assert view.blocks_used == 0 and view.running == 0  # nothing runs between requests
    assert view.blocks_used + view.blocks_free == view.num_blocks - 1
    assert view.blocks_cached == engine.residency.num_cached_blocks()
    assert view.hit_rate == view.hits / view.queries
    assert view.memory.device == "cpu" and view.memory.kv_cache_bytes == 64 << 20
    assert view.kv_events.missed_batches == 0

    sampler = CacheSampler(engine=engine, store=fresh_desk.store, interval_s=2, retention_h=1)
    taken = sampler.sample_once()
    [row] = load_samples(store=fresh_desk.store, since=taken.t - timedelta(seconds=1))
    assert (row.t, row.hit_rate, row.blocks_cached, row.blocks_used) == (
        taken.t, taken.recent_hit_rate, taken.blocks_cached, taken.blocks_used)
    assert row.ttft_miss_ms == taken.ttft_miss_p50_ms


CACHE_OPERATOR = ("op-cache", "cache view secret 7")


def test_an_operator_sees_the_live_view_the_tree_and_plots_with_points(services, aio, server_url, browser):
    # services before browser: an AsyncLLM built while Playwright's loop is current binds to that loop.
    import time

    from admin import auth
    from admin.cache_view import load_samples
    from app.models import utcnow

    auth.set_password(store=services.store, name=CACHE_OPERATOR[0], password=CACHE_OPERATOR[1])
    for template, question in (("电子产品", "手机保修多久？"), ("服装鞋包", "尺码不合适能换吗？"),
                               ("电子产品", "屏幕碎了怎么办？")):
        ask(aio, services.desk, template, question, None)
    deadline = time.monotonic() + 30
    while len(load_samples(store=services.store, since=utcnow() - timedelta(minutes=5))) < 3:
        assert time.monotonic() < deadline, "the sampler wrote no samples"
        time.sleep(0.5)

    page = browser.new_page(viewport={"width": 1500, "height": 1300})
    page.goto(server_url + "admin/")
    page.get_by_label("username").fill(CACHE_OPERATOR[0])
    page.get_by_label("password").fill(CACHE_OPERATOR[1])
    page.get_by_role("button", name="Login").click()
    page.get_by_role("tab", name="Cache").click()
    page.locator("#cache-numbers").get_by_text("total blocks").wait_for(timeout=30_000)
    page.locator("#cache-tree").get_by_text("商城通用规则").wait_for(timeout=30_000)
    page.locator("#cache-tree").get_by_text("电子产品").wait_for(timeout=30_000)
    page.locator("#cache-templates").get_by_text("9 / 9").first.wait_for(timeout=30_000)  # 电子产品 resident
    for plot in ("#plot-hit-rate", "#plot-kv", "#plot-ttft", "#plot-requests"):
        page.locator(f"{plot} canvas, {plot} svg.marks").first.wait_for(timeout=30_000)
    time.sleep(1)  # let the plots draw before the picture
    page.screenshot(path=str(OUTPUT_DIR / "cache-view.png"), full_page=True)

    page.locator("#reset-cache").click()
    page.locator("#reset-cache-confirm").click()
    page.locator("#reset-status").get_by_text("Prefix cache reset").wait_for(timeout=30_000)
    page.locator("#cache-tree").get_by_text("The prefix cache is empty.").wait_for(timeout=30_000)
    page.screenshot(path=str(OUTPUT_DIR / "cache-view-after-reset.png"), full_page=True)
    page.close()
