"""The admin console at /admin: one Gradio Blocks behind a login, composed of one module per tab.

Gradio's login (``auth=``) guards every route of this app, and every handler checks the caller
again through ``guard``: a disabled operator is refused at once, whatever their browser still holds.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import gradio as gr
from fastapi import FastAPI

from admin import audit, auth
from admin.console import Console
from admin.templates import TemplateAdminError
from app.engine import EngineError
from app.template_files import TemplateFileError

CSS = """
footer { display: none !important; }
#pd-demo-banner { background: #fff4e5; border: 1px solid #f0b429; border-radius: 6px; padding: 4px 12px; }
"""


def guard(console: Console, request: gr.Request | None) -> str:
    """The calling operator's name; raises gr.Error (shown to them, nothing done) otherwise."""
    try:
        return console.operator(request.username if request is not None else None, _login_token(request))
    except auth.NotAuthorized as exc:
        raise gr.Error(str(exc), title="Not authorized") from None


def _login_token(request: gr.Request | None) -> str | None:
    """The value of Gradio's login cookie ("access-token…"), which identifies one login."""
    cookies = getattr(request, "cookies", None) or {}
    return next((v for k, v in cookies.items() if k.startswith("access-token")), None)


@contextlib.contextmanager
def refusals() -> Iterator[None]:
    """Turn a refused action into a message for the operator."""
    try:
        yield
    except (TemplateAdminError, TemplateFileError, LookupError) as exc:
        raise gr.Error(str(exc), title="Refused") from None
    except EngineError as exc:
        raise gr.Error(str(exc), title="Engine") from None


def build_admin(console: Console) -> gr.Blocks:
    from admin.bench_ui import build_bench_tab
    from admin.cache_ui import build_cache_tab
    from admin.templates_ui import build_templates_tab
    from admin.warmup_ui import build_warmup_tab

    def require_operator(request: gr.Request | None) -> str:
        return guard(console, request)

    def audit_rows(request: gr.Request):
        guard(console, request)
        rows = audit.recent(store=console.store)
        return [[f"{r.t:%Y-%m-%d %H:%M:%S}", r.user, r.action, r.target, r.before or "", r.after or ""] for r in rows]

    with gr.Blocks(title="prefixdesk · admin console", analytics_enabled=False) as demo:
        gr.Markdown("## prefixdesk · admin console\nTemplates, warmup and the prefix cache of the one shared engine. "
                    "[Log out](/admin/logout)")
        if console.demo:
            gr.Markdown("⚠️ **Demo mode** (PREFIXDESK_ADMIN_DEMO=true): the operator password is weak. "
                        "Do not let anyone else reach this server.", elem_id="pd-demo-banner")
        with gr.Tabs():
            with gr.Tab("Templates", id="templates"):
                build_templates_tab(demo, console, guard=require_operator)
            with gr.Tab("Warmup", id="warmup"):
                build_warmup_tab(demo, console, guard=require_operator)
            with gr.Tab("Cache", id="cache"):
                build_cache_tab(console.services, require_operator=require_operator)
            with gr.Tab("Benchmark", id="benchmark"):
                build_bench_tab(console.services, require_operator=require_operator)
            with gr.Tab("Audit log", id="audit") as audit_tab:
                audit_table = gr.Dataframe(headers=["time (UTC)", "operator", "action", "target", "before", "after"],
                                           interactive=False, elem_id="audit-table")
                audit_btn = gr.Button("Refresh", size="sm")
        audit_btn.click(audit_rows, None, audit_table, api_name="audit")
        audit_tab.select(audit_rows, None, audit_table, api_visibility="private")
    demo.css = CSS
    return demo


def mount_admin(app: FastAPI, console: Console) -> None:
    """Mount the console at /admin; mount it before the chat takes "/"."""
    blocks = build_admin(console)
    blocks.queue(default_concurrency_limit=None)
    message = None if auth.console_open(store=console.store) else auth.DISABLED_MESSAGE
    gr.mount_gradio_app(app, blocks, path="/admin", footer_links=[],
                        auth=lambda name, password: console.check_login(name, password),
                        auth_message=message or "Operators only: log in with your console account.")
