"""The Templates tab: the table, the editor with its live preview, version diff, create, import/export."""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable
from pathlib import Path

import gradio as gr

from admin import audit, templates as repo
from admin.console import Console
from admin.preview import preview
from admin.ui import refusals
from admin.warmup import warm

HEADERS = ["name", "parent", "language", "published", "latest", "tokens", "full KV blocks", "pinned", "answers",
           "hit rate", "last used"]


def table(console: Console) -> list[list]:
    rows = repo.list_templates(store=console.store, meter=console.meter)
    return [[r.name, r.parent, r.language, r.published_version or "", r.latest_version, r.num_tokens, r.num_blocks,
             "yes" if r.pinned else "", r.num_answers, "" if r.hit_rate is None else round(r.hit_rate, 4),
             f"{r.last_used:%Y-%m-%d %H:%M:%S}" if r.last_used else ""] for r in rows]


def preview_markdown(console: Console, name: str, chain: tuple[str, ...]) -> tuple[str, str]:
    p = preview(meter=console.meter, name=name, chain=chain)
    lines = [f"**{p.num_tokens:,} tokens · {p.num_blocks} full KV blocks** of {console.meter.block_size} tokens "
             f"({p.uncached_tail_tokens} tokens after the last full block are recomputed per request)"]
    if p.too_long:
        lines.append(f"⛔ {p.too_long}")
    lines += [f"⚠️ {w}" for w in p.warnings] or ["✅ nothing in the text changes per request"]
    return "\n\n".join(lines), p.rendered


def build_templates_tab(demo: gr.Blocks, console: Console, *, guard: Callable[[gr.Request | None], str]) -> None:
    store, meter = console.store, console.meter

    def names() -> list[str]:
        return [r.name for r in repo.list_templates(store=store, meter=meter)]

    def refresh(request: gr.Request):
        guard(request)
        return table(console), gr.update(choices=names()), gr.update(choices=[""] + names())

    def open_template(name: str, request: gr.Request):
        guard(request)
        if not name:
            return "", 0, gr.update(choices=[]), False, gr.update(choices=[]), gr.update(choices=[]), ""
        with refusals():
            d = repo.get_template(store=store, name=name)
        numbers = [v.number for v in d.versions]
        info = (f"parent: {d.parent or '—'} · language: {d.language} · "
                f"published: v{d.published_version or '—'} · "
                f"versions: {', '.join(f'v{v.number} ({v.created_by})' for v in d.versions)}")
        return (d.latest.text, d.latest.number, gr.update(choices=numbers, value=d.published_version or numbers[-1]),
                d.pinned, gr.update(choices=numbers, value=numbers[0]), gr.update(choices=numbers, value=numbers[-1]),
                info)

    def live_preview(name: str, text: str, request: gr.Request):
        guard(request)
        if not name:
            return "Choose a template to see its prefix.", ""
        with refusals():
            return preview_markdown(console, name, repo.chain_for(store=store, name=name, text=text))

    def save(name: str, text: str, base_version: float, request: gr.Request):
        user = guard(request)
        with refusals():
            change = repo.save_version(store=store, meter=meter, name=name, text=text, base_version=int(base_version),
                                       user=user)
        numbers = list(range(1, change.after_version + 1))
        return (f"Saved {name!r} as version {change.after_version} (not published yet).", change.after_version,
                gr.update(choices=numbers, value=change.after_version), table(console))

    async def publish(name: str, version: float, request: gr.Request, progress=gr.Progress()):
        user = guard(request)
        progress(0.1, desc=f"publishing {name} v{int(version)}")
        with refusals():
            change = repo.publish(store=store, meter=meter, name=name, version=int(version), user=user)
            progress(0.4, desc=f"warming {name}")
            result = await warm(engine=console.engine, meter=meter, template=store.get_published(name))
        audit.log_action(store=store, user=user, action="warmup", target=name, after=result.num_cached_tokens)
        progress(1.0, desc="done")
        verb = "Rolled back" if change.action == "rollback" else "Published"
        message = (f"{verb} {name!r}: v{change.before_version or '—'} → v{change.after_version}. Warmed in "
                   f"{result.elapsed_ms:.0f} ms: {result.num_cached_tokens} of {result.num_prefix_tokens} prefix "
                   f"tokens are cached.")
        return message, dataclasses.asdict(result) | {"action": change.action}, table(console)

    def pin(name: str, pinned: bool, request: gr.Request):
        user = guard(request)
        with refusals():
            repo.set_pinned(store=store, name=name, pinned=pinned, user=user)
        state = "pinned: kept warm in the background" if pinned else "unpinned"
        return f"{name!r} {state}.", table(console)

    def delete(name: str, request: gr.Request):
        user = guard(request)
        with refusals():
            repo.delete_template(store=store, name=name, user=user)
        return f"Deleted {name!r} (its versions and answers are kept).", table(console), gr.update(choices=names(),
                                                                                                    value=None)

    def diff(name: str, a: float, b: float, request: gr.Request):
        guard(request)
        with refusals():
            d = repo.diff_versions(store=store, meter=meter, name=name, version_a=int(a), version_b=int(b))
        if d.first_diff_token is None:
            summary = f"v{int(a)} and v{int(b)} render the same prefix: all {d.shared_blocks} full blocks stay warm."
        else:
            summary = (f"First differing token: **{d.first_diff_token}** of {d.num_tokens_a} / {d.num_tokens_b}. "
                       f"Shared full KV blocks: **{d.shared_blocks}** of {d.num_blocks_a} / {d.num_blocks_b} — "
                       f"switching reuses {d.shared_blocks * meter.block_size} cached tokens and recomputes the rest.")
        return summary, d.text_diff, dataclasses.asdict(d)

    def create(name: str, parent: str, language: str, text: str, request: gr.Request):
        user = guard(request)
        with refusals():
            repo.create_template(store=store, meter=meter, name=name, text=text, user=user, parent=parent or "",
                                 language=language)
        return (f"Created {name!r} version 1; open it above and publish it to use it in the chat.", table(console),
                gr.update(choices=names(), value=name))

    def new_preview(name: str, parent: str, text: str, request: gr.Request):
        guard(request)
        with refusals():
            return preview_markdown(console, name, repo.parent_chain(store=store, parent=parent or "") + (text,))

    def import_files(paths: list[str] | None, request: gr.Request):
        user = guard(request)
        contents = [(Path(p).name, Path(p).read_text(encoding="utf-8")) for p in paths or []]
        with refusals():
            changes = repo.import_files(store=store, meter=meter, contents=contents, user=user)
        done = ", ".join(f"{c.template} v{c.after_version}" for c in changes) or "nothing changed"
        return f"Imported and published: {done}.", table(console), gr.update(choices=names())

    def export_files(request: gr.Request):
        user = guard(request)
        folder = Path(tempfile.mkdtemp(prefix="prefixdesk-export-"))
        paths = []
        for file_name, content in repo.export_files(store=store):
            (folder / file_name).write_text(content, encoding="utf-8")
            paths.append(str(folder / file_name))
        audit.log_action(store=store, user=user, action="export", target=f"{len(paths)} templates")
        return paths

    gr.Markdown("Versions are immutable: **Save** adds a version, **Publish** picks the one the chat uses (and "
                "warms it). Hit rate = cached / prompt tokens over the template's stored answers.")
    templates_table = gr.Dataframe(headers=HEADERS, interactive=False, elem_id="templates-table", wrap=True)
    refresh_btn = gr.Button("Refresh", size="sm")
    with gr.Row(equal_height=False):
        with gr.Column(scale=3):
            name = gr.Dropdown([], label="Template", elem_id="edit-template", allow_custom_value=True)
            info = gr.Markdown(elem_id="template-info")
            text = gr.Textbox(label="Text (this template's own part; parents come first)", lines=12,
                              elem_id="edit-text")
            base_version = gr.Number(label="Editing from version", interactive=False, precision=0,
                                     elem_id="base-version")
            save_btn = gr.Button("Save as new version", variant="primary", elem_id="save")
            with gr.Row():
                version = gr.Dropdown([], label="Version", elem_id="publish-version",
                                      allow_custom_value=True)
                publish_btn = gr.Button("Publish and warm", variant="primary", elem_id="publish")
            with gr.Row():
                pinned = gr.Checkbox(label="Pinned (kept warm)", elem_id="pinned")
                delete_btn = gr.Button("Delete template", variant="stop", elem_id="delete")
            status = gr.Markdown(elem_id="status")
            result = gr.JSON(label="Last warmup", elem_id="warmup-result")
        with gr.Column(scale=3):
            preview_md = gr.Markdown("Choose a template to see its prefix.", elem_id="preview")
            rendered = gr.Code(label="Exact rendered prefix", language=None, lines=16, elem_id="rendered")
    with gr.Accordion("Compare two versions", open=False):
        with gr.Row():
            version_a = gr.Dropdown([], label="From version", allow_custom_value=True)
            version_b = gr.Dropdown([], label="To version", allow_custom_value=True)
            diff_btn = gr.Button("Diff", elem_id="diff")
        diff_md = gr.Markdown(elem_id="diff-summary")
        diff_code = gr.Code(label="Text diff", language=None, lines=10)
        diff_json = gr.JSON(visible=False)
    with gr.Accordion("New template", open=False):
        with gr.Row():
            new_name = gr.Textbox(label="Name")
            new_parent = gr.Dropdown([""], value="", label="Parent (optional)", allow_custom_value=True)
            new_language = gr.Radio(["zh", "en"], value="zh", label="Language")
        new_text = gr.Textbox(label="Text", lines=6)
        new_preview_md = gr.Markdown()
        new_rendered = gr.Code(label="Rendered prefix", language=None, lines=6)
        create_btn = gr.Button("Create", elem_id="create")
    with gr.Accordion("Import / export template files", open=False):
        gr.Markdown("Files in the templates/ format (`name:`, `parent:`, `language:`, `pinned:`, `---`, text). "
                    "Importing creates new templates and publishes changed texts as new versions.")
        upload = gr.File(file_count="multiple", file_types=[".txt"], label="Template files to import")
        import_btn = gr.Button("Import")
        export_btn = gr.Button("Export all")
        exported = gr.File(label="Exported files", file_count="multiple")

    private = {"api_visibility": "private"}
    refresh_btn.click(refresh, None, [templates_table, name, new_parent], api_name="templates")
    name.change(open_template, name, [text, base_version, version, pinned, version_a, version_b, info],
                api_name="open")
    text.change(live_preview, [name, text], [preview_md, rendered], api_name="preview", trigger_mode="always_last")
    save_btn.click(save, [name, text, base_version], [status, base_version, version, templates_table],
                   api_name="save")
    publish_btn.click(publish, [name, version], [status, result, templates_table], api_name="publish")
    pinned.input(pin, [name, pinned], [status, templates_table], api_name="pin")
    delete_btn.click(delete, name, [status, templates_table, name], api_name="delete")
    diff_btn.click(diff, [name, version_a, version_b], [diff_md, diff_code, diff_json], api_name="diff")
    create_btn.click(create, [new_name, new_parent, new_language, new_text], [status, templates_table, name],
                     api_name="create")
    new_text.change(new_preview, [new_name, new_parent, new_text], [new_preview_md, new_rendered], **private,
                    trigger_mode="always_last")
    import_btn.click(import_files, upload, [status, templates_table, name], api_name="import")
    export_btn.click(export_files, None, exported, api_name="export")
    demo.load(refresh, None, [templates_table, name, new_parent], **private)
