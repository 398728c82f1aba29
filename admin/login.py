"""The console's door: the login page, logout, and a gate in front of every /admin route.

The gate is plain ASGI in front of the whole server: a request under /admin without a live console
session never reaches Gradio (no page, no config, no API, no upload), so a stranger learns nothing
of the console — not even which endpoints it has. HTML requests are sent to the login page; others
get 401.
"""

from __future__ import annotations

import html
from http.cookies import SimpleCookie
from urllib.parse import urlsplit

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from admin.access import DEVICE_COOKIE, DEVICE_TTL_S, SESSION_COOKIE, AdminAccess, LoginRefused
from admin.i18n import TEXT
from app.core.callers import ProxyTrust, TenantRefused

PREFIX = "/admin"
OPEN_PATHS = {f"{PREFIX}/login", f"{PREFIX}/logout"}
MAX_FIELD_CHARS = 200


def build_login_router(access: AdminAccess, trust: ProxyTrust, *, admin_open) -> APIRouter:
    """``GET/POST /admin/login``, ``GET/POST /admin/logout`` and ``GET /admin`` (to /admin/).

    ``admin_open()`` is awaited to tell whether any operator exists (the page says how to open
    the console when none does).
    """
    router = APIRouter()
    t = TEXT[access.language]

    @router.get(PREFIX, include_in_schema=False)
    async def admin_root() -> Response:
        return RedirectResponse(f"{PREFIX}/", status_code=307)

    @router.get(f"{PREFIX}/login", include_in_schema=False)
    async def login_page() -> Response:
        return _page(t, "" if await admin_open() else t["console_closed"])

    @router.post(f"{PREFIX}/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        wants_html = "text/html" in request.headers.get("accept", "")
        if not _same_origin(request):
            return _refusal(t, t["cross_origin"], 403, wants_html)
        form = await request.form()
        name, password = form.get("username", ""), form.get("password", "")
        # A refused login shows the page again with the name kept (never the password).
        kept = name if isinstance(name, str) and len(name) <= MAX_FIELD_CHARS else ""
        if not isinstance(name, str) or not isinstance(password, str) or not name or not password:
            return _refusal(t, t["login_fields"], 400, wants_html, name=kept)
        if len(name) > MAX_FIELD_CHARS or len(password) > MAX_FIELD_CHARS:
            return _refusal(t, t["login_too_long"].format(n=MAX_FIELD_CHARS), 400, wants_html, name=kept)
        try:
            client = trust.caller(request.client.host if request.client else None, request.headers).address
        except TenantRefused as exc:
            return _refusal(t, str(exc), 403, wants_html)
        try:
            token, mark = await access.login(name=name.strip(), password=password, client=client,
                                             device=request.cookies.get(DEVICE_COOKIE))
        except LoginRefused as exc:
            message = t["wrong_password"] if exc.status == 401 else str(exc)
            response = _refusal(t, message, exc.status, wants_html, name=kept)
            if exc.retry_after_s:
                response.headers["Retry-After"] = str(exc.retry_after_s)
            return response
        response = (RedirectResponse(f"{PREFIX}/", status_code=303) if wants_html
                    else JSONResponse({"success": True}))
        response.set_cookie(SESSION_COOKIE, token, max_age=int(access.ttl_s), path=PREFIX, httponly=True,
                            samesite="strict", secure=_https(request, trust))
        response.set_cookie(DEVICE_COOKIE, mark, max_age=DEVICE_TTL_S, path=f"{PREFIX}/login", httponly=True,
                            samesite="strict", secure=_https(request, trust))
        return response

    @router.api_route(f"{PREFIX}/logout", methods=["GET", "POST"], include_in_schema=False)
    async def logout(request: Request) -> Response:
        await access.logout(request.cookies.get(SESSION_COOKIE))
        response = RedirectResponse(f"{PREFIX}/login", status_code=303)
        response.delete_cookie(SESSION_COOKIE, path=PREFIX)
        return response

    return router


class AdminGate:
    """ASGI middleware: every path under /admin but the login and logout needs a live session."""

    def __init__(self, app, access: AdminAccess):
        self.app = app
        self.access = access

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        if scope["type"] not in ("http", "websocket") or not path.startswith(f"{PREFIX}/") or path in OPEN_PATHS:
            return await self.app(scope, receive, send)
        if await self.access.operator_of(_cookie(scope, SESSION_COOKIE)) is not None:
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        headers = dict(scope.get("headers") or [])
        if scope.get("method") == "GET" and b"text/html" in headers.get(b"accept", b""):
            response: Response = RedirectResponse(f"{PREFIX}/login", status_code=303)
        else:
            response = JSONResponse({"detail": TEXT[self.access.language]["not_logged_in"]}, status_code=401)
        await response(scope, receive, send)


def _cookie(scope, name: str) -> str | None:
    for key, value in scope.get("headers") or []:
        if key == b"cookie":
            jar = SimpleCookie()
            try:
                jar.load(value.decode("latin-1"))
            except Exception:  # a malformed cookie header carries no session
                return None
            if name in jar:
                return jar[name].value
    return None


def _same_origin(request: Request) -> bool:
    """A browser's cross-site form post carries a foreign (or "null") Origin; refuse it (no login CSRF).
    Clients that are not browsers send no Origin and are let through."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    return origin != "null" and urlsplit(origin).netloc == request.headers.get("host", "")


def _https(request: Request, trust: ProxyTrust) -> bool:
    if request.url.scheme == "https":
        return True
    peer = request.client.host if request.client else ""
    return trust.trusts(peer) and request.headers.get("x-forwarded-proto", "") == "https"


def _refusal(t: dict, message: str, status: int, wants_html: bool, *, name: str = "") -> Response:
    if wants_html:
        return _page(t, message, status=status, name=name)
    return JSONResponse({"detail": message}, status_code=status)


def _page(t: dict, message: str, *, status: int = 200, name: str = "") -> HTMLResponse:
    notice = f'<p class="notice" role="alert">{html.escape(message)}</p>' if message else ""
    body = f"""<!doctype html>
<html lang="{t['lang']}"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(t['login_title'])}</title>
<style>
 body {{ font-family: system-ui, -apple-system, "Segoe UI", "PingFang SC", "Microsoft YaHei", sans-serif;
        background: #f6f7fb; margin: 0; display: grid; place-items: center; min-height: 100vh; color: #1f2937; }}
 main {{ background: #fff; padding: 32px; border-radius: 12px; box-shadow: 0 4px 24px #0001; width: min(360px, 92vw);
        box-sizing: border-box; }}
 h1 {{ font-size: 20px; margin: 0 0 4px; }} p.sub {{ color: #6b7280; margin: 0 0 20px; font-size: 14px; }}
 label {{ display: block; font-size: 14px; margin: 12px 0 4px; }}
 input {{ width: 100%; box-sizing: border-box; padding: 10px; border: 1px solid #d1d5db; border-radius: 8px; font-size: 15px; }}
 button {{ margin-top: 20px; width: 100%; padding: 10px; border: 0; border-radius: 8px; background: #f97316;
          color: #fff; font-size: 15px; cursor: pointer; }}
 .notice {{ background: #fef2f2; color: #991b1b; padding: 8px 12px; border-radius: 8px; font-size: 14px; }}
</style></head>
<body><main>
<h1>{html.escape(t['login_title'])}</h1><p class="sub">{html.escape(t['login_subtitle'])}</p>
{notice}
<form method="post" action="{PREFIX}/login">
<label for="username">{html.escape(t['login_name'])}</label>
<input id="username" name="username" autocomplete="username" required maxlength="{MAX_FIELD_CHARS}" \
value="{html.escape(name, quote=True)}"{'' if name else ' autofocus'}>
<label for="password">{html.escape(t['login_password'])}</label>
<input id="password" name="password" type="password" autocomplete="current-password" required \
maxlength="{MAX_FIELD_CHARS}"{' autofocus' if name else ''}>
<button type="submit">{html.escape(t['login_button'])}</button>
</form></main></body></html>"""
    return HTMLResponse(body, status_code=status, headers={"Cache-Control": "no-store"})

