"""An operator in a real browser: log in, edit and publish a template, watch the warmup, pin it."""

import uuid

import pytest

from admin import auth, templates as repo
from admin.console import build_console

from conftest import OUTPUT_DIR

OPERATOR = ("op-browser", "browser secret 42")
TEXT = "\n".join(f"Policy {i}: parcels of size {i} ship within {i + 1} days." for i in range(10))


@pytest.fixture(scope="module")
def template(services):
    console = build_console(services)
    auth.set_password(store=services.store, name=OPERATOR[0], password=OPERATOR[1])
    name = f"browser-{uuid.uuid4().hex[:6]}"
    repo.create_template(store=console.store, meter=console.meter, name=name, text=TEXT, user="seed", language="en")
    repo.publish(store=console.store, meter=console.meter, name=name, version=1, user="seed")
    return name


def test_operator_logs_in_edits_publishes_with_warmup_and_pins(browser, server_url, services, template):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(server_url + "admin/")
    page.get_by_label("username").fill(OPERATOR[0])
    page.get_by_label("password").fill(OPERATOR[1])
    page.screenshot(path=str(OUTPUT_DIR / "admin-login.png"))
    page.get_by_role("button", name="Login").click()
    page.get_by_text("prefixdesk · admin console").wait_for(timeout=30_000)
    page.locator("#templates-table").get_by_text(template).last.wait_for(timeout=30_000)

    picker = page.locator("#edit-template input")
    picker.fill(template)
    picker.press("Enter")
    editor = page.locator("#edit-text textarea")
    page.wait_for_function("([sel, start]) => document.querySelector(sel).value.startsWith(start)",
                           arg=["#edit-text textarea", "Policy 0:"], timeout=30_000)
    editor.fill(TEXT + "\nPolicy 10: oversized parcels ship on Mondays.")
    page.locator("#preview").get_by_text("full KV blocks").wait_for(timeout=30_000)
    page.locator("#save").click()
    page.locator("#status").get_by_text("as version 2").wait_for(timeout=30_000)

    # The warmup takes tens of milliseconds, so the progress text is recorded as it appears
    # rather than waited for.
    page.evaluate("""text => {
        window.__progress = [];
        new MutationObserver(() => {
            if (document.body.innerText.includes(text)) window.__progress.push(text);
        }).observe(document.body, {subtree: true, childList: true, characterData: true});
    }""", f"warming {template}")
    page.locator("#publish").click()
    page.wait_for_function("window.__progress.length > 0", timeout=30_000)
    page.wait_for_function("document.querySelector('#status').innerText.includes(\"Published '\")",
                           timeout=60_000)
    status = page.locator("#status").inner_text()
    assert f"Published '{template}': v1 → v2. Warmed in" in status
    assert "256 of 265 prefix tokens are cached" in status  # v2 is 265 tokens: 8 full blocks of 32
    page.screenshot(path=str(OUTPUT_DIR / "admin-published.png"), full_page=True)

    page.locator("#pinned input").check()
    page.locator("#status").get_by_text("pinned: kept warm").wait_for(timeout=30_000)
    assert services.store.get_published(template).pinned
    page.get_by_role("tab", name="Warmup").click()
    page.locator("#touch-pinned").click()
    page.locator("#pinned-table").get_by_text(template).last.wait_for(timeout=30_000)
    page.screenshot(path=str(OUTPUT_DIR / "admin-pinned.png"), full_page=True)
    page.get_by_role("tab", name="Audit log").click()
    page.locator("#audit-table").get_by_text("pin", exact=True).last.wait_for(timeout=30_000)
    page.screenshot(path=str(OUTPUT_DIR / "admin-audit.png"), full_page=True)
    page.close()
