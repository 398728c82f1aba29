"""``python -m bench.demo_meeting``: the meeting's demo on the real model, timed from the server's start.

A presenter runs ``PREFIXDESK_MODEL=qwen2.5-0.5b-demo make run``, opens the console, goes to the Demo tab and
presses **Cold vs warm**. This does the same in chromium against a fresh data dir (the model is the one
``make demo-model`` prepared) and prints, from the moment ``python -m app`` was started: when the server answered
(``/livez``), when it was ready (``/healthz``: the templates warmed), when the console's Demo tab showed, and when
its headline showed both first-token times, with the two times themselves and the engine's restarts. A picture of
the tab goes to ``--out``::

    python -m bench.demo_meeting --out var/demo-meeting
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
HEADLINE_DONE = ("倍", "×")  # the headline's speedup, in zh and en (admin/i18n.py demo_speedup)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")
    except (OSError, ValueError):
        return 0, {}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-0.5b-demo")
    ap.add_argument("--out", type=Path, default=Path("var/demo-meeting"))
    ap.add_argument("--language", default="zh", choices=("zh", "en"))
    ap.add_argument("--timeout-s", type=float, default=600)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    data = args.out / "data"
    subprocess.run(["rm", "-rf", str(data)], check=True)
    port, password = _free_port(), secrets.token_urlsafe(16)
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PREFIXDESK_MODEL": args.model, "PREFIXDESK_DATA_DIR": str(data),
           "PREFIXDESK_PORT": str(port), "PREFIXDESK_ADMIN_PASSWORD": password, "PREFIXDESK_UI_LANGUAGE": args.language,
           "GRADIO_ANALYTICS_ENABLED": "False"}
    log = open(args.out / "server.log", "w")
    t0 = time.monotonic()
    server = subprocess.Popen([sys.executable, "-m", "app"], env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    seen: dict[str, float] = {}

    def at(name: str) -> None:
        seen[name] = round(time.monotonic() - t0, 1)
        print(f"demo: {name} after {seen[name]} s", flush=True)

    try:
        while "ready" not in seen:
            if server.poll() is not None:
                print(f"demo: the server exited with {server.returncode}; see {args.out / 'server.log'}")
                return 1
            if time.monotonic() - t0 > args.timeout_s:
                print("demo: not ready in time")
                return 1
            if "serving" not in seen and _get(url + "/livez")[0] == 200:
                at("serving")
            status, health = _get(url + "/healthz")
            if status == 200 and health.get("ok"):
                at("ready")
            time.sleep(0.5)
        from playwright.sync_api import sync_playwright

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
            page = browser.new_page(viewport={"width": 1366, "height": 900})
            page.goto(url + "/admin")
            page.locator("#username").fill("admin")
            page.locator("#password").fill(password)
            page.locator("button[type=submit]").click()
            page.locator("[role=tab][data-tab-id=demo]").click(timeout=120_000)
            page.locator("#demo-run").wait_for(timeout=120_000)
            page.wait_for_function("() => document.querySelector('#demo-template input')?.value", timeout=120_000)
            at("demo tab shown")
            page.locator("#demo-run").click()
            page.wait_for_function("(done) => done.some(d => document.querySelector('#demo-headline')?.innerText"
                                   ".includes(d))", arg=list(HEADLINE_DONE), timeout=args.timeout_s * 1000)
            at("cold and warm shown")
            headline = page.locator("#demo-headline").inner_text().strip()
            cold = page.locator("#demo-cold").inner_text().strip().splitlines()
            warm = page.locator("#demo-warm").inner_text().strip().splitlines()
            page.screenshot(path=str(args.out / "demo-cold-vs-warm.png"), full_page=False)
            browser.close()
        restarts = _get(url + "/healthz")[1].get("restarts")
        result = {"seconds_from_start": seen, "headline": headline, "cold": cold[:3], "warm": warm[:3],
                  "engine_restarts": restarts, "model": args.model}
        (args.out / "demo-meeting.json").write_text(json.dumps(result, ensure_ascii=False, indent=2))
        print(json.dumps(result, ensure_ascii=False, indent=2))
        return 0
    finally:
        try:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(server.pid, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
