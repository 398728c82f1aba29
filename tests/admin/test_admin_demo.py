"""The console's Demo tab: cold vs warm with two different questions, an A/B that reports a median of rounds as
they run, and a reset that warms every template again — through the API and in a browser, at both widths."""

import re

import pytest
from gradio_client import Client

from admin.demo_ui import _cold_warm
from admin.i18n import TEXT, duration
from app.core.demo import Asked, ColdWarm, demo_questions
from app.db import audit as db_audit
from app.core.prompts import system_text
from app.engine.types import RequestStats
from tests.helpers.browser import DESKTOP, PHONE, assert_tidy, admin_page, resize, screenshot
from tests.helpers.servers import full_blocks, operator

OPERATOR = ("op-demo", "benchmarks at the meeting")
TIME = r"\d{1,3} 毫秒|\d+\.\d 秒"  # a time as the zh console says it: "820 毫秒", "65.2 秒"


def test_demo_times_read_in_seconds_from_one_second_on():
    # "65165 ms" was hard to read at a meeting: whole milliseconds under a second, seconds with one decimal after.
    assert [duration(TEXT["en"], ms) for ms in (0.4, 46, 999.4, 999.6, 1000, 3337, 65165)] == [
        "0 ms", "46 ms", "999 ms", "1.0 s", "1.0 s", "3.3 s", "65.2 s"]
    assert [duration(TEXT["zh"], ms) for ms in (46, 65165)] == ["46 毫秒", "65.2 秒"]

    def asked(question: str, ttft_ms: float, cached: int) -> Asked:
        return Asked(question, "answer", RequestStats(prompt_tokens=700, num_cached_tokens=cached, output_tokens=8,
                                                      ttft_ms=ttft_ms, decode_tokens_per_s=5.0, finish_reason="stop"))

    shown = ColdWarm(prefix_tokens=672, shared_tokens=672, block_size=16, cold=asked("q1", 65165, 0),
                     warm=asked("q2", 2630, 672))
    headline, cold, warm = _cold_warm(shown, TEXT["zh"])
    assert headline == "### 缓存前缀让首 token 快了 24.8 倍（65.2 秒 → 2.6 秒）"
    assert "**65.2 秒** 后出首 token · 提示 700 个 token 中 **0** 个来自缓存" in cold
    assert "**2.6 秒** 后出首 token · 提示 700 个 token 中 **672** 个来自缓存" in warm
    headline, _, _ = _cold_warm(shown, TEXT["en"])
    assert headline == "### The cached prefix answered 24.8× faster (65.2 s → 2.6 s)"


@pytest.fixture(scope="module")
def admin(server_url, services):
    operator(services, *OPERATOR)
    return Client(server_url + "admin/", auth=OPERATOR, verbose=False)


def test_cold_vs_warm_asks_two_questions_and_the_warm_one_reuses_exactly_the_template(admin, services, block_size):
    cold_q, warm_q = demo_questions("en")
    headline, cold, warm = admin.predict("support-en", cold_q, warm_q, api_name="/cold_vs_warm")
    system = system_text(services.catalog.get("support-en").chain)
    cold_prompt = len(services.prompts.build(system, [], cold_q).token_ids)
    warm_prompt = len(services.prompts.build(system, [], warm_q).token_ids)
    template_blocks = full_blocks(len(services.prompts.prefix_ids(system)), block_size)
    assert f"提示 {cold_prompt} 个 token 中 **0** 个来自缓存" in cold and f"> {cold_q}" in cold
    # Only the template is shared: the warm run's cached tokens are its full blocks, not the question.
    assert f"提示 {warm_prompt} 个 token 中 **{template_blocks}** 个来自缓存" in warm and f"> {warm_q}" in warm
    assert f"**{template_blocks // block_size}** 个完整块（{template_blocks} 个 token，每块 {block_size} 个）" in warm
    cold_time, warm_time = (re.search(rf"\*\*({TIME})\*\* 后出首 token", x).group(1) for x in (cold, warm))
    assert headline.startswith("### 缓存前缀让首 token 快了") and f"（{cold_time} → {warm_time}）" in headline
    refused, *_ = admin.predict("support-en", cold_q, cold_q, api_name="/cold_vs_warm")
    assert refused == "⛔ 热问题请换一个，这样两次请求只共享模板。"


def test_the_ab_reports_the_median_of_its_rounds_with_their_spread(admin, services, block_size):
    summary, table, plot = admin.predict("support-en", 3, 2, api_name="/bench_ab")
    match = re.match(r"\*\*热前缀让首 token 快了 ([\d.]+) 倍\*\*（3 轮的中位数；各轮在 ([\d.]+)× – ([\d.]+)× 之间）。", summary)
    assert match, summary
    median, lo, hi = map(float, match.groups())
    assert lo <= median <= hi
    rows = table["data"]
    prefix = full_blocks(len(services.catalog.prefix_ids("support-en")), block_size)
    assert [r[0] for r in rows] == ["热前缀", "独立盐值（冷）"]
    assert [r[3] for r in rows] == [str(prefix), "0"]  # cached tokens per request, in a column of their own
    value = plot["value"] if "value" in plot else plot
    assert sorted(p[2] for p in value["data"]) == ["热前缀"] * 6 + ["独立盐值（冷）"] * 6
    assert value["columns"] == ["请求", "首 token (ms)", "组别"]  # the legend and axes speak the console's language


def test_an_operator_presents_cold_vs_warm_the_ab_and_a_reset_in_the_browser(browser, server_url, services,
                                                                              block_size):
    page = admin_page(browser, server_url, operator(services, *OPERATOR), **DESKTOP)
    page.get_by_role("tab", name="演示").click()
    page.locator("#demo-run").wait_for()
    # Before a run the boxes say what will appear there, not empty slivers.
    assert page.locator("#demo-cold").inner_text().endswith("尚未提问。")
    zh_cold, zh_warm = demo_questions("zh")
    page.wait_for_function("q => document.querySelector('#demo-question textarea').value === q", arg=zh_cold)
    assert page.locator("#demo-question-warm textarea").input_value() == zh_warm
    screenshot(page, "demo-before")
    page.locator("#demo-run").click()
    page.locator("#demo-cold").get_by_text("个来自缓存").wait_for(timeout=120_000)
    page.locator("#demo-headline").get_by_text("缓存前缀让首 token 快了").wait_for(timeout=120_000)
    prefix = len(services.catalog.prefix_ids("电商客服"))
    page.locator("#demo-warm").get_by_text("个来自缓存").wait_for(timeout=120_000)
    assert f"中 {full_blocks(prefix, block_size)} 个来自缓存" in page.locator("#demo-warm").inner_text()
    for slider, value in (("#ab-rounds", "3"), ("#ab-per-round", "2")):
        page.locator(f"{slider} input[type=number]").fill(value)
        page.locator(f"{slider} input[type=number]").press("Tab")  # a slider takes a typed number on leaving it
    # Every text the summary shows on the way, however briefly (a loaded machine may draw a round late).
    page.evaluate("""() => { window.abTexts = [];
        new MutationObserver(() => window.abTexts.push(document.querySelector('#ab-summary').innerText))
            .observe(document.querySelector('#ab-summary'), {subtree: true, childList: true, characterData: true}); }""")
    page.locator("#ab-run").click()
    page.locator("#ab-summary").get_by_text("3 轮的中位数").wait_for(timeout=120_000)
    page.wait_for_function("!/第 \\d \\/ 3 轮/.test(document.querySelector('#ab-summary').innerText)", timeout=120_000)
    shown = page.evaluate("window.abTexts")
    rounds = sorted({m.group(0) for text in shown for m in re.finditer(r"第 \d / 3 轮", text)})
    assert rounds == ["第 1 / 3 轮", "第 2 / 3 轮", "第 3 / 3 轮"], shown  # round k of n, as they ran
    page.locator("#ab-plot canvas, #ab-plot svg.marks").first.wait_for(timeout=90_000)
    page.wait_for_timeout(1000)
    assert_tidy(page)
    screenshot(page, "demo-after")
    page.locator("#demo-rewarm").click()
    page.locator("#demo-rewarm-confirm").click()
    page.locator("#demo-rewarm-status").get_by_text("个模板已重新预热").wait_for(timeout=120_000)
    published = len(services.catalog.entries())
    assert re.fullmatch(rf"前缀缓存已重置（丢弃 \d+ 个已缓存的块）；{published} 个模板已重新预热，用时 ({TIME})。",
                        page.locator("#demo-rewarm-status").inner_text())
    services.engine.residency.wait_quiet()  # vLLM's last cache events reach the mirror a moment after the step
    for name in (t.name for t in services.catalog.all()):  # warm again: every published prefix is resident
        match = services.engine.residency.match(services.catalog.prefix_ids(name))
        assert match.fully_resident, name
    entries = [(e.user, e.action) for e in services.db.run(db_audit.recent, limit=published + 1)]
    assert entries == [(OPERATOR[0], "warmup")] * published + [(OPERATOR[0], "reset prefix cache")]
    resize(page, PHONE)
    assert_tidy(page)
    screenshot(page, "demo-after")
    page.close()
