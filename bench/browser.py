"""``python -m bench.browser``: the first glyph a customer sees, measured in a real browser (issue 9).

Drives chromium (Playwright) against a running server: each simulated customer has a page of their
own, types a question and presses Enter; the page's own script (app/chat/static/chat.js) records the time from
Enter to the first glyph of the answer painted on screen. The engine's time to first token for the
same answer comes from the caption under it (its details). Prints p50/p90 of both and of their
difference for each number of concurrent users and writes ``browser-glyph.json`` under ``--out``::

    python -m bench.browser --url http://127.0.0.1:7860/ --users 1,8 --rounds 10

Every simulated customer comes from 127.0.0.1, so start the server with the per-client limits off
(``PREFIXDESK_RATE_LIMIT_PER_MINUTE=0 PREFIXDESK_MAX_STREAMS_PER_CLIENT=0
PREFIXDESK_RATE_LIMIT_PER_ADDRESS_PER_MINUTE=0 PREFIXDESK_MAX_STREAMS_PER_ADDRESS=0
PREFIXDESK_MAX_CONNECTIONS_PER_CLIENT=0``), or they are refused.

What lies between the two numbers: the browser sending the question (Gradio's queue: a join request,
then the event stream), the server storing the message and building the prompt before the engine
starts, and after the first token the server's update, its trip to the browser and the chatbot's
render and paint. The target is a first glyph at most ``TARGET_MS`` after the engine's first token.

A customer's browser has a machine of its own; here it shares the server's cores, and while the engine
generates (all of an answer's tokens, about 1.4 s for the demo model's 256) the engine's worker and core
processes take nearly two cores, so the page's scripts wait for the CPU. ``--server-nice 19`` gives the
browser the CPU its own machine would have: it lowers the server's scheduling group (Linux autogroup: a
server started in a session of its own, e.g. by ``setsid``, is a group of its own, and a group's share
of the CPU is set only by its autogroup nice) for the measurement, and restores it afterwards. The
number is recorded with the run; report both.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit

from bench.report import percentile

TARGET_MS = 150  # browser first glyph at most this much after the engine's first token, at p50
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1366, "height": 768}
QUESTIONS = {"zh": "我刚买的手机屏幕碎了能退吗？", "en": "Can I return shoes I wore once?"}
# The caption's details (its message's aria-label holds them while they are folded): "server began replying 12 ms"
# / "服务器开始回复 12 毫秒" (the engine's first token).
ENGINE_TTFT = re.compile(r"(?:server began replying (\d+) ms|服务器开始回复 (\d+) 毫秒)")
READY_JS = "window.__pdGlyph && document.querySelector('#template input')?.value"
ANSWER = "#chatbot .message.bot"


@dataclass(frozen=True)
class GlyphSample:
    users: int  # concurrent users in the run
    user: int
    round: int
    glyph_ms: int  # Enter → first glyph of the answer painted, as the page measured it
    engine_ttft_ms: int  # the same answer's engine time to first token, from its caption

    @property
    def overhead_ms(self) -> int:
        return self.glyph_ms - self.engine_ttft_ms


@dataclass(frozen=True)
class GlyphRun:
    users: int
    samples: list[GlyphSample]
    errors: list[str]

    def figures(self) -> dict[str, float]:
        glyph = [s.glyph_ms for s in self.samples]
        ttft = [s.engine_ttft_ms for s in self.samples]
        over = [s.overhead_ms for s in self.samples]
        return {"glyph_p50_ms": percentile(glyph, 50), "glyph_p90_ms": percentile(glyph, 90),
                "engine_ttft_p50_ms": percentile(ttft, 50), "engine_ttft_p90_ms": percentile(ttft, 90),
                "overhead_p50_ms": percentile(over, 50), "overhead_p90_ms": percentile(over, 90)}

    @property
    def target_met(self) -> bool:
        return bool(self.samples) and self.figures()["overhead_p50_ms"] <= TARGET_MS


async def measure(url: str, *, users: int, rounds: int, warmup: int = 1, question: str | None = None,
                  chromium: str = CHROMIUM, timeout_s: float = 120) -> GlyphRun:
    """``users`` customers, each on a page of their own, ask ``rounds`` questions at the same moments.

    Each round starts a new conversation, so every question has the same prompt; ``warmup`` rounds
    before them are not counted (the first answer of a page also loads its fonts and code).
    """
    from playwright.async_api import async_playwright

    samples: list[GlyphSample] = []
    errors: list[str] = []
    barrier = asyncio.Barrier(users)
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
        try:
            await asyncio.gather(*(_customer(browser, url, users, user, rounds, warmup, question, barrier, samples,
                                             errors, timeout_s) for user in range(users)))
        finally:
            await browser.close()
    return GlyphRun(users, sorted(samples, key=lambda s: (s.round, s.user)), errors)


async def _customer(browser, url: str, users: int, user: int, rounds: int, warmup: int, question: str | None,
                    barrier: asyncio.Barrier, samples: list[GlyphSample], errors: list[str], timeout_s: float):
    context = await browser.new_context(viewport=VIEWPORT)  # a session of its own: its own conversations
    page = await context.new_page()
    await page.goto(url)
    await page.wait_for_function(READY_JS, timeout=timeout_s * 1000)
    english = (await page.locator("#send").inner_text()).strip() == "Send"
    text = question or QUESTIONS["en" if english else "zh"]
    for round_ in range(-warmup, rounds):
        await page.locator("#new-conversation").click()
        await page.wait_for_function(f"document.querySelectorAll('{ANSWER}').length === 0", timeout=timeout_s * 1000)
        box = page.locator("#message textarea")
        await box.fill(f"{text} ({user}-{round_})")
        await barrier.wait()
        await box.press("Enter")
        title = page.locator(f"{ANSWER} .thought-group .title").first
        await title.wait_for(timeout=timeout_s * 1000)
        # Read from the folded caption's label: opening the details would change what is measured next
        # (Gradio re-renders an opened caption on the next update, ~0.9 s of script on this machine).
        details = await page.locator(f"{ANSWER} [data-testid=bot]:has(.thought-group)").first.get_attribute(
            "aria-label") or ""
        await page.wait_for_function("window.__pdGlyph.byAnswer[0] !== undefined", timeout=5_000)
        glyph = await page.evaluate("window.__pdGlyph.byAnswer[0]")
        found = ENGINE_TTFT.search(details)
        if found is None or glyph is None:
            errors.append(f"user {user} round {round_}: {details.strip()[:200]!r} (glyph {glyph})")
        elif round_ >= 0:
            samples.append(GlyphSample(users, user, round_, int(glyph), int(found.group(1) or found.group(2))))
    await context.close()


def report(runs: list[GlyphRun]) -> str:
    lines = [(f"{'users':>5} {'answers':>7} │ {'first glyph p50':>15} {'p90':>6} │ {'engine TTFT p50':>15} {'p90':>6} │ "
              f"{'glyph − TTFT p50':>16} {'p90':>6} │ target (p50 ≤ TTFT + {TARGET_MS} ms)")]
    for run in runs:
        f = run.figures()
        lines.append(f"{run.users:>5} {len(run.samples):>7} │ {f['glyph_p50_ms']:>12.0f} ms {f['glyph_p90_ms']:>6.0f} │ "
                     f"{f['engine_ttft_p50_ms']:>12.0f} ms {f['engine_ttft_p90_ms']:>6.0f} │ "
                     f"{f['overhead_p50_ms']:>13.0f} ms {f['overhead_p90_ms']:>6.0f} │ "
                     f"{'met' if run.target_met else 'MISSED'}" + (f" ({len(run.errors)} errors)" if run.errors else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.browser", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="the chat page of a running server, e.g. http://127.0.0.1:7860/")
    p.add_argument("--users", default="1,8", help="comma list: concurrent users of each run (default 1,8)")
    p.add_argument("--rounds", type=int, default=10, help="questions each user asks per run, after one warm-up")
    p.add_argument("--warmup", type=int, default=1, help="rounds per user before the measured ones")
    p.add_argument("--question", help="the question (default: one in the page's language)")
    p.add_argument("--chromium", default=CHROMIUM, help="the chromium executable (default: Debian's)")
    p.add_argument("--out", type=Path, default=Path("bench-out"), help="folder for browser-glyph.json")
    p.add_argument("--server-nice", type=int, choices=range(-20, 20), metavar="N",
                   help="the server's autogroup nice during the runs (19: the browser first; default: unchanged)")
    args = p.parse_args(argv)

    with server_nice(args.url, args.server_nice) as niced:
        runs = _measure_all(args)
    print(report(runs))
    args.out.mkdir(parents=True, exist_ok=True)
    out = {"url": args.url, "target_ms": TARGET_MS, "load_average": os.getloadavg(), "cpus": os.cpu_count(),
           "server_autogroup_nice": niced,
           "runs": [{"users": r.users, **r.figures(), "target_met": r.target_met, "errors": r.errors,
                     "samples": [asdict(s) for s in r.samples]} for r in runs]}
    (args.out / "browser-glyph.json").write_text(json.dumps(out, indent=2), encoding="utf-8")
    print(f"wrote {args.out / 'browser-glyph.json'}", file=sys.stderr)
    return 0 if runs and all(r.samples and not r.errors for r in runs) else 1


def _measure_all(args) -> list[GlyphRun]:
    runs = []
    for users in (int(u) for u in args.users.split(",")):
        started = time.monotonic()
        run = asyncio.run(measure(args.url, users=users, rounds=args.rounds, warmup=args.warmup,
                                  question=args.question, chromium=args.chromium))
        runs.append(run)
        print(f"{users} users: {len(run.samples)} answers in {time.monotonic() - started:.0f} s", file=sys.stderr)
        for error in run.errors:
            print(f"  error: {error}", file=sys.stderr)
    return runs


@contextlib.contextmanager
def server_nice(url: str, nice: int | None):
    """Set the autogroup nice of the process listening on ``url``'s port (and so of its whole session) for
    the block, then put the old value back; yields the nice in force (None: left as it was)."""
    if nice is None:
        yield None
        return
    import psutil

    port = urlsplit(url).port or 80
    pid = next((c.pid for c in psutil.net_connections("tcp") if c.laddr and c.laddr.port == port
                and c.status == psutil.CONN_LISTEN and c.pid), None)
    if pid is None:
        raise SystemExit(f"--server-nice: no process of this user listens on port {port}")
    if os.getsid(pid) == os.getsid(0):
        raise SystemExit("--server-nice: the server runs in this benchmark's session, so its scheduling group is the "
                         "browser's too; start the server in a session of its own (setsid python -m app)")
    group = Path(f"/proc/{pid}/autogroup")
    before = int(group.read_text().split("nice")[1])
    group.write_text(str(nice))
    try:
        yield nice
    finally:
        group.write_text(str(before))


if __name__ == "__main__":
    sys.exit(main())
