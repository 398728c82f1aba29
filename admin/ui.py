"""The admin console at /admin: one Gradio Blocks composed of one module per tab.

The gate of admin/login.py keeps strangers from every route of this app; every handler checks the
caller again through ``console.access.require`` (a hidden component is not access control).
"""

from __future__ import annotations

import gradio as gr

from admin.cache_ui import CSS as CACHE_CSS
from admin.cache_ui import build_cache_tab
from admin.context import AdminContext
from admin.conversations_ui import CSS as CONVERSATIONS_CSS
from admin.conversations_ui import build_conversations_tab
from admin.demo_ui import build_demo_tab
from admin.i18n import audit_word, headers
from admin.markup import literal
from admin.queue_ui import build_queue
from admin.templates_ui import build_templates_tab
from admin.versions_ui import build_versions_tab
from admin.warmup_ui import build_warmup_tab
from app.db import audit as db_audit

CSS = CACHE_CSS + CONVERSATIONS_CSS + """
footer { display: none !important; }
#pd-demo-banner { background: #fff4e5; border: 1px solid #f0b429; border-radius: 6px; padding: 4px 12px; }
#pd-console-header { align-items: center; }
#logout { max-width: 140px; }
#pd-queue-row { align-items: center; }
#pd-queue p { margin: 0; }
@media (max-width: 640px) {
  #pd-console-header { flex-wrap: wrap; }
  #pd-console-title { flex: 1 1 100% !important; }
}
"""
# Logging out ends the session on the server, then this tab shows the login page.
LOGOUT_JS = "() => { fetch('/admin/logout', {method: 'POST', credentials: 'same-origin'})" \
            ".finally(() => { window.location.assign('/admin/login'); }); }"


def build_admin(console: AdminContext) -> gr.Blocks:
    t, access = console.text, console.access

    async def who(request: gr.Request):
        return t["logged_in_as"].format(user=literal(await access.require(request)))

    async def audit_rows(request: gr.Request):
        await access.require(request)
        rows = await console.db.read(db_audit.recent)
        def word(kind: str, value: str) -> str:
            return audit_word(console.language, kind, value)

        return [[f"{r.t:%Y-%m-%d %H:%M:%S}", r.user, word("action", r.action), word("value", r.target),
                 word("field", r.field), word("value", r.before or ""), word("value", r.after or "")] for r in rows]

    with gr.Blocks(title=t["title"], analytics_enabled=False) as demo:
        with gr.Row(elem_id="pd-console-header"):
            gr.Markdown(f"## {t['title']}\n{t['subtitle']}", elem_id="pd-console-title")
            user = gr.Markdown(elem_id="pd-user")
            logout = gr.Button(t["logout"], size="sm", elem_id="logout")
        with gr.Row(elem_id="pd-queue-row", equal_height=True):
            queue_check, queue_outputs, after_queue_load = build_queue(console)
        logout.click(None, js=LOGOUT_JS)
        if console.settings.admin_demo:
            gr.Markdown(t["demo_banner"], elem_id="pd-demo-banner")
        loads = []
        with gr.Tabs():
            for tab, build in (("templates", build_templates_tab), ("versions", build_versions_tab),
                               ("conversations", build_conversations_tab), ("warmup", build_warmup_tab),
                               ("cache", build_cache_tab), ("demo", build_demo_tab)):
                with gr.Tab(t[f"tab_{tab}"], id=tab) as shown_tab:
                    load, outputs, *again = build(console)
                loads.append((load, outputs))
                # A tab whose figures another tab's action changes (a publish, a promotion, a rollback) draws them
                # again each time it is opened, not only on a reload.
                for handler, inputs, changed in again:
                    shown_tab.select(handler, inputs, changed, api_visibility="private", show_progress="hidden")
            with gr.Tab(t["tab_audit"], id="audit") as audit_tab:
                audit_table = gr.Dataframe(headers=headers(console.language, "audit_headers"), interactive=False,
                                           elem_id="audit-table", wrap=True)
                audit_btn = gr.Button(t["refresh"], size="sm")
        audit_btn.click(audit_rows, None, audit_table, api_name="audit")
        audit_tab.select(audit_rows, None, audit_table, api_visibility="private")
        demo.load(who, None, user, api_visibility="private", show_progress="hidden")
        after_queue_load(demo.load(queue_check, None, queue_outputs, api_visibility="private",
                                   show_progress="hidden"))
        for handler, outputs in loads:
            demo.load(handler, None, outputs, api_visibility="private", show_progress="hidden")
    return demo
