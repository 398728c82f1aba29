"""The prefix cache as a tree of templates: what is cached, told the way the templates table tells it.

vLLM's blocks form a trie (each block hash chains over its parent's), so a parent template's blocks
appear once with its children branching off them. ``cache_tree`` labels the mirror's radix tree
with the templates whose prefixes it holds; everything past a template's prefix is a conversation
(or a warmup's probe) and is counted per template instead of drawn; roots in a private namespace
(a tenant's or a benchmark's cache salt) are counted in one line. Each template's numbers are the
same lookup the table makes, so the two always agree.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

from app.core.catalog import TemplateCatalog
from app.engine import CacheBranch, ResidencyMirror


@dataclass(frozen=True)
class TemplateOnNode:
    name: str
    resident_blocks: int  # of its prefix, from the root: the table's "resident blocks"
    num_blocks: int  # full blocks of its prefix


@dataclass(frozen=True)
class TreeNode:
    templates: tuple[TemplateOnNode, ...]  # templates whose resident prefix ends on this node
    prefix_blocks: int  # blocks of this node that are template prefix
    conversations: int  # branches past a template prefix (conversations, warmup probes) below this node
    conversation_blocks: int
    children: tuple[TreeNode, ...]


@dataclass(frozen=True)
class CacheTree:
    roots: tuple[TreeNode, ...]
    salted_namespaces: int  # root branches with a cache salt
    salted_blocks: int
    other_branches: int  # unsalted roots that start with no template's prefix
    other_blocks: int

    @property
    def empty(self) -> bool:
        return not self.roots and not self.salted_namespaces and not self.other_branches


def cache_tree(*, catalog: TemplateCatalog, mirror: ResidencyMirror) -> CacheTree:
    """The mirror's cached blocks labelled with ``catalog``'s templates."""
    ends: dict[int, list[TemplateOnNode]] = {}
    on_prefix: set[int] = set()
    for t in catalog.all():
        match = mirror.match(catalog.prefix_ids(t.name))
        on_prefix.update(match.block_ids)
        if match.block_ids:
            ends.setdefault(match.block_ids[-1], []).append(TemplateOnNode(t.name, match.resident_blocks,
                                                                          match.num_blocks))
    roots, salted, salted_blocks, other, other_blocks = [], 0, 0, 0, 0
    for branch in mirror.tree():
        if branch.cache_salt:
            salted += 1
            salted_blocks += branch.num_blocks_below
        elif branch.block_ids[0] in on_prefix:
            roots.append(_node(branch, on_prefix, ends))
        else:
            other += 1
            other_blocks += branch.num_blocks_below
    roots.sort(key=lambda n: -_weight(n))
    return CacheTree(tuple(roots), salted, salted_blocks, other, other_blocks)


def render_tree_html(tree: CacheTree, *, t: dict[str, str], replica: str = "") -> str:
    """Nested lists: templates with their resident / prefix blocks, conversations as a count."""
    head = f"<p class='pd-replica'><b>{html.escape(t['tree_on'].format(replica=replica))}</b></p>" if replica else ""
    if tree.empty:
        return f"{head}<p>{html.escape(t['tree_empty'])}</p>"
    items = [_item(n, t) for n in tree.roots]
    if tree.other_branches:
        items.append(f"<li>{html.escape(t['tree_conversations'].format(n=tree.other_branches, blocks=tree.other_blocks))}</li>")
    if tree.salted_namespaces:
        items.append(f"<li class='salt'>{html.escape(t['tree_salted'].format(n=tree.salted_namespaces, blocks=tree.salted_blocks))}</li>")
    return f'{head}<div class="cache-tree"><ul>{"".join(items)}</ul></div>'


def _node(branch: CacheBranch, on_prefix: set[int], ends: dict[int, list[TemplateOnNode]]) -> TreeNode:
    prefix_ids = [b for b in branch.block_ids if b in on_prefix]
    templates = tuple(t for b in prefix_ids for t in ends.get(b, ()))
    children: list[TreeNode] = []
    conversations = conversation_blocks = 0
    tail = branch.num_blocks - len(prefix_ids)  # blocks past the prefix in this very branch
    if tail:
        conversations, conversation_blocks = 1, tail + sum(c.num_blocks_below for c in branch.children)
    else:
        for child in branch.children:
            if child.block_ids[0] in on_prefix:
                children.append(_node(child, on_prefix, ends))
            else:
                conversations += 1
                conversation_blocks += child.num_blocks_below
    children.sort(key=lambda n: -_weight(n))
    return TreeNode(templates, len(prefix_ids), conversations, conversation_blocks, tuple(children))


def _weight(node: TreeNode) -> int:
    return node.prefix_blocks + node.conversation_blocks + sum(_weight(c) for c in node.children)


def _item(node: TreeNode, t: dict[str, str]) -> str:
    if node.templates:
        title = " · ".join(f"{html.escape(x.name)} — {x.resident_blocks}/{x.num_blocks}" for x in node.templates)
    else:
        title = html.escape(t["tree_shared"])
    detail = t["tree_blocks"].format(n=node.prefix_blocks)
    if node.conversations:
        detail += " · " + t["tree_conversations"].format(n=node.conversations, blocks=node.conversation_blocks)
    bar = "▮" * min(node.prefix_blocks, 40) + ("…" if node.prefix_blocks > 40 else "")
    sub = "<ul>" + "".join(_item(c, t) for c in node.children) + "</ul>" if node.children else ""
    return f"<li><b>{title}</b> <span class='pd-detail'>{html.escape(detail)}</span><br><code>{bar}</code>{sub}</li>"

