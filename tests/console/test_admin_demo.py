"""The console's Demo tab: cold vs warm on the live engine, and an A/B that reports a median of rounds."""

import re

import pytest
from gradio_client import Client

from tests.helpers.browser import console_page
from tests.helpers.servers import OUTPUT_DIR, full_blocks, operator

OPERATOR = ("op-demo", "benchmarks at the meeting")


@pytest.fixture(scope="module")
def admin(server_url, services):
    operator(services, *OPERATOR)
    return Client(server_url + "admin/", auth=OPERATOR, verbose=False)


def test_cold_vs_warm_computes_the_prompt_once_then_reuses_it(admin, services, block_size):
    headline, cold, warm = admin.predict("support-en", "Where is my parcel?", api_name="/cold_vs_warm")
    prompt = len(services.prompts.build("\n\n".join(services.catalog.get("support-en").chain), [],
                                        "Where is my parcel?").token_ids)
    assert "整段提示词全部计算\n**" in cold and f"提示 {prompt} 个 token 中 0 个来自缓存" in cold
    # The second ask reuses every full block of the first prompt (the whole question, too).
    assert f"提示 {prompt} 个 token 中 {full_blocks(prompt - 1, block_size)} 个来自缓存" in warm
    cold_ms, warm_ms = (int(re.search(r"\*\*(\d+) ms\*\*", x).group(1)) for x in (cold, warm))
    assert headline.startswith("### 缓存前缀让首 token 快了") and f"（{cold_ms} ms → {warm_ms} ms）" in headline


def test_the_ab_reports_the_median_of_its_rounds_with_their_spread(admin, services, block_size):
    summary, table, plot = admin.predict("support-en", 3, 2, api_name="/bench_ab")
    match = re.match(r"\*\*热前缀让首 token 快了 ([\d.]+) 倍\*\*（3 轮的中位数；各轮在 ([\d.]+)× – ([\d.]+)× 之间）。", summary)
    assert match, summary
    median, lo, hi = map(float, match.groups())
    assert lo <= median <= hi
    rows = table["data"]
    prefix = full_blocks(len(services.catalog.prefix_ids("support-en")), block_size)
    assert [r[0] for r in rows] == ["热前缀", "独立盐值（冷）"]
    assert rows[0][3].startswith(f"{prefix} / ") and rows[1][3].startswith("0 / ")  # cached / prompt tokens
    points = plot["value"]["data"] if "value" in plot else plot["data"]
    assert sorted(p[2] for p in points) == ["热前缀"] * 6 + ["独立盐值（冷）"] * 6


def test_an_operator_runs_both_in_the_browser(browser, server_url, services):
    page = console_page(browser, server_url, operator(services, *OPERATOR), width=1400, height=1100)
    page.get_by_role("tab", name="演示").click()
    page.locator("#demo-run").click()
    page.locator("#demo-headline").get_by_text("缓存前缀让首 token 快了").wait_for(timeout=60_000)
    page.locator("#ab-run").click()
    page.locator("#ab-summary").get_by_text("热前缀让首 token 快了").wait_for(timeout=120_000)
    page.locator("#ab-plot canvas, #ab-plot svg.marks").first.wait_for(timeout=30_000)
    page.wait_for_timeout(1000)
    assert page.locator("#demo-cold").inner_text().count("来自缓存") == 1
    page.screenshot(path=str(OUTPUT_DIR / "admin-demo.png"), full_page=True)
