"""Debian's chromium for the browser tests, and what they check on every page: nothing wider than the screen, no two visible controls on
top of each other, the controls that matter above the fold — and a screenshot at each width."""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass

from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from tests.helpers.servers import OUTPUT_DIR

CHROMIUM = "/usr/bin/chromium"
# Without the background-networking flags chromium keeps dialling out, and this machine refuses it.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
DESKTOP = {"width": 1366, "height": 768}
PHONE = {"width": 390, "height": 844}
VIEWPORTS = {"desktop": DESKTOP, "phone": PHONE}

# Controls, the chatbot, its messages and captions, and Gradio's progress texts (the "1.2s" timer):
# what the issue reported drawn over each other.
SELECTOR = ", ".join([
    "button", "input:not([type=hidden])", "textarea", "select", "#chatbot", "#chatbot .message-content",
    "#chatbot .thought-group .title", "[data-testid=status-tracker] .meta-text",
    "[data-testid=status-tracker] .meta-text-center", "[data-testid=status-tracker] .progress-text",
])

# An element counts where it is drawn: its box cut to the screen's width and to every ancestor that clips
# (a message scrolled out of the chatbot is not over the message box), and only if a tap at its centre
# reaches it (nothing under an overlay, e.g. a closed sidebar or an open one on a phone).
LAYOUT_JS = """
(selector) => {
  const drawn = (el) => {
    const r = el.getBoundingClientRect();
    let box = {l: Math.max(r.left, 0), t: r.top, r: Math.min(r.right, innerWidth), b: r.bottom};
    for (let a = el.parentElement; a; a = a.parentElement) {
      const s = getComputedStyle(a);
      if (s.overflowX !== 'visible' || s.overflowY !== 'visible') {
        const q = a.getBoundingClientRect();
        box = {l: Math.max(box.l, q.left), t: Math.max(box.t, q.top), r: Math.min(box.r, q.right),
               b: Math.min(box.b, q.bottom)};
      }
    }
    return box;
  };
  const visible = (el) => {
    const s = getComputedStyle(el);
    if (s.visibility === 'hidden' || s.display === 'none') return false;
    for (let a = el; a; a = a.parentElement) if (parseFloat(getComputedStyle(a).opacity) === 0) return false;
    const b = drawn(el);
    if (b.r - b.l < 1 || b.b - b.t < 1) return false;
    const y = (b.t + b.b) / 2;
    if (y < 0 || y > innerHeight) return true;  // off screen vertically: a scroll away, judged by its box
    const hit = document.elementFromPoint((b.l + b.r) / 2, y);
    return !!hit && (el.contains(hit) || hit.contains(el));
  };
  const name = (el) => {
    if (el.id) return '#' + el.id;
    const classes = typeof el.className === 'string'
      ? el.className.split(/\\s+/).filter(c => c && !c.startsWith('svelte')).map(c => '.' + c).join('') : '';
    const label = el.getAttribute('aria-label') || (el.innerText || '').trim();
    const owner = el.closest('[id]');
    return `${owner ? '#' + owner.id + ' ' : ''}${el.tagName.toLowerCase()}${classes} "${label.slice(0, 24)}"`;
  };
  const els = [...document.querySelectorAll(selector)].filter(visible);
  const overlaps = [];
  for (let i = 0; i < els.length; i++) for (let j = i + 1; j < els.length; j++) {
    const a = els[i], b = els[j];
    if (a.contains(b) || b.contains(a)) continue;
    const p = drawn(a), q = drawn(b);
    const w = Math.min(p.r, q.r) - Math.max(p.l, q.l), h = Math.min(p.b, q.b) - Math.max(p.t, q.t);
    if (w >= 1 && h >= 1) overlaps.push([name(a), name(b), Math.round(w), Math.round(h)]);
  }
  return {scrollWidth: document.scrollingElement.scrollWidth, controls: els.map(name), overlaps};
}
"""


@dataclass(frozen=True)
class Layout:
    scroll_width: int
    controls: list[str]  # the visible ones, named
    overlaps: list[list]  # [name a, name b, overlap width px, overlap height px]


def layout(page) -> Layout:
    r = page.evaluate(LAYOUT_JS, SELECTOR)
    return Layout(r["scrollWidth"], r["controls"], r["overlaps"])


def assert_tidy(page) -> Layout:
    """No horizontal scrolling and no two visible controls overlapping; returns the layout."""
    seen = layout(page)
    assert seen.scroll_width <= page.viewport_size["width"], f"page is {seen.scroll_width} px wide"
    assert seen.overlaps == [], f"overlapping controls: {seen.overlaps}"
    return seen


# Settled: the controls' boxes read the same on three polls in a row (100 ms apart).
SETTLED_JS = """() => {
  const now = document.documentElement.clientWidth + '|' + [...document.querySelectorAll(
      'button, input, textarea, [role=tab]')].map(e => {
    const r = e.getBoundingClientRect(); return [r.x, r.y, r.width, r.height].map(Math.round).join(','); }).join(';');
  const s = window.__pdSettle = window.__pdSettle || {last: null, same: 0};
  s.same = now === s.last ? s.same + 1 : 0; s.last = now;
  return s.same >= 3;
}"""


def resize(page, size: dict) -> None:
    """Set the viewport and wait until the page has laid itself out again (no fixed sleep to outrun). A page whose
    controls keep moving for 10 s goes on as it is: what a test checks next then judges it."""
    page.set_viewport_size(size)
    page.evaluate("() => { window.__pdSettle = null; }")
    try:
        page.wait_for_function(SETTLED_JS, polling=100, timeout=10_000)
    except PlaywrightTimeoutError:
        pass


def above_the_fold(page, selector: str) -> bool:
    """Whether the element is wholly on the first screen, without scrolling."""
    box = page.locator(selector).bounding_box()
    size = page.viewport_size
    return (box is not None and box["x"] >= 0 and box["y"] >= 0 and box["x"] + box["width"] <= size["width"]
            and box["y"] + box["height"] <= size["height"])


SCREENSHOT_TIMEOUT_MS = 180_000  # a picture, not a check: a whole live page on a busy 2-core machine takes its time


def screenshot(page, name: str) -> None:
    """test-output/<name>-<width>.png, the whole page."""
    picture(page, OUTPUT_DIR / f"{name}-{page.viewport_size['width']}.png")


def picture(page, path) -> None:
    """The whole page at ``path`` (test-output/), however long a busy machine takes to draw it. A picture is no
    check: a live page that a starved machine cannot hold still for one (the cache tab redraws four plots every
    2 s) is taken as what fits the window, and failing that, left out with a warning."""
    OUTPUT_DIR.mkdir(exist_ok=True)
    for whole in (True, False):
        try:
            page.screenshot(path=str(path), full_page=whole, timeout=SCREENSHOT_TIMEOUT_MS // 2,
                            animations="disabled")
            return
        except PlaywrightTimeoutError:
            continue
    name = str(path).rsplit("/", 1)[-1]
    warnings.warn(f"no picture {name}: the page did not hold still for one on this busy machine", stacklevel=2)


def admin_page(browser, server_url: str, account: tuple[str, str], *, width: int = 1366, height: int = 900,
                 locale: str | None = None, context=None):
    """A browser page logged in to the console through its login page (in ``locale``, e.g. "zh-CN", when
    given: Gradio's own texts follow the browser's language); a tab of ``context`` when given."""
    page = context.new_page() if context is not None else \
        browser.new_page(viewport={"width": width, "height": height}, **({"locale": locale} if locale else {}))
    lost = _lost_loads(page)
    page.goto(server_url + "admin")
    page.locator("#username").fill(account[0])
    page.locator("#password").fill(account[1])
    page.locator("button[type=submit]").click()
    page.wait_for_url(server_url + "admin/")
    del lost[:]  # the console's own load from here (the login page's answers are not its)
    try:
        page.locator("#templates-table").wait_for(timeout=90_000)
    except PlaywrightTimeoutError:
        # Not drawn yet. A starved machine draws slowly (its login alone has taken 40 s): wait on. But a page that
        # lost one of its scripts or its config is never drawn: load it again, as an operator would.
        if lost:
            warnings.warn(f"the console was loaded again; its first load lost: {lost}", stacklevel=2)
            page.reload()
        try:
            page.locator("#templates-table").wait_for(timeout=180_000)
        except PlaywrightTimeoutError as error:
            raise AssertionError(f"the console was never drawn; lost loads: {lost or 'none'}; the page shows: "
                                 f"{page.locator('body').inner_text()[:500]!r}") from error
    return page


def _lost_loads(page) -> list[str]:
    """What the page asked for and did not get (a failed request, an error status, a script's error), as seen."""
    lost: list[str] = []
    page.on("requestfailed", lambda r: lost.append(f"{r.url} failed ({r.failure})"))
    page.on("response", lambda r: r.status >= 400 and lost.append(f"{r.url} answered {r.status}"))
    page.on("pageerror", lambda e: lost.append(f"script error {e}"))
    return lost


# The console's tabs (admin/ui.py's ids, in order) and an element each shows once its load has filled it.
CONSOLE_TABS = {"templates": "#templates-table", "versions": "#ver-table", "conversations": "#conv-table",
                "warmup": "#warm", "cache": "#cache-numbers .pd-card", "demo": "#demo-run", "audit": "#audit-table"}


def open_tab(page, tab: str, language: str = "zh") -> None:
    """Select console tab ``tab`` (its id) of a console in ``language``, through the "more tabs" menu where Gradio
    folded it away (a narrow screen, or a bar it measured before a busy machine had laid out its fonts), and wait
    until it has loaded."""
    from admin.i18n import TEXT

    button = page.locator(f"[role=tab][data-tab-id={tab}]")
    if button.count() and button.is_visible():
        button.click()
    else:
        page.locator("button[aria-label='More tabs']").click()
        page.locator(".overflow-dropdown button").filter(has_text=TEXT[language][f"tab_{tab}"]).click()
    page.locator(CONSOLE_TABS[tab]).first.wait_for(timeout=90_000)


def table_rows(page, selector: str) -> list[list[str]]:
    """A Dataframe's rows as shown: its cells are marked cell-<row>-<column> (a hidden copy sizes the columns)."""
    return page.locator(selector).evaluate("""table => {
        const rows = [];
        for (const cell of table.querySelectorAll('[data-testid^="cell-"]')) {
            const [, row, column] = cell.dataset.testid.match(/^cell-(\\d+)-(\\d+)$/) || [];
            if (row !== undefined) (rows[+row] = rows[+row] || [])[+column] = cell.innerText.trim();
        }
        return rows;
    }""")


def pick(page, selector: str, label: str) -> None:
    """Choose ``label`` in the Gradio dropdown ``selector``."""
    page.locator(f"{selector} input").click()
    page.locator("ul[role=listbox] li").filter(has_text=label).first.click()


ROWS_JS = """([selector, expected]) => {
    const table = document.querySelector(selector);
    if (!table) return false;
    const rows = [];
    for (const cell of table.querySelectorAll('[data-testid^="cell-"]')) {
        const [, row, column] = cell.dataset.testid.match(/^cell-(\\d+)-(\\d+)$/) || [];
        if (row !== undefined) (rows[+row] = rows[+row] || [])[+column] = cell.innerText.trim();
    }
    return rows.length === expected.length && expected.every((want, r) => rows[r] && rows[r].length === want.length
        && want.every((cell, c) => cell === null || rows[r][c] === cell));
}"""


def wait_for_rows(page, selector: str, expected: list[list[str | None]], timeout_ms: int = 30_000) -> list[list[str]]:
    """A Dataframe's rows once they are exactly ``expected`` (None: any text in that cell), as table_rows reads
    them: a table an earlier event drew stays on screen until the event asked for has redrawn it. Raises
    AssertionError with the rows shown last when ``timeout_ms`` passes first."""
    try:
        page.wait_for_function(ROWS_JS, arg=[selector, expected], timeout=timeout_ms)
    except PlaywrightTimeoutError:
        raise AssertionError(f"{selector} showed {table_rows(page, selector)}, not {expected}") from None
    return table_rows(page, selector)


def wait_for_text(page, selector: str, expected: str | re.Pattern, *, exact: bool = False,
                  timeout_ms: int = 30_000) -> None:
    """Until the element ``selector`` shows ``expected`` in its text as drawn (across its bold and links): within
    it, all of it (``exact``), or matching it (a pattern, as JavaScript reads it). A component whose event is still
    running shows Gradio's timer ("0.1s") inside it, and an earlier event's text stays until the next has drawn:
    what a test reads must be waited for. Raises AssertionError with what it showed last when ``timeout_ms`` passes
    first."""
    how = "match" if isinstance(expected, re.Pattern) else "exact" if exact else "within"
    wanted = expected.pattern if isinstance(expected, re.Pattern) else expected
    try:
        page.wait_for_function("""([selector, how, wanted]) => {
            const text = document.querySelector(selector)?.innerText.trim();
            if (text === undefined) return false;
            return how === 'exact' ? text === wanted : how === 'within' ? text.includes(wanted)
                : new RegExp(wanted).test(text);
        }""", arg=[selector, how, wanted], timeout=timeout_ms)
    except PlaywrightTimeoutError:
        shown = page.locator(selector).first.inner_text() if page.locator(selector).count() else None
        raise AssertionError(f"{selector} showed {shown!r}, not {expected!r}") from None
