"""Attack: use the kept chat page (app/web/page_cache.py) to reach other customers or the server's memory.

- Poison it: be the first to load the page after a start, with a forged ``X-Forwarded-Host`` or
  ``X-Forwarded-Proto`` (Gradio writes them into the page's root URL), so that every later customer's page
  sends its questions to the attacker's host.
- Take another's cookie: the first load's answer carries that browser's ``pd_browser`` cookie.
- Fill it: a client varying its Host header for each load, or a page larger than any chat page.

After: a copy is kept per set of the headers that shape it, so a forged header's page goes only to requests
that forge the same header; cookies are added to each answer after the copy (and an answer carrying one
is never kept); at most KEPT copies of at most MAX_KEPT_BYTES each are kept, whatever a client sends.
"""

from __future__ import annotations

import httpx

from app.web.page_cache import KEPT, MAX_KEPT_BYTES, PageCache
from tests.helpers import asgi

FORGED = {"x-forwarded-host": "attacker.example", "x-forwarded-proto": "https"}


def test_a_forged_forwarded_host_builds_a_page_for_the_forger_alone(server_url):
    root = server_url.rstrip("/")
    # The forger loads first, for each of the two paths (and twice, so its copy is surely kept).
    for path in ("config", "", "config", ""):
        forged = httpx.get(server_url + path, headers=FORGED, timeout=60)
        assert forged.status_code == 200
        if path == "config":  # Gradio builds the forger a page rooted at its header: a copy for all would bite
            assert forged.json()["root"] == "https://attacker.example"
    for path in ("config", ""):
        plain = httpx.get(server_url + path, timeout=60)
        assert plain.status_code == 200
        assert "attacker.example" not in plain.text
        assert root in plain.text
    assert httpx.get(server_url + "config", timeout=60).json()["root"] == root
    # One header forged of the two is a set of its own too.
    half = httpx.get(server_url + "config", headers={"x-forwarded-host": "attacker.example"}, timeout=60)
    assert half.status_code == 200 and httpx.get(server_url + "config", timeout=60).json()["root"] == root


def test_no_browser_ever_gets_the_cookie_another_was_issued(server_url):
    cookies = set()
    for _ in range(6):
        answer = httpx.get(server_url, timeout=60)
        assert answer.status_code == 200
        cookies.add(answer.cookies["pd_browser"])
    assert len(cookies) == 6


def _run(cache: PageCache, path: str, host: bytes) -> tuple[int, int]:
    status, body = asgi.get(cache, path, host=host)
    return status, len(body)


def test_a_client_varying_its_host_or_a_huge_page_keeps_no_more_than_the_bound():
    built = []

    async def gradio(scope, receive, send):
        built.append(scope["path"])
        size = MAX_KEPT_BYTES + 1 if scope["path"] == "/huge" else 1000
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/html")]})
        for _ in range(size // 1000):  # in pieces, as a streamed body comes
            await send({"type": "http.response.body", "body": b"x" * 1000, "more_body": True})
        await send({"type": "http.response.body", "body": b"x" * (size % 1000)})

    cache = PageCache(gradio, paths=frozenset({"/", "/huge"}))
    for i in range(10 * KEPT):
        assert _run(cache, "/", f"h{i}.example".encode()) == (200, 1000)
    assert len(cache.kept) == KEPT
    assert sum(len(body) for _, _, body in cache.kept.values()) == KEPT * 1000
    # The newest are kept (each sent again without a build), the oldest were dropped (built again).
    assert _run(cache, "/", f"h{10 * KEPT - 1}.example".encode()) == (200, 1000) and len(built) == 10 * KEPT
    assert _run(cache, "/", b"h0.example") == (200, 1000) and len(built) == 10 * KEPT + 1
    # A page past MAX_KEPT_BYTES is sent whole and never kept: each load builds it again.
    for _ in range(2):
        assert _run(cache, "/huge", b"a.example") == (200, MAX_KEPT_BYTES + 1)
    assert built.count("/huge") == 2
    assert all(key[0] != "/huge" for key in cache.kept)
