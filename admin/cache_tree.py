"""The prefix cache as a tree: cached blocks from the residency mirror, labelled with templates.

vLLM's blocks form a trie (each block hash chains over its parent's), so a parent template's
blocks appear once with its children branching off them. ``cache_tree`` turns the mirror's radix
tree into ``TreeNode``s that name the templates whose prefix ends in each branch and count which
blocks are template prefix and which are conversation turns; ``render_tree_html`` draws it.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

from app.desk import Desk
from app.engine import CacheBranch, Engine


@dataclass(frozen=True)
class TreeNode:
    num_blocks: int  # blocks of this branch
    num_blocks_below: int  # blocks of this branch and all under it
    template_blocks: int  # of this branch's blocks, those inside some template's prefix
    templates_ending: tuple[str, ...]  # templates whose cached prefix ends in this branch
    cache_salt: str | None  # a root branch of a salted namespace (a tenant's private cache)
    children: tuple[TreeNode, ...]


def cache_tree(*, desk: Desk, engine: Engine) -> list[TreeNode]:
    """The cached blocks as a tree, biggest root first; empty when KV-cache events are off."""
    mirror = engine.residency
    if mirror is None:
        return []
    paths = {t.name: mirror.match(desk.prefix_ids(t)).block_ids for t in desk.templates()}
    on_prefix = {block_id for path in paths.values() for block_id in path}
    ends = {}
    for name, path in paths.items():
        if path:
            ends.setdefault(path[-1], []).append(name)
    roots = [_node(b, on_prefix, ends) for b in mirror.tree()]
    return sorted(roots, key=lambda n: -n.num_blocks_below)


def render_tree_html(nodes: Sequence[TreeNode], *, block_size: int, language: str = "en") -> str:
    """Nested lists: each branch with its block count, template names, and conversation blocks."""
    if not nodes:
        return f"<p>{_t(language, 'The prefix cache is empty.', '前缀缓存为空。')}</p>"
    return f'<div class="cache-tree">{_list(nodes, block_size, language)}</div>'


def _node(branch: CacheBranch, on_prefix: set[int], ends: dict[int, list[str]]) -> TreeNode:
    names = tuple(name for block_id in branch.block_ids for name in ends.get(block_id, ()))
    children = tuple(sorted((_node(c, on_prefix, ends) for c in branch.children),
                            key=lambda n: -n.num_blocks_below))
    return TreeNode(
        num_blocks=branch.num_blocks,
        num_blocks_below=branch.num_blocks_below,
        template_blocks=sum(1 for block_id in branch.block_ids if block_id in on_prefix),
        templates_ending=names,
        cache_salt=branch.cache_salt,
        children=children,
    )


def _list(nodes: Sequence[TreeNode], block_size: int, language: str) -> str:
    items = []
    for n in nodes:
        if n.templates_ending:
            title = " · ".join(html.escape(name) for name in n.templates_ending)
        elif n.template_blocks:
            title = _t(language, "shared prefix", "共享前缀")
        else:
            title = _t(language, "conversation turns", "对话内容")
        if n.cache_salt:
            title += f' <span class="salt">[{_t(language, "salted", "加盐")} {html.escape(n.cache_salt[:8])}…]</span>'
        turns = n.num_blocks - n.template_blocks
        detail = _t(language, f"{n.num_blocks} blocks", f"{n.num_blocks} 个块")
        if n.template_blocks and turns:
            detail += _t(language, f" ({n.template_blocks} template, {turns} conversation)",
                         f"（模板 {n.template_blocks}，对话 {turns}）")
        detail += f" · {n.num_blocks * block_size} tokens"
        if n.children:
            detail += _t(language, f" · {n.num_blocks_below} with branches", f" · 含分支共 {n.num_blocks_below} 个块")
        bar = "▮" * min(n.num_blocks, 40) + ("…" if n.num_blocks > 40 else "")
        sub = _list(n.children, block_size, language) if n.children else ""
        items.append(f"<li><b>{title}</b> — {detail}<br><code>{bar}</code>{sub}</li>")
    return "<ul>" + "".join(items) + "</ul>"


def _t(language: str, en: str, zh: str) -> str:
    return zh if language == "zh" else en
