"""Attack: frame the chat or the console in another site, or make a page fetch an image from elsewhere.

Before: no page sent X-Frame-Options or a Content-Security-Policy, so any site could frame the
console under a decoy (clickjacking an operator into a reset), and markup that reached a page could
load a remote image (a beacon telling its owner who read it, and when).
After: every response says ``X-Frame-Options: DENY`` and a CSP with ``frame-ancestors 'none'``,
``img-src 'self' data: blob:`` and ``connect-src 'self'``; the chat and the console render and work
under it in chromium with no violation reported. The server writes them itself, so the answers no route
writes carry them too: uvicorn's own 400 for a malformed request, a guard's refusal (the 408 of a body
that comes too slowly: tests/security/test_refusal_logs.py).
"""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from tests.helpers.browser import open_tab
from tests.helpers.servers import operator
from tests.helpers.waiting import wait_until

ACCOUNT = ("op-headers", "operator headers 31")


@pytest.fixture(scope="module")
def remote_host():
    """A web server on 127.0.0.9 standing for another site: the paths anything asked it for."""
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "image/gif")
            self.end_headers()
            self.wfile.write(b"GIF89a\x01\x00\x01\x00\x00\x00\x00;")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.9", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.9:{server.server_address[1]}", asked
    server.shutdown()


def test_every_page_forbids_framing_and_remote_images(server_url, services):
    operator(services, *ACCOUNT)
    cookie = httpx.post(server_url + "admin/login", data={"username": ACCOUNT[0], "password": ACCOUNT[1]}).cookies
    policies = set()
    for path, cookies in (("", None), ("admin/login", None), ("admin/", cookie), ("config", None),
                          ("v1/models", None), ("healthz", None), ("gradio_api/nothing", None)):
        r = httpx.get(server_url + path, cookies=cookies)
        assert (path, r.headers.get("x-frame-options"), r.headers.get("x-content-type-options")) == \
            (path, "DENY", "nosniff")
        policies.add(r.headers.get("content-security-policy"))
    [policy] = policies  # one policy for every page
    directives = {d.split()[0]: d.split()[1:] for d in policy.split("; ")}
    assert directives["frame-ancestors"] == ["'none'"]
    assert directives["img-src"] == ["'self'", "data:", "blob:"]
    assert directives["connect-src"] == ["'self'"]
    assert directives["object-src"] == ["'none'"]


def raw_answer(url: str, request: bytes) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """The status line and headers of the server's answer to ``request``, sent as bytes on a socket of its own."""
    port = int(url.rstrip("/").rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(request)
        answer = b""
        while b"\r\n\r\n" not in answer and (chunk := sock.recv(65536)):
            answer += chunk
    status, _, rest = answer.partition(b"\r\n")
    return status, [tuple(line.split(b": ", 1)) for line in rest.split(b"\r\n\r\n", 1)[0].split(b"\r\n")]


def test_answers_no_route_writes_carry_the_headers_too(server_url):
    session_route = b"GET /gradio_api/heartbeat/nobody HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    for request, expected in ((b"NOT HTTP AT ALL\r\n\r\n", b"HTTP/1.1 400 Bad Request"),  # uvicorn's own
                              (session_route, b"HTTP/1.1 403 Forbidden"),  # the session guard's (no cookie)
                              (b"GET /gradio_api/dev/reload HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                               b"HTTP/1.1 404 Not Found")):  # the route guard's
        status, pairs = raw_answer(server_url, request)
        headers = dict(pairs)
        assert status == expected
        assert (headers[b"x-frame-options"], headers[b"x-content-type-options"]) == (b"DENY", b"nosniff"), request
        assert b"frame-ancestors 'none'" in headers[b"content-security-policy"]
        assert [name for name, _ in pairs].count(b"x-frame-options") == 1  # once, not once per layer


def violations(page) -> list[str]:
    """The CSP violations the page reports (collected from the moment it loads)."""
    return page.evaluate("window.__pdViolations || []")


WATCH_VIOLATIONS = """
window.__pdViolations = [];
document.addEventListener('securitypolicyviolation',
  e => window.__pdViolations.push(`${e.violatedDirective} ${e.blockedURI}`));
"""


def test_the_chat_and_the_console_work_under_the_policy_and_load_nothing_remote(browser, server_url, services,
                                                                               remote_host):
    remote, asked = remote_host
    context = browser.new_context()
    context.add_init_script(WATCH_VIOLATIONS)
    requests: list[str] = []
    context.on("requestfinished", lambda request: requests.append(request.url))  # a blocked one never finishes
    page = context.new_page()
    page.goto(server_url)
    page.locator("#message textarea").wait_for(timeout=90_000)
    page.wait_for_timeout(1000)  # the load event fills the template picker (locators only: no eval under the CSP)
    page.locator("#message textarea").fill("价格保护怎么申请？")
    page.locator("#message textarea").press("Enter")
    page.locator("#chatbot .message.bot .thought-group").first.wait_for(timeout=120_000)  # answered, captioned
    page.evaluate(f"() => {{ const i = new Image(); i.src = '{remote}/beacon.gif'; document.body.append(i); }}")
    wait_until(lambda: violations(page), 60, "the browser to report the blocked image")  # reported, not timed
    assert violations(page) == [f"img-src {remote}/beacon.gif"]

    operator(services, *ACCOUNT)
    console = context.new_page()
    console.goto(server_url + "admin")
    console.locator("#username").wait_for()
    assert violations(console) == []  # the login page
    console.locator("#username").fill(ACCOUNT[0])
    console.locator("#password").fill(ACCOUNT[1])
    console.locator("button[type=submit]").click()
    console.locator("#templates-table").wait_for(timeout=120_000)
    for tab in ("warmup", "cache", "demo", "audit"):
        open_tab(console, tab)
    console.wait_for_timeout(2500)  # the cache tab's plots draw (Vega) and refresh every 2 s
    assert violations(console) == []
    assert asked == []
    assert [u for u in requests if not u.startswith(server_url)] == []
    context.close()
