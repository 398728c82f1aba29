"""The Templates tab: the table, the editor with its live preview, version diff, create, import/export.

A refused action (stale version, too long, unknown name) is shown in the status line; the fields
keep their values and are not marked as errors.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import gradio as gr

from admin.context import AdminContext
from admin.i18n import hazard_text, headers, refusal
from admin.markup import literal
from admin.preview import preview
from admin.templates import TemplateRow
from app.core.warmup import warm
from app.db.templates import TemplateAdminError
from app.template_files import TemplateFileError

REFUSED = (TemplateAdminError, TemplateFileError, LookupError, ValueError)


def table_rows(console: AdminContext, rows: list[TemplateRow]) -> list[list]:
    yes = console.text["yes"]
    return [[r.name, r.parent, r.language, r.published_version or "", r.latest_version, r.num_tokens, r.num_blocks,
             yes if r.pinned else "", yes if r.internal else "", r.num_answers,
             "" if r.hit_rate is None else f"{r.hit_rate:.1%}",
             f"{r.last_used:%Y-%m-%d %H:%M}" if r.last_used else ""] for r in rows]


def build_templates_tab(console: AdminContext):
    """The tab's components and events; returns its refresh handler and outputs for the page load, and what to
    draw again when the tab is opened (handler, inputs, outputs)."""
    t, access, templates = console.text, console.access, console.templates

    def refused(exc: Exception) -> str:
        return t["refused"].format(message=literal(refusal(console.language, exc) or exc))

    async def table() -> list[list]:
        return table_rows(console, await templates.rows())

    async def info_line(name: str, select: int | None = None) -> tuple:
        """The editor's fields for ``name`` (editor, below); the version picker shows ``select``, else the
        published version."""
        d = await templates.detail(name)
        numbers = [v.number for v in d.versions]
        info = t["tpl_info"].format(parent=literal(d.parent) if d.parent else "—", language=d.language,
                                    published=f"v{d.published_version}" if d.published_version else "—",
                                    versions=", ".join(f"v{v.number} ({literal(v.created_by)})" for v in d.versions))
        return (d.latest.text, d.latest.number,
                gr.update(choices=numbers, value=select or d.published_version or numbers[-1]),
                d.pinned, d.internal, gr.update(choices=numbers, value=numbers[0]),
                gr.update(choices=numbers, value=numbers[-1]), info, d.title, "\n".join(d.examples))

    async def refresh(request: gr.Request):
        await access.require(request)
        names = await templates.names()
        return await table(), gr.update(choices=names), gr.update(choices=[""] + names)

    async def again(name: str, request: gr.Request):
        """(table, version picker, pinned, internal, diff A, diff B, info): the tab opened again, after another tab
        published, promoted or rolled back. The editor's text, its base version and the picked versions stay as
        the operator left them (an unsaved edit is never overwritten; a save over a newer version is still
        refused); the pickers gain versions saved since."""
        await access.require(request)
        if not name:
            return await table(), *[gr.skip()] * 6
        try:
            _, _, version, pinned_now, internal_now, _, _, info_now, *_ = await info_line(name)
        except REFUSED:  # deleted meanwhile: the table says so
            return await table(), *[gr.skip()] * 6
        numbers = gr.update(choices=version["choices"])
        return await table(), numbers, pinned_now, internal_now, numbers, numbers, info_now

    async def open_template(name: str, request: gr.Request):
        await access.require(request)
        if not name:
            return ("", 0, gr.update(choices=[]), False, False, gr.update(choices=[]), gr.update(choices=[]), "", "",
                    "")
        try:
            return await info_line(name)
        except REFUSED as exc:
            return (gr.skip(),) * 7 + (refused(exc), gr.skip(), gr.skip())

    async def live_preview(name: str, text: str, request: gr.Request):
        await access.require(request)
        if not name:
            return t["tpl_pick_first"], ""
        try:
            return await preview_markdown(console, name, await templates.chain(name, text))
        except REFUSED as exc:
            return refused(exc), ""

    async def save(name: str, text: str, base_version: float, request: gr.Request):
        user = await access.require(request)
        try:
            change = await templates.save(name=name, text=text, base_version=int(base_version), user=user)
        except REFUSED as exc:
            return refused(exc), gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()
        # The new version is picked for publishing: "Publish this version" then publishes what was just saved;
        # the diff's lists gain it too (A: the first version, B: the new one).
        _, latest, version, _, _, version_a, version_b, info, *_ = await info_line(name, select=change.after_version)
        return (t["tpl_saved"].format(name=literal(name), version=change.after_version), latest, version, await table(),
                info,
                version_a, version_b)

    async def publish(name: str, version: float, request: gr.Request, progress=gr.Progress()):
        user = await access.require(request)
        try:
            progress(0.2, desc=f"{name} v{int(version)}")
            change = await templates.publish(name=name, version=int(version), user=user)
            template = console.catalog.get(name)
            progress(0.6, desc=console.text["warm_button"])
            result = await warm(console.engine, template, console.catalog.prefix_ids(name), probe_id=console.probe_id,
                                shards=console.settings.family_shards)
        except REFUSED as exc:
            return refused(exc), gr.skip(), gr.skip()
        verb = t["tpl_verb_rollback"] if change.action == "rollback" else t["tpl_verb_publish"]
        before = f"v{change.before_version}" if change.before_version else "—"
        message = t["tpl_published"].format(verb=verb, name=literal(name), before=before, after=change.after_version,
                                            ms=f"{result.elapsed_ms:.0f}", cached=result.num_cached_tokens,
                                            prefix=result.num_prefix_tokens)
        info = (await info_line(name))[7]
        return message, await table(), info

    async def set_flag(name: str, value: bool, flag: str, request: gr.Request):
        user = await access.require(request)
        try:
            await templates.set_flag(name=name, flag=flag, value=value, user=user)
        except REFUSED as exc:
            return refused(exc), gr.skip()
        key = f"tpl_{flag}_{'on' if value else 'off'}"
        return t[key].format(name=literal(name)), await table()

    async def present(name: str, title: str, examples: str, request: gr.Request):
        """What customers see of the template: its title in the topic picker, the questions an empty chat offers."""
        user = await access.require(request)
        if not name:
            return t["tpl_pick_first"]
        try:
            await templates.set_presentation(name=name, title=title if isinstance(title, str) else "",
                                             examples=(examples if isinstance(examples, str) else "").splitlines(),
                                             user=user)
        except REFUSED as exc:
            return refused(exc)
        return t["tpl_presented"].format(name=literal(name))

    async def pin(name: str, value: bool, request: gr.Request):
        return await set_flag(name, value, "pinned", request)

    async def internal(name: str, value: bool, request: gr.Request):
        return await set_flag(name, value, "internal", request)

    async def delete(name: str, request: gr.Request):
        user = await access.require(request)
        try:
            await templates.delete(name=name, user=user)
        except REFUSED as exc:
            return refused(exc), gr.skip(), gr.skip()
        return (t["tpl_deleted"].format(name=literal(name)), await table(),
                gr.update(choices=await templates.names(), value=None))

    async def diff(name: str, a: float, b: float, request: gr.Request):
        await access.require(request)
        try:
            d = await templates.diff(name=name, version_a=int(a), version_b=int(b))
        except REFUSED as exc:
            return refused(exc), ""
        size = console.meter.block_size
        if d.first_diff_token is None:
            summary = t["diff_same"].format(a=int(a), b=int(b), blocks=d.shared_blocks)
        else:
            summary = t["diff_summary"].format(first=d.first_diff_token, na=d.num_tokens_a, nb=d.num_tokens_b,
                                               shared=d.shared_blocks, ba=d.num_blocks_a, bb=d.num_blocks_b,
                                               tokens=d.shared_blocks * size)
        return summary, d.text_diff

    async def create(name: str, parent: str, language: str, text: str, request: gr.Request):
        user = await access.require(request)
        try:
            await templates.create(name=name, text=text, user=user, parent=parent or "", language=language)
        except REFUSED as exc:
            return refused(exc), gr.skip(), gr.skip()
        return (t["tpl_created"].format(name=literal(name.strip())), await table(),
                gr.update(choices=await templates.names(), value=name.strip()))

    async def new_preview(name: str, parent: str, text: str, request: gr.Request):
        await access.require(request)
        try:
            return await preview_markdown(console, name, await templates.parent_chain(parent or "") + (text,))
        except REFUSED as exc:
            return refused(exc), ""

    async def import_files(paths: list[str] | None, request: gr.Request):
        user = await access.require(request)
        try:
            contents = [(Path(p).name, Path(p).read_text(encoding="utf-8")) for p in paths or []]
            changes = await templates.import_files(contents, user=user)
        except UnicodeDecodeError:
            return refused(ValueError("template files must be UTF-8 text")), gr.skip(), gr.skip()
        except REFUSED as exc:
            return refused(exc), gr.skip(), gr.skip()
        done = ", ".join(f"{literal(c.template)} v{c.after_version}" for c in changes) or t["tpl_nothing_changed"]
        return t["tpl_imported"].format(done=done), await table(), gr.update(choices=await templates.names())

    async def export_files(request: gr.Request):
        await access.require(request)
        await asyncio.to_thread(console.exports.prune)
        folder = console.exports.new_folder()  # removed after its time and at shutdown (admin/exports.py)
        console.exports.expire_later()
        paths = []
        for file_name, content in await templates.export_files():
            (folder / file_name).write_text(content, encoding="utf-8")
            paths.append(str(folder / file_name))
        return paths

    status = gr.Markdown(elem_id="template-status")
    templates_table = gr.Dataframe(headers=headers(console.language, "tpl_headers"), interactive=False,
                                   elem_id="templates-table", wrap=True, max_height=360)
    refresh_btn = gr.Button(t["refresh"], size="sm")
    with gr.Row():
        with gr.Column(scale=3):
            name = gr.Dropdown([], allow_custom_value=True, label=t["tpl_choose"], elem_id="edit-template")
            info = gr.Markdown(elem_id="template-info")
            text = gr.Textbox(label=t["tpl_text"], lines=12, max_lines=30, elem_id="template-text")
            base_version = gr.Number(visible=False, precision=0)
            with gr.Row():
                save_btn = gr.Button(t["tpl_save"], variant="primary", elem_id="save")
                version = gr.Dropdown([], allow_custom_value=True, label=t["tpl_version"], elem_id="publish-version")
                publish_btn = gr.Button(t["tpl_publish"], elem_id="publish")
            with gr.Accordion(t["tpl_customers_see"], open=False, elem_id="template-presentation"):
                with gr.Row():
                    title = gr.Textbox(label=t["tpl_title"], max_length=60, elem_id="template-title", scale=1)
                    examples = gr.Textbox(label=t["tpl_examples"], lines=4, max_lines=4, max_length=1000,
                                          elem_id="template-examples", scale=2)
                present_btn = gr.Button(t["tpl_present_save"], size="sm", elem_id="present")
            with gr.Row():
                pinned = gr.Checkbox(label=t["tpl_pinned"], elem_id="pinned")
                internal_box = gr.Checkbox(label=t["tpl_internal"], elem_id="internal")
                delete_btn = gr.Button(t["tpl_delete"], variant="stop", size="sm", elem_id="delete")
        with gr.Column(scale=2):
            preview_md = gr.Markdown(elem_id="preview")
            rendered = gr.Code(label=t["rendered"], language=None, lines=8, max_lines=16)
    with gr.Row():
        version_a = gr.Dropdown([], allow_custom_value=True, label=t["diff_a"], elem_id="diff-a")
        version_b = gr.Dropdown([], allow_custom_value=True, label=t["diff_b"], elem_id="diff-b")
        diff_btn = gr.Button(t["diff_button"], elem_id="diff")
    diff_md = gr.Markdown(elem_id="diff-summary")
    diff_code = gr.Code(label=t["diff_label"], language=None, lines=8, max_lines=24, elem_id="diff-text")
    with gr.Accordion(t["new_template"], open=False):
        with gr.Row():
            new_name = gr.Textbox(label=t["new_name"], max_length=100)
            new_parent = gr.Dropdown([""], allow_custom_value=True, value="", label=t["new_parent"])
            new_language = gr.Radio(["zh", "en"], value=console.language, label=t["new_language"])
        new_text = gr.Textbox(label=t["tpl_text"], lines=6)
        new_preview_md = gr.Markdown()
        new_rendered = gr.Code(label=t["rendered"], language=None, lines=6)
        create_btn = gr.Button(t["create"], elem_id="create")
    with gr.Accordion(t["files"], open=False):
        gr.Markdown(t["files_help"])
        upload = gr.File(file_count="multiple", file_types=[".txt"], label=t["files_upload"])
        import_btn = gr.Button(t["import"])
        export_btn = gr.Button(t["export"])
        exported = gr.File(label=t["exported"], file_count="multiple")

    quiet = {"show_progress": "minimal"}
    editor = [text, base_version, version, pinned, internal_box, version_a, version_b, info, title, examples]
    refresh_btn.click(refresh, None, [templates_table, name, new_parent], api_name="templates", **quiet)
    name.change(open_template, name, editor, api_name="open", **quiet)
    text.change(live_preview, [name, text], [preview_md, rendered], api_name="preview", trigger_mode="always_last",
                show_progress="hidden")
    save_btn.click(save, [name, text, base_version],
                   [status, base_version, version, templates_table, info, version_a, version_b], api_name="save",
                   **quiet)
    publish_btn.click(publish, [name, version], [status, templates_table, info], api_name="publish")
    present_btn.click(present, [name, title, examples], status, api_name="present", **quiet)
    pinned.input(pin, [name, pinned], [status, templates_table], api_name="pin", **quiet)
    internal_box.input(internal, [name, internal_box], [status, templates_table], api_name="internal", **quiet)
    delete_btn.click(delete, name, [status, templates_table, name], api_name="delete", **quiet)
    diff_btn.click(diff, [name, version_a, version_b], [diff_md, diff_code], api_name="diff", **quiet)
    create_btn.click(create, [new_name, new_parent, new_language, new_text], [status, templates_table, name],
                     api_name="create", **quiet)
    new_text.change(new_preview, [new_name, new_parent, new_text], [new_preview_md, new_rendered],
                    api_visibility="private", trigger_mode="always_last", show_progress="hidden")
    import_btn.click(import_files, upload, [status, templates_table, name], api_name="import", **quiet)
    export_btn.click(export_files, None, exported, api_name="export", **quiet)
    return (refresh, [templates_table, name, new_parent],
            (again, name, [templates_table, version, pinned, internal_box, version_a, version_b, info]))


async def preview_markdown(console: AdminContext, name: str, chain: tuple[str, ...]) -> tuple[str, str]:
    t = console.text
    p = await asyncio.to_thread(preview, meter=console.meter, name=name, chain=chain)
    lines = [t["preview_size"].format(tokens=p.num_tokens, blocks=p.num_blocks, block_size=console.meter.block_size,
                                      tail=p.uncached_tail_tokens)]
    if p.too_long:
        lines.append(f"⛔ {literal(p.too_long)}")
    lines += [f"⚠️ {literal(hazard_text(t, h))}" for h in p.hazards] or [t["preview_ok"]]
    return "\n\n".join(lines), p.rendered
