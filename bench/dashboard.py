"""Draw docs/grafana/prefixdesk.json's panels from real scrapes of a running app: no Grafana can run here.

    python -m bench.dashboard [--seconds 90] [--out docs/images/grafana-panels.png]
    python -m bench.dashboard --redraw docs/images/grafana-panels.json   # the picture again from kept scrapes

Starts the app on the built-in random-weight demo model (the local engine, whose vLLM figures /metrics passes
on), sends known traffic through its desk — answers on two templates, one of them in a live A/B split, a
stopped answer, a failed one, refused messages, thumbs, first-text reports and two person requests — and
scrapes /metrics every --every seconds as Prometheus would. Each panel's queries are then evaluated over the
scrapes with bench/promql.py and drawn with matplotlib: a picture of the queries, not a Grafana screenshot.
The first-text reports are the script's, as a browser would send them (the engine's first token plus 40 ms):
no browser runs. Prints what it sent and what the last scrape says, and writes the scrapes as JSON beside the
picture.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.promql import evaluate, legend, parse, selectors

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "docs" / "grafana" / "prefixdesk.json"
TOKEN = "dashboard-render-token-5e1c"
SHOP, SUPPORT = "电商客服", "support-en"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=90.0, help="how long the traffic runs")
    ap.add_argument("--every", type=float, default=2.0, help="seconds between scrapes")
    ap.add_argument("--window", default="20s", help="what $__rate_interval stands for")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "images" / "grafana-panels.png")
    ap.add_argument("--redraw", type=Path, help="draw from scrapes this script wrote before; start nothing")
    args = ap.parse_args(argv)
    if args.redraw:
        kept = json.loads(args.redraw.read_text(encoding="utf-8"))
        history = [(k["t"], {name: {tuple(sorted(labels.items())): v for labels, v in series}
                             for name, series in k["samples"].items()}) for k in kept]
        _draw(history, args.window, args.out)
        print(f"{args.out} from {len(history)} scrapes")
        return 0

    from app.db import templates as db_templates
    from app.settings import load_settings
    from app.server import build_services, create_app, uvicorn_config

    data_dir = Path(tempfile.mkdtemp(prefix="prefixdesk-dashboard-"))
    settings = load_settings(environ={}, data_dir=str(data_dir), templates_dir=str(ROOT / "templates"),
                             kv_cache_mib=64, max_tokens=48, max_model_len=2048, port=_free_port(),
                             rate_limit_per_minute=0, max_streams_per_client=0, rate_limit_per_address_per_minute=0,
                             max_streams_per_address=0, keep_warm_interval_s=0,
                             engine_step_delays=True, step_delay_ms=20, metrics_token=TOKEN)
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:  # vLLM binds to the loop of its first request: the server's
        services = pool.submit(build_services, settings).result()
    import uvicorn

    server = uvicorn.Server(uvicorn_config(create_app(services), settings, timeout_graceful_shutdown=2))
    served = asyncio.run_coroutine_threadsafe(server.serve(), loop)
    url = f"http://127.0.0.1:{settings.port}/"
    while not (server.started and services.ready and services.ready.is_set()):
        if served.done():
            served.result()
        time.sleep(0.5)
    services.db.run(db_templates.save_version, name=SUPPORT, text="You answer orders and returns, briefly.",
                    base_version=1, user="ops", check_fits=lambda *_: None)
    services.db.run(db_templates.start_split, name=SUPPORT, version=2, share=0.5, user="ops",
                    check_fits=lambda *_: None)
    asyncio.run_coroutine_threadsafe(services.catalog.refresh(), loop).result()

    history: list[tuple[float, dict]] = []
    start = time.monotonic()
    traffic = asyncio.run_coroutine_threadsafe(_traffic(services.desk, args.seconds), loop)
    while not traffic.done() or not history or history[-1][0] < args.seconds:
        history.append((time.monotonic() - start, _scrape(url)))
        time.sleep(max(0.0, args.every - (time.monotonic() - start - history[-1][0])))
    sent = traffic.result()
    history.append((time.monotonic() - start, _scrape(url)))
    server.should_exit = True
    served.result(timeout=30)
    services.close()

    args.out.parent.mkdir(parents=True, exist_ok=True)
    _draw(history, args.window, args.out)
    raw = args.out.with_suffix(".json")
    kept = _dashboard_names() | {n for _, s in history for n in s
                                 if n.startswith("prefixdesk:") and not n.endswith("_created")}
    raw.write_text(json.dumps([{"t": round(t, 2), "samples": {name: [[dict(k), v] for k, v in by.items()]
                                                              for name, by in s.items() if name in kept}}
                               for t, s in history], ensure_ascii=False))
    print(json.dumps({"sent": sent, "scrapes": len(history), "seconds": round(history[-1][0], 1),
                      "picture": str(args.out), "scrapes_json": str(raw)}, ensure_ascii=False, indent=1))
    last = history[-1][1]
    for name in ("prefixdesk:answers_total", "prefixdesk:refused_total", "prefixdesk:person_queue_waiting",
                 "prefixdesk:ratings", "prefixdesk:split_conversations", "vllm:prefix_cache_hits_total",
                 "vllm:prefix_cache_queries_total"):
        for labels, v in sorted(last.get(name, {}).items()):
            print(f"{name}{dict(labels) or ''} {v:g}")
    return 0


async def _traffic(desk, seconds: float) -> dict[str, int]:
    """Answers at about two a second for ``seconds``, with the rest of the known traffic at fixed points."""
    from app.core.desk import DeskInputError, Finished, Progress

    sent = {"answers": 0, "stopped": 0, "failed": 0, "refused": 0, "rated": 0, "shown": 0, "person": 0}
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    n = 0

    async def one(i: int) -> None:
        key = f"dashboard-{i}"
        template = SUPPORT if i % 3 == 0 else SHOP
        final = None
        async for event in desk.answer(session_key=key, client="192.0.2.90", template_name=template,
                                       message=f"问题 {i}: 运费怎么算？", max_tokens=8):
            final = event
        assert isinstance(final, Finished)
        sent["answers"] += 1
        row = final.message
        if row.ttft_ms is not None and i % 2 == 0:
            await desk.first_visible(session_key=key, conversation_id=row.conversation_id, ms=row.ttft_ms + 40)
            sent["shown"] += 1
        if i % 4 == 1:
            await desk.rate(session_key=key, message_id=row.id, thumbs=1 if i % 8 == 1 else -1)
            sent["rated"] += 1
        if i in (20, 45):
            await desk.request_person(session_key=key, conversation_id=row.conversation_id)
            sent["person"] += 1

    async def stopped() -> None:
        stream = desk.answer(session_key="dashboard-stop", client="192.0.2.90", template_name=SHOP,
                             message="请详细介绍退货流程。", max_tokens=400, ignore_eos=True)
        async for event in stream:
            if isinstance(event, Progress):
                break
        await stream.aclose()
        sent["stopped"] += 1

    tasks = []
    while loop.time() - t0 < seconds:
        tasks.append(asyncio.ensure_future(one(n)))
        if n == 30:
            tasks.append(asyncio.ensure_future(stopped()))
        if n == 60:
            async for _ in desk.answer(session_key="dashboard-long", client="192.0.2.90", template_name=SHOP,
                                       message="退货" * 9_000):
                pass
            sent["failed"] += 1
        if n % 25 == 10:
            try:
                desk.admit(client="192.0.2.90", message="   ")
            except DeskInputError:
                sent["refused"] += 1
        n += 1
        await asyncio.sleep(0.5)
    await asyncio.gather(*tasks)
    return sent


def _dashboard_names() -> set[str]:
    """The sample names the dashboard's queries read."""
    panels = json.loads(DASHBOARD.read_text(encoding="utf-8"))["panels"]
    return set().union(*(selectors(parse(t["expr"])) for p in panels for t in p.get("targets", [])))


def _scrape(url: str) -> dict:
    r = httpx.get(url + "metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
    r.raise_for_status()
    samples: dict = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return samples


def _draw(history: list[tuple[float, dict]], window: str, out: Path) -> None:
    import matplotlib

    matplotlib.use("agg")
    import matplotlib.pyplot as plt
    from matplotlib import font_manager

    cjk = [f.name for f in font_manager.fontManager.ttflist if "CJK" in f.name or "WenQuanYi" in f.name]
    if cjk:
        plt.rcParams["font.family"] = [cjk[0], "DejaVu Sans"]
    panels = [p for p in json.loads(DASHBOARD.read_text(encoding="utf-8"))["panels"] if p["type"] != "row"]
    cols = 3
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(cols * 6.2, rows * 3.6), squeeze=False)
    times = [t for t, _ in history]
    for ax, panel in zip(axes.flat, panels):
        for target in panel["targets"]:
            node = parse(target["expr"], rate_interval=window)
            series: dict = {}
            for i in range(len(history)):
                for labels, v in evaluate(node, history, i).items():
                    series.setdefault(labels, {})[i] = v
            for labels, points in sorted(series.items()):
                ax.plot([times[i] for i in points], list(points.values()), lw=1.3,
                        label=legend(target["legendFormat"], labels))
        unit = panel["fieldConfig"]["defaults"]["unit"]
        ax.set_title(panel["title"], fontsize=9)
        ax.set_xlabel("seconds into the run", fontsize=7)
        ax.set_ylabel({"reqps": "per second", "percentunit": "share", "s": "seconds"}.get(unit, ""), fontsize=7)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=6, loc="upper left")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle("docs/grafana/prefixdesk.json's queries evaluated over real scrapes of a running app "
                 f"($__rate_interval = {window}); rendered by bench/dashboard.py, not a Grafana screenshot",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(out, dpi=90)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
