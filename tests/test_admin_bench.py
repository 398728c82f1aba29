"""The console's Benchmark tab: a live warm-vs-cold A/B on the running engine, operators only."""

import re

import pytest
from gradio_client import Client

from admin import auth
from conftest import OUTPUT_DIR

OPERATOR = ("op-bench", "benchmarks at the meeting")


@pytest.fixture(scope="module")
def admin_url(server_url, services):
    auth.set_password(store=services.store, name=OPERATOR[0], password=OPERATOR[1])
    return server_url + "admin/"


def test_the_ab_shows_both_arms_and_the_warm_one_hits_the_prefix(admin_url, services):
    admin = Client(admin_url, auth=OPERATOR, verbose=False)
    summary, plot = admin.predict("support-en", 4, api_name="/bench_ab")
    prefix_blocks = len(services.desk.prefix_ids(services.store.get_published("support-en"))) // 32 * 32
    warm = re.search(r"\| warm prefix \| \d+ \| [\d.]+ \| \d+ \| (\d+) / (\d+) \|", summary)
    cold = re.search(r"\| unique salt \(cold\) \| \d+ \| [\d.]+ \| \d+ \| (\d+) / (\d+) \|", summary)
    assert int(warm.group(1)) == prefix_blocks  # the template's full blocks, from the cache
    assert int(cold.group(1)) == 0  # a unique salt shares nothing
    assert warm.group(2) == cold.group(2)  # same prompts in both arms
    rows = plot["value"]["data"] if "value" in plot else plot["data"]
    assert sorted(r[2] for r in rows) == ["unique salt (cold)"] * 4 + ["warm prefix"] * 4


def test_the_ab_refuses_a_caller_who_is_not_logged_in(server_url):
    with pytest.raises(ValueError, match="as credentials were not provided. Please login."):
        Client(server_url + "admin/", verbose=False).predict("support-en", 4, api_name="/bench_ab")


def test_an_operator_runs_the_ab_in_the_browser(browser, admin_url):
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    page.goto(admin_url)
    page.get_by_label("username").fill(OPERATOR[0])
    page.get_by_label("password").fill(OPERATOR[1])
    page.get_by_role("button", name="Login").click()
    page.get_by_role("tab", name="Benchmark").click()
    page.locator("#bench-run").click()
    page.locator("#bench-summary").get_by_text("faster, throughput").wait_for(timeout=60_000)
    page.locator("#bench-plot canvas, #bench-plot svg.marks").first.wait_for(timeout=30_000)
    page.wait_for_timeout(1000)
    page.screenshot(path=str(OUTPUT_DIR / "admin-benchmark.png"), full_page=True)
