"""The chat page as the browser tests drive it: open it, ask, read an answer's caption, and watch for anything
Gradio draws when a handler fails (its red "Error" badge, a toast), which a customer must never see."""

from __future__ import annotations

import shutil
import uuid

import sqlite_utils

from tests.helpers.browser import DESKTOP
from tests.helpers.servers import ROOT, SecondServer, slow_answers
from tests.helpers.waiting import wait_until

ANSWERS = "#chatbot .message.bot"  # one group per answer: its text, then its caption
READY = "window.__pdGlyph && document.querySelector('#template input')?.value"

# Records the length of one answer's text each time it changes, until its caption appears.
STREAM_JS = """
(index) => {
  const rec = window.__pdStream = {lengths: [], captioned: false};
  const seen = () => {
    const group = document.querySelectorAll('#chatbot .message.bot')[index];
    if (!group || rec.captioned) return;
    if (group.querySelector('.thought-group')) { rec.captioned = true; return; }
    const text = [...group.querySelectorAll('[data-testid=bot]')].filter(m => !m.querySelector('.thought-group'))
      .map(m => m.innerText).join('').trim();
    if (text && rec.lengths[rec.lengths.length - 1] !== text.length) rec.lengths.push(text.length);
  };
  new MutationObserver(seen).observe(document.querySelector('#chatbot'),
                                     {childList: true, subtree: true, characterData: true});
}
"""

# Every error Gradio shows, as it appears: a toast's text, a component's "Error" badge (its status tracker).
FAULTS_JS = """
() => {
  if (window.__pdFaults) return;
  const faults = window.__pdFaults = [];
  const look = () => {
    for (const el of document.querySelectorAll('[data-testid=toast-body], .error')) {
      const text = (el.innerText || '').trim();
      if (text && el.offsetParent !== null && !el.dataset.pdSeen) {
        el.dataset.pdSeen = '1';
        faults.push(text.slice(0, 200));
      }
    }
  };
  new MutationObserver(look).observe(document.documentElement, {childList: true, subtree: true, characterData: true});
}
"""


def long_answers_server(services, engine_loop, data, *, ui_language: str = "en", **overrides) -> SecondServer:
    """A chat whose answers stream for 15 s or more, whatever the load: long enough to stop or leave."""
    templates = data / "templates"
    templates.mkdir()
    shutil.copy(ROOT / "templates" / "02-support-en.txt", templates)  # 386 tokens + 750 fit in 2,048
    return SecondServer(services, engine_loop, data, templates_dir=str(templates), ui_language=ui_language,
                        **{**slow_answers(), **overrides})


def events_of_gone_pages(app) -> int:
    """How many running events of ``app``'s Gradio pages Gradio knows their page has gone from (a closed tab, a
    reload): Gradio closes each at its next update."""
    from starlette.routing import Mount

    return sum(1 for route in app.routes if isinstance(route, Mount) and getattr(route.app, "blocks", None)
               for jobs in route.app.blocks._queue.active_jobs if jobs for job in jobs if not job.alive)


def database_of(server: SecondServer) -> sqlite_utils.Database:
    return sqlite_utils.Database(server.settings.database_url.removeprefix("sqlite:///"))


def open_chat(browser, url: str, viewport: dict = DESKTOP, *, page=None):
    page = page or browser.new_page(viewport=viewport)
    page.add_init_script(f"({FAULTS_JS})()")
    page.goto(url)
    wait_ready(page, viewport)
    return page


def wait_ready(page, viewport: dict = DESKTOP) -> None:
    # Ready once the page's script runs and the load event has filled the template picker.
    page.wait_for_function(READY, timeout=90_000)
    if viewport["width"] <= 640:  # a phone's sidebar starts closed: wait until it has slid away
        page.wait_for_function("document.querySelector('#pd-sidebar').getBoundingClientRect().right <= 0")


def faults(page) -> list[str]:
    """What Gradio showed of a failure since the page opened (a toast, an "Error" badge)."""
    return page.evaluate("window.__pdFaults || []")


def ask(page, question: str, *, send_button: bool = False, watch: bool = True) -> int:
    """Send ``question``; returns the index of its answer among the chat's answers."""
    index = page.locator(ANSWERS).count()
    if watch:
        page.evaluate(STREAM_JS, index)
    box = page.locator("#message textarea")
    box.fill(question)
    if send_button:
        page.locator("#send").click()
    else:
        box.press("Enter")
    return index


def caption(page, index: int):
    return page.locator(ANSWERS).nth(index).locator(".thought-group .title")


def conversation(db, question: str) -> list[dict]:
    """The stored messages of the conversation that ``question`` (unique) started or continued."""
    (conversation_id,) = [r["conversation_id"] for r in
                          db.query("select conversation_id from messages where role = 'user' and text = ?", [question])]
    return list(db["messages"].rows_where("conversation_id = ?", [conversation_id], order_by="id"))


def wait_for_status(db, question: str, index: int, timeout: float = 30) -> dict:
    """The answer row ``index`` of ``question``'s conversation once it is no longer generating."""
    def answered() -> dict | None:
        try:
            rows = conversation(db, question)
        except ValueError:  # not stored yet
            return None
        answers = [r for r in rows if r["role"] == "assistant"]
        return answers[index] if len(answers) > index and answers[index]["status"] != "generating" else None

    return wait_until(answered, timeout, f"answer {index} of {question!r} to stop generating")


def tag() -> str:
    return uuid.uuid4().hex[:6]


CLOCK_JS = """
(iso) => {
  const [date, time] = iso.split(/[T ]/), [y, mo, d] = date.split('-').map(Number), [h, mi] = time.split(':').map(Number);
  const at = new Date(Date.UTC(y, mo - 1, d, h, mi)), two = (n) => String(n).padStart(2, '0');
  const hm = `${two(at.getHours())}:${two(at.getMinutes())}`;
  return at.toDateString() === new Date().toDateString() ? hm : `${two(at.getMonth() + 1)}-${two(at.getDate())} ${hm}`;
}
"""


def clock(page, stored_at: str) -> str:
    """When a stored answer began (its UTC ``created_at``), as the page's captions say it: in the browser's zone."""
    return page.evaluate(CLOCK_JS, stored_at)
