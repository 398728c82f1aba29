"""The chat page and its config are built by Gradio once per set of headers that shape them, and every later load
gets exactly what Gradio built; what the layers around add per browser (its cookie, the security headers) is still
added to each answer."""

import httpx

from app.web.page_cache import PageCache
from tests.helpers import asgi


def test_the_page_and_its_config_are_what_gradio_builds_and_each_browser_still_gets_its_own_cookie(server_url):
    port = server_url.rstrip("/").rsplit(":", 1)[1]
    for path in ("config", ""):
        first, second = (httpx.get(server_url + path, timeout=60) for _ in range(2))
        built = httpx.get(server_url + path + "?fresh=1", timeout=60)  # a query string: Gradio builds it again
        assert first.status_code == second.status_code == built.status_code == 200
        assert first.content == second.content == built.content
        for answer in (first, second):
            assert answer.headers["x-frame-options"] == "DENY"
            assert "pd_browser=" in answer.headers["set-cookie"]
        assert first.cookies["pd_browser"] != second.cookies["pd_browser"]  # one per browser, never kept
        # Another address for the same server: a page built for it, with its own root.
        other = httpx.get(f"http://localhost:{port}/{path}", timeout=60)
        assert other.status_code == 200 and other.content != first.content
        assert f"http://localhost:{port}" in other.text and f"http://localhost:{port}" not in first.text
    assert httpx.get(server_url + "config", timeout=60).json()["root"] == server_url.rstrip("/")


def test_a_kept_answer_is_sent_again_as_it_was_and_only_plain_gets_of_its_paths_are_kept():
    calls = []

    async def gradio(scope, receive, send):
        calls.append((scope["method"], scope["path"], scope["query_string"]))
        cookie = [(b"set-cookie", b"x=1")] if scope["path"] == "/cookie" else []
        status = 404 if scope["path"] == "/missing" else 200
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), *cookie]})
        await send({"type": "http.response.body", "body": b'{"part": 1', "more_body": True})
        await send({"type": "http.response.body", "body": f', "n": {len(calls)}}}'.encode()})

    cache = PageCache(gradio, paths=frozenset({"/config", "/cookie", "/missing"}))

    def get(path: str, **request) -> tuple[int, bytes]:
        return asgi.get(cache, path, **request)

    assert get("/config") == (200, b'{"part": 1, "n": 1}')
    assert get("/config") == (200, b'{"part": 1, "n": 1}')  # kept, whole
    assert get("/config", query=b"theme=dark") == (200, b'{"part": 1, "n": 2}')
    assert get("/config", method="HEAD") == (200, b'{"part": 1, "n": 3}')
    assert get("/config", host=b"b") == (200, b'{"part": 1, "n": 4}')  # another root
    assert get("/other") == (200, b'{"part": 1, "n": 5}')
    assert get("/cookie") == (200, b'{"part": 1, "n": 6}') and get("/cookie") == (200, b'{"part": 1, "n": 7}')
    assert get("/missing") == (404, b'{"part": 1, "n": 8}') and get("/missing") == (404, b'{"part": 1, "n": 9}')
    assert len(calls) == 9
    # The bound on what is kept, whatever a client sends: tests/security/test_page_cache.py.
