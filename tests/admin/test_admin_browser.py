"""An operator in a real browser: log in, edit, save, publish with warmup, pin, warm, read the audit log, log
out — in Chinese and in English, on a desktop and on a phone."""

import re
import string
import uuid

import httpx
import pytest

from admin.access import SESSION_COOKIE
from admin.i18n import TEXT as CONSOLE_TEXT
from app.core.prompts import common_prefix_len, system_text
from tests.helpers.browser import DESKTOP, PHONE, assert_tidy, admin_page, screenshot, table_rows
from tests.helpers.browser import CONSOLE_TABS, open_tab
from tests.helpers.servers import SecondServer, full_blocks, operator

OPERATOR = ("op-browser", "browser secret 42")
TEXT = "\n".join(f"Policy {i}: parcels of size {i} ship within {i + 1} days." for i in range(10))
EDITED = TEXT + "\nPolicy 10: oversized parcels ship on Mondays."


@pytest.fixture(scope="module")
def account(services):
    return operator(services, *OPERATOR)


@pytest.fixture(scope="module")
def template(console, aio):
    """A published English template of one seed version, for the operator to edit."""
    name = f"browser-{uuid.uuid4().hex[:6]}"
    aio(console.templates.create(name=name, text=TEXT, user="seed", language="en"))
    aio(console.templates.publish(name=name, version=1, user="seed"))
    return name


@pytest.fixture(scope="module")
def english(services, engine_loop, tmp_path_factory):
    """A second app on the session engine whose chat and console speak English, with an operator."""
    with SecondServer(services, engine_loop, tmp_path_factory.mktemp("console-en"), ui_language="en",
                      admin_password="english operator 7") as url:
        yield url, ("admin", "english operator 7")


def screenshot_every_tab(page, name: str, language: str = "zh") -> None:
    for tab in CONSOLE_TABS:
        open_tab(page, tab, language)
        screenshot(page, f"{name}-{tab}")


def test_an_operator_edits_publishes_pins_warms_and_finds_it_in_the_audit_log(browser, server_url, services, account,
                                                                               template, block_size):
    page = admin_page(browser, server_url, account, **DESKTOP)
    page.locator("#templates-table").get_by_text(template, exact=True).last.wait_for(timeout=90_000)
    picker = page.locator("#edit-template input")
    picker.fill(template)
    picker.press("Enter")
    page.wait_for_function("t => document.querySelector('#template-text textarea').value === t", arg=TEXT,
                           timeout=90_000)
    info = page.locator("#template-info")
    assert info.inner_text() == "父模板：— · 语言：en · 已发布：v1 · 版本：v1 (seed)"

    page.locator("#template-text textarea").fill(EDITED)
    page.locator("#preview").get_by_text("个完整 KV 块", exact=False).wait_for(timeout=90_000)
    page.locator("#save").click()
    status = page.locator("#template-status")
    status.get_by_text(f"已将 '{template}' 保存为版本 2（尚未发布）。", exact=True).wait_for(timeout=90_000)
    # The diff's version lists know the new version at once, without reopening the template.
    assert (page.locator("#diff-a input").input_value(), page.locator("#diff-b input").input_value()) == ("1", "2")
    page.locator("#diff").click()
    page.locator("#diff-summary").get_by_text("第一个不同的 token").wait_for(timeout=90_000)
    ids_a, ids_b = (services.prompts.prefix_ids(system_text((x,))) for x in (TEXT, EDITED))
    first = common_prefix_len(ids_a, ids_b)
    assert page.locator("#diff-summary").inner_text().startswith(
        f"第一个不同的 token：{first}（共 {len(ids_a)} / {len(ids_b)}）")

    page.locator("#publish").click()  # the version just saved
    page.wait_for_function("document.querySelector('#template-status').innerText.startsWith('已发布')", timeout=120_000)
    prefix = len(services.prompts.prefix_ids(system_text((EDITED,))))
    assert (prefix, full_blocks(prefix, block_size)) == (265, 256)  # 8 full blocks of 32, 9 tokens recomputed
    assert re.fullmatch(rf"已发布 '{template}'：v1 → v2。预热用时 \d+ ms：前缀 265 个 token 中有 256 个已缓存。",
                        status.inner_text())
    assert info.inner_text() == f"父模板：— · 语言：en · 已发布：v2 · 版本：v1 (seed), v2 ({OPERATOR[0]})"
    assert services.catalog.get(template).version_number == 2  # the chat uses it now

    page.locator("#pinned input").check()
    status.get_by_text(f"'{template}' 已设为常驻：后台保持预热。", exact=True).wait_for(timeout=90_000)
    assert services.catalog.get(template).pinned
    assert_tidy(page)

    open_tab(page, "warmup")
    warm_picker = page.locator("#warm-template input")
    warm_picker.fill(template)
    warm_picker.press("Enter")
    page.locator("#warm").click()
    page.locator("#warm-summary").get_by_text("已预热 1 个模板", exact=False).wait_for(timeout=120_000)
    rows = table_rows(page, "#warm-results")
    assert [r[:4] for r in rows] == [[template, "265", "256", "256"]]  # it was warm already: publish warmed it
    assert re.fullmatch(r"\d+(\.\d+)?", rows[0][4])  # milliseconds, not a raw value
    assert "{" not in page.locator("#warm-results").inner_text()  # a table, no raw JSON
    assert_tidy(page)

    open_tab(page, "audit")
    page.locator("#audit-table").get_by_text(template).last.wait_for(timeout=90_000)
    audit = table_rows(page, "#audit-table")
    pins = [r[1:] for r in audit if r[2:4] == ["设为常驻", template]]
    assert pins == [[OPERATOR[0], "设为常驻", template, "常驻", "否", "是"]]  # the zh console's words
    assert [r[2] for r in audit if r[3] == template][:4] == ["预热", "设为常驻", "发布", "保存"]  # newest first
    assert_tidy(page)
    screenshot_every_tab(page, "admin")
    page.close()


def test_admin_without_slash_leads_to_the_login_and_logout_ends_the_session_in_the_same_tab(browser, server_url,
                                                                                          account):
    page = browser.new_page(viewport=DESKTOP)
    page.goto(server_url + "admin")
    assert page.url == server_url + "admin/login"
    screenshot(page, "admin-login")
    page.locator("#username").fill(account[0])
    page.locator("#password").fill(account[1])
    page.locator("button[type=submit]").click()
    page.wait_for_url(server_url + "admin/")
    page.locator("#templates-table").wait_for(timeout=120_000)
    (cookie,) = [c["value"] for c in page.context.cookies() if c["name"] == SESSION_COOKIE]
    config = server_url + "admin/config"
    assert httpx.get(config, headers={"Cookie": f"{SESSION_COOKIE}={cookie}"}).status_code == 200

    page.locator("#logout").click()
    page.wait_for_url(server_url + "admin/login", timeout=90_000)
    assert len(page.context.pages) == 1  # the same tab, no new one
    assert page.locator("button[type=submit]").inner_text() == "登录"
    assert httpx.get(config, headers={"Cookie": f"{SESSION_COOKIE}={cookie}"}).status_code == 401
    page.goto(server_url + "admin/")
    assert page.url == server_url + "admin/login"  # the old session is gone in the browser too
    page.close()


@pytest.mark.parametrize("language", ["zh", "en"])
def test_the_console_speaks_the_ui_language(browser, request, server_url, account, language):
    url, login = (server_url, account) if language == "zh" else request.getfixturevalue("english")
    t = CONSOLE_TEXT[language]
    page = browser.new_page(viewport=PHONE)
    page.goto(url + "admin/login")
    assert page.locator("h1").inner_text() == t["login_title"]
    assert [page.locator(f"label[for={f}]").inner_text() for f in ("username", "password")] == [
        t["login_name"], t["login_password"]]
    assert page.locator("button[type=submit]").inner_text() == t["login_button"]
    assert_tidy(page)
    screenshot(page, f"admin-login-{language}")
    page.close()

    page = admin_page(browser, url, login, **DESKTOP)
    tabs = page.locator("[role=tablist] [role=tab]")
    assert [tabs.nth(i).inner_text() for i in range(tabs.count())] == [t[f"tab_{tab}"] for tab in CONSOLE_TABS]
    assert page.locator("#logout").inner_text() == t["logout"]
    page.locator("#pd-user").get_by_text(t["logged_in_as"].format(user=login[0]).replace("**", ""),
                                         exact=True).wait_for(timeout=90_000)
    screenshot(page, f"admin-{language}")
    page.close()


def test_a_wrong_password_keeps_the_name_and_never_the_password(browser, server_url, account):
    page = browser.new_page(viewport=PHONE)
    page.goto(server_url + "admin/login")
    page.locator("#username").fill(account[0])
    page.locator("#password").fill("not the password 1")
    page.locator("button[type=submit]").click()
    page.locator("p.notice").wait_for(timeout=90_000)
    assert page.locator("p.notice").inner_text() == "用户名或密码错误。"
    assert (page.locator("#username").input_value(), page.locator("#password").input_value()) == (account[0], "")
    assert "not the password 1" not in page.content()
    assert page.evaluate("document.activeElement.id") == "password"  # the operator types the password again
    assert_tidy(page)
    screenshot(page, "admin-login-refused")
    page.close()
    hostile = '"><script>alert(1)</script>'
    r = httpx.post(server_url + "admin/login", data={"username": hostile, "password": "x" * 9},
                   headers={"Accept": "text/html"})
    assert r.status_code == 401 and hostile not in r.text and "&quot;&gt;&lt;script&gt;" in r.text


def test_both_languages_have_the_same_texts_with_the_same_placeholders():
    zh, en = CONSOLE_TEXT["zh"], CONSOLE_TEXT["en"]
    assert sorted(zh) == sorted(en)

    def placeholders(text: str) -> set[str]:
        return {field for _, field, _, _ in string.Formatter().parse(text) if field is not None}

    assert {k: placeholders(zh[k]) for k in zh} == {k: placeholders(en[k]) for k in en}


def test_the_cache_tab_fits_a_phone_and_its_numbers_are_readable(browser, server_url, account):
    page = admin_page(browser, server_url, account, **PHONE)
    assert_tidy(page)
    open_tab(page, "cache")
    page.locator("#cache-tree li").first.wait_for(timeout=90_000)
    assert_tidy(page)
    # Every number sits inside its card, clear of its label: nothing cut off at the card's edge.
    rows = page.locator("#cache-numbers .pd-row").evaluate_all("""rows => rows.map(row => {
        const card = row.closest('.pd-card').getBoundingClientRect();
        const value = row.querySelector('b').getBoundingClientRect();
        const label = row.querySelector('span').getBoundingClientRect();
        const inside = value.left >= card.left && value.right <= card.right && value.width > 0;
        const apart = label.width === 0 || value.top >= label.bottom || value.left >= label.right;
        return [row.innerText, inside, apart];
    })""")
    assert len(rows) == 24  # 8 + 5 + 4 + 4 + 1 + 2 rows in the six cards
    assert [r for r in rows if not (r[1] and r[2])] == []
    screenshot_every_tab(page, "admin")
    page.close()
