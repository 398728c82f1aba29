"""Every Gradio session belongs to the browser that opened it.

Gradio names a session by a hash the client makes up, and sends it in URLs
(``queue/data?session_hash=…``, ``heartbeat/<hash>``) that proxies and access logs keep. Whoever
holds the hash could read the session's answers as they stream, end its events, or run events in
it, with its state (and so read its conversations). So the hash is bound to a cookie: a page load
without one gets ``pd_browser`` (HttpOnly, SameSite=Strict, Secure over HTTPS);
the first request that names a session hash records which cookie owns it; every later request
naming that hash without that cookie is answered 403 before Gradio sees it.

A claim costs something a stranger cannot make up: the cookie is a random id and its HMAC under a
key of the server's (``pd-browser.key`` in the data dir, shared by every web process), handed out
only by a page load, and a request naming a session nobody owns yet is answered 403 without one. New
claims are limited per cookie and per client address (PREFIXDESK_SESSION_CLAIMS_PER_MINUTE, 429
past it): the owners of idle sessions are forgotten only after MAX_BOUND_SESSIONS newer claims, and
one address may no longer make those up by the hundred thousand to free a closed page's hash.

A page's liveness holds no connection. Gradio's page keeps a heartbeat stream open for as long as it is open,
so that the server learns when it closes; a browser speaking HTTP/1.1 holds six connections per host, so six
open tabs (chat or console) held them all and a seventh never loaded. The pages' script (static/page_life.js)
gives Gradio a heartbeat stream that holds nothing and sends ``GET heartbeat/<hash>`` every 15 s instead, each
answered at once; a page that is closed sends ``POST heartbeat/<hash>``. A session of which nothing was heard
for PREFIXDESK_PAGE_GONE_S (a background tab's timers run once a minute), or whose page said it closed, is
ended (``on_gone``: its server-side state is dropped) and its binding may be forgotten again; a live page's
never is.

Scripts: gradio_client keeps the cookies of the /config it fetches first, so it works unchanged. A
script speaking HTTP itself must load the page (or /config) first and keep cookies (a cookie jar, e.g.
one ``httpx.Client``) from that response on. A page opened from a link on another site is sent no
SameSite=Strict cookie, so it gets a new one; tabs already open on the old cookie are then told to reload.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import logging
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from app.core.callers import ProxyTrust
from app.core.limits import ClientLimiter, RateLimited
from app.log_text import RateLimitedLog, printable
from app.web.bodies import replay, send_whole, whole_body

log = logging.getLogger(__name__)

COOKIE = "pd_browser"
MOUNTS = ("/admin", "")  # the console's Gradio app, then the chat's (the longer prefix first)
PAGES = {"/", "/config", "/admin/", "/admin/config"}  # a browser or gradio_client gets its cookie here
MAX_BOUND_SESSIONS = 100_000  # owners remembered; the oldest idle ones are forgotten first
INLINE_JSON_BYTES = 64 << 10  # larger bodies are parsed on a thread
_COOKIE_VALUE = re.compile(rb"([A-Za-z0-9_-]{22})\.([A-Za-z0-9_-]{22})")  # a random id, its HMAC
NO_STORE = (b"cache-control", b"no-store")  # a page's sign of life is never answered from a cache
_SESSION_HASH = re.compile(r"[A-Za-z0-9_-]{1,64}")
_BODY_ROUTES = ("queue/join", "cancel", "component_server")  # POST bodies that name a session hash
_BODY_ROUTE_PREFIXES = ("run/", "api/", "call/")  # ... and may name one


class SessionGuard:
    """ASGI middleware: requests naming a Gradio session hash need the cookie of the browser that owns it."""

    def __init__(self, app, *, trust: ProxyTrust, text: Mapping[str, Any], secret: bytes, claims_per_minute: int,
                 capacity: int = MAX_BOUND_SESSIONS, page_gone_s: float = 150.0,
                 on_gone: Callable[[str, str], None] = lambda mount, session_hash: None):
        """``text``: the page's words in its language (app/chat/text.py's table, handed in by the composition
        root: the edge imports nothing of the chat), of which the refusals say ``session_not_yours``,
        ``session_hash_invalid`` and ``session_claims``; ``secret``: the key of the cookies' HMAC;
        ``claims_per_minute``: new sessions one cookie, and one client address, may claim a minute (0: no
        limit); ``on_gone(mount, session_hash)``: a page was closed (it said so, or nothing was heard of it
        for ``page_gone_s``)."""
        self.app = app
        self.trust = trust
        self.text = text
        self.secret = secret
        self.owners = SessionOwners(capacity)
        self.page_gone_s = page_gone_s
        self.on_gone = on_gone
        self.claims_by_cookie = ClientLimiter(per_minute=claims_per_minute, concurrent=0)
        self.claims_by_address = ClientLimiter(per_minute=claims_per_minute, concurrent=0)
        self._refused = RateLimitedLog(log)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        cookie = _cookie(scope, self.secret)
        route = _session_route(scope["method"], scope["path"])
        if route is None:
            if cookie is None and scope["method"] == "GET" and scope["path"] in PAGES:
                send = self._giving_cookie(scope, send, _new_cookie(self.secret))
            return await self.app(scope, receive, send)
        for gone in self.owners.expired(time.monotonic()):  # pages not heard of for page_gone_s
            self._gone(gone)
        mount, where = route
        if where == "body":
            body = await whole_body(receive)
            if body is None:  # the client went away (or the size guard cut the body off)
                return None
            receive = replay(body, receive)
            session_hash = await _hash_in_body(body)
        elif where == "query":
            session_hash = _hash_in_query(scope)
        else:
            session_hash = where
        if session_hash is None:  # none named: Gradio answers that itself
            return await self.app(scope, receive, send)
        if not isinstance(session_hash, str) or not _SESSION_HASH.fullmatch(session_hash):
            return await _refuse(send, 400, self.text["session_hash_invalid"])
        key = (mount, session_hash)
        if cookie is None:  # no cookie of a page load: it owns nothing and may claim nothing
            return await self._refuse(scope, send, 403, "session_not_yours", "no cookie of this server's")
        digest = _digest(cookie)
        if key not in self.owners:
            try:
                self.claims_by_cookie.check_rate(digest.hex())
                self.claims_by_address.check_rate(self._address(scope))
            except RateLimited:
                return await self._refuse(scope, send, 429, "session_claims", "too many new sessions "
                                          "(PREFIXDESK_SESSION_CLAIMS_PER_MINUTE)")
        if not self.owners.claim(key, digest):
            return await self._refuse(scope, send, 403, "session_not_yours", "another browser's session")
        if scope["path"].startswith(f"{mount}/gradio_api/heartbeat/"):
            return await self._heartbeat(scope, send, key)
        with self.owners.in_use(key):
            await self.app(scope, receive, send)

    async def _heartbeat(self, scope, send, key: tuple[str, str]) -> None:
        """A page's sign of life (GET: it is open, answered at once) or its last word (POST: it was closed)."""
        if scope["method"] == "POST":
            self.owners.end(key)
            self._gone(key)
            return await send_whole(send, 204, b"", b"text/plain", NO_STORE)
        self.owners.beat(key, time.monotonic() + self.page_gone_s)
        await send_whole(send, 200, b"data: ALIVE\n\n", b"text/event-stream", NO_STORE)

    def _gone(self, key: tuple[str, str]) -> None:
        try:
            self.on_gone(*key)
        except Exception:  # a page's end must never fail another's request
            log.exception("ending the closed page's session failed")

    async def _refuse(self, scope, send, status: int, text: str, why: str) -> None:
        self._refused("refused %s %s from %s with %d: %s", scope["method"], printable(scope["path"]),
                      self._address(scope), status, why)
        await _refuse(send, status, self.text[text])

    def _address(self, scope) -> str:
        """The client's address, as every per-client limit keys it (a trusted proxy's forwarded one)."""
        peer = (scope.get("client") or ("",))[0]
        header = self.trust.forwarded_header.encode("latin-1")
        forwarded = {self.trust.forwarded_header: v.decode("latin-1")
                     for k, v in scope.get("headers") or [] if k == header and self.trust.forwarded_header}
        return self.trust.caller(peer, forwarded).address

    def _giving_cookie(self, scope, send, cookie: bytes):
        secure = "; Secure" if _https(scope, self.trust) else ""
        header = (f"{COOKIE}={cookie.decode()}; Path=/; HttpOnly; SameSite=Strict{secure}").encode()

        async def giving(event):
            if event["type"] == "http.response.start":
                event = {**event, "headers": [*event.get("headers", []), (b"set-cookie", header)]}
            await send(event)

        return giving


@dataclass
class _Owner:
    digest: bytes
    in_use: int = 0  # open streams naming the session (its queue stream): never forgotten then
    alive_until: float = 0.0  # its page's last sign of life + page_gone_s (time.monotonic): never forgotten before


class SessionOwners:
    """Which cookie owns each session hash, in least-recently-used order, at most ``capacity`` of them."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._owners: OrderedDict[tuple[str, str], _Owner] = OrderedDict()
        # The sessions whose pages are alive, the longest unheard first (a sign of life moves one to the end).
        self._alive: OrderedDict[tuple[str, str], None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._owners)

    def __contains__(self, key: tuple[str, str]) -> bool:
        return key in self._owners

    def claim(self, key: tuple[str, str], digest: bytes) -> bool:
        """True when ``digest``'s cookie owns ``key`` (the first to name it does); False for anyone else."""
        owner = self._owners.get(key)
        if owner is None:
            self._owners[key] = _Owner(digest)
            self._forget_idle()
            return True
        if not hmac.compare_digest(owner.digest, digest):
            return False
        self._owners.move_to_end(key)
        return True

    def beat(self, key: tuple[str, str], until: float) -> None:
        """``key``'s page is alive until ``until`` (time.monotonic), unless heard of again (it must be claimed)."""
        self._owners[key].alive_until = until
        self._alive[key] = None
        self._alive.move_to_end(key)

    def end(self, key: tuple[str, str]) -> None:
        """``key``'s page was closed."""
        self._owners[key].alive_until = 0.0
        self._alive.pop(key, None)

    def expired(self, now: float) -> list[tuple[str, str]]:
        """The sessions whose pages were alive and are no longer heard of at ``now`` (each reported once)."""
        gone = []
        while self._alive:
            key = next(iter(self._alive))
            owner = self._owners.get(key)
            if owner is not None and owner.alive_until > now:
                break
            del self._alive[key]
            if owner is not None:
                gone.append(key)
        return gone

    @contextlib.contextmanager
    def in_use(self, key: tuple[str, str]):
        owner = self._owners[key]
        owner.in_use += 1
        try:
            yield
        finally:
            owner.in_use -= 1

    def _forget_idle(self) -> None:
        # A forgotten hash could be claimed by anyone who learns it; an open page says it is alive every 15 s,
        # so only sessions idle through the last MAX_BOUND_SESSIONS new ones are forgotten.
        now = time.monotonic()
        for _ in range(len(self._owners)):
            if len(self._owners) <= self.capacity:
                return
            key, owner = next(iter(self._owners.items()))
            if owner.in_use or owner.alive_until > now:
                self._owners.move_to_end(key)
            else:
                del self._owners[key]


def _session_route(method: str, path: str) -> tuple[str, str] | None:
    """(mount, where the session hash is: "body", "query" or the hash itself) for a route naming one."""
    for mount in MOUNTS:
        prefix = f"{mount}/gradio_api/"
        if path.startswith(prefix):
            rest = path[len(prefix):]
            break
    else:
        return None
    if method == "POST" and (rest in _BODY_ROUTES or rest.startswith(_BODY_ROUTE_PREFIXES)):
        return mount, "body"
    if method == "GET" and rest == "queue/data":
        return mount, "query"
    if (method in ("GET", "POST") and rest.startswith("heartbeat/")) or (method == "GET" and rest.startswith("stream/")):
        return mount, rest.split("/")[1]  # a page's sign of life (GET) or last word (POST); a stream
    return None


async def _hash_in_body(body: bytes) -> object:
    """The body's ``session_hash`` as Gradio will read it (json.loads, the last of duplicate keys), or None."""
    try:
        data = json.loads(body) if len(body) <= INLINE_JSON_BYTES else await asyncio.to_thread(json.loads, body)
    except (ValueError, RecursionError):
        return None  # Gradio refuses the body itself
    return data.get("session_hash") if isinstance(data, dict) else None


def _hash_in_query(scope) -> object:
    values = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True).get("session_hash")
    if not values:
        return None
    return values[0] if len(values) == 1 else ""  # two hashes in one request are refused as invalid


def _cookie(scope, secret: bytes) -> bytes | None:
    """The request's pd_browser cookie, when it is one this server issued (its HMAC checks out)."""
    for name, value in scope.get("headers") or []:
        if name != b"cookie":
            continue
        for part in value.split(b";"):
            key, _, v = part.strip().partition(b"=")
            match = _COOKIE_VALUE.fullmatch(v) if key == COOKIE.encode() else None
            if match and hmac.compare_digest(match.group(2), _mac(secret, match.group(1))):
                return v
    return None


def _new_cookie(secret: bytes) -> bytes:
    nonce = secrets.token_urlsafe(16).encode()
    return nonce + b"." + _mac(secret, nonce)


def _mac(secret: bytes, nonce: bytes) -> bytes:
    return base64.urlsafe_b64encode(hmac.digest(secret, b"pd_browser:" + nonce, "sha256")[:16]).rstrip(b"=")


def _digest(cookie: bytes) -> bytes:
    return hashlib.sha256(cookie).digest()[:16]


def _https(scope, trust: ProxyTrust) -> bool:
    if scope.get("scheme") == "https":
        return True
    peer = (scope.get("client") or ("", 0))[0]
    proto = dict(scope.get("headers") or []).get(b"x-forwarded-proto", b"")
    return trust.trusts(peer) and proto == b"https"


async def _refuse(send, status: int, message: str) -> None:
    await send_whole(send, status, json.dumps({"detail": message}, ensure_ascii=False).encode(), b"application/json")
