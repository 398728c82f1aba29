"""The prefix cache as a tree of templates: what is cached, told the way the templates table tells it.

vLLM's blocks form a trie (each block hash chains over its parent's), so a parent template's blocks
appear once with its children branching off them. ``cache_tree`` labels the mirror's radix tree
with the templates (and live-split candidates) whose prefixes it holds; everything past a template's
prefix is a customer's conversation and is counted per template instead of drawn (a warmup's probe
is not a conversation and is left out); roots in a private namespace are counted in one line each:
the console's demo and A/B (their own cache salts, ``DEMO_SALT_PREFIX``) and the rest (tenants,
benchmarks). ``template_counts`` gives each template's numbers as the tree shows them, so the
table that shows them too always agrees.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

from app.core.catalog import TemplateCatalog
from app.core.demo import DEMO_SALT_PREFIX
from app.engine import CacheBranch, Residency


@dataclass(frozen=True)
class TemplateOnNode:
    name: str
    version: int
    candidate: bool  # a live split's candidate version (else the published one)
    resident_blocks: int  # of its prefix, from the root: the table's "resident blocks"
    num_blocks: int  # full blocks of its prefix
    prefix_tokens: int


@dataclass(frozen=True)
class TreeNode:
    templates: tuple[TemplateOnNode, ...]  # templates whose resident prefix ends on this node
    prefix_blocks: int  # blocks of this node that are template prefix
    conversations: int  # customers' conversations branching off past a template prefix on this node
    conversation_blocks: int
    children: tuple[TreeNode, ...]


@dataclass(frozen=True)
class CacheTree:
    roots: tuple[TreeNode, ...]
    salted_namespaces: int  # root branches with a cache salt that is not the demo's (tenants, benchmarks)
    salted_blocks: int
    demo_namespaces: int  # root branches of the console's demo and A/B
    demo_blocks: int
    other_branches: int  # unsalted roots that start with no template's prefix
    other_blocks: int

    @property
    def empty(self) -> bool:
        return not self.roots and not self.salted_namespaces and not self.demo_namespaces and not self.other_branches


@dataclass(frozen=True)
class TemplateCounts:
    """One template version's numbers as the tree shows them (the cache table shows the same)."""

    resident_blocks: int
    num_blocks: int
    conversations: int  # customers' conversations cached past its prefix


def cache_tree(*, catalog: TemplateCatalog, mirror: Residency, probe_id: int | None = None) -> CacheTree:
    """The mirror's cached blocks labelled with ``catalog``'s template versions. A branch whose first token
    past a template's prefix is ``probe_id`` (a warmup's probe, app/core/warmup.py) is not counted."""
    ends: dict[int, list[TemplateOnNode]] = {}
    on_prefix: set[int] = set()
    for entry in catalog.entries():
        t = entry.template
        match = mirror.match(entry.prefix_ids)
        on_prefix.update(match.block_ids)
        if match.block_ids:
            ends.setdefault(match.block_ids[-1], []).append(TemplateOnNode(
                t.name, t.version_number, entry.candidate, match.resident_blocks, match.num_blocks,
                len(entry.prefix_ids)))
    roots, counts = [], {"salted": [0, 0], "demo": [0, 0], "other": [0, 0]}
    for branch in mirror.tree():
        if branch.cache_salt:
            kind = "demo" if branch.cache_salt.startswith(DEMO_SALT_PREFIX) else "salted"
        elif branch.block_ids[0] in on_prefix:
            roots.append(_node(branch, on_prefix, ends, mirror.block_size, probe_id))
            continue
        else:
            kind = "other"
        counts[kind][0] += 1
        counts[kind][1] += branch.num_blocks_below
    roots.sort(key=lambda n: -_weight(n))
    return CacheTree(tuple(roots), *counts["salted"], *counts["demo"], *counts["other"])


def template_counts(tree: CacheTree) -> dict[tuple[str, bool], TemplateCounts]:
    """Per (template name, is candidate): its resident and prefix blocks and cached conversations, as drawn."""
    out: dict[tuple[str, bool], TemplateCounts] = {}

    def visit(node: TreeNode) -> None:
        for t in node.templates:
            out[t.name, t.candidate] = TemplateCounts(t.resident_blocks, t.num_blocks, node.conversations)
        for child in node.children:
            visit(child)

    for root in tree.roots:
        visit(root)
    return out


def render_tree_html(tree: CacheTree, *, t: dict[str, str], replica: str = "") -> str:
    """Nested lists: templates with their resident / prefix blocks, conversations as a count."""
    head = f"<p class='pd-replica'><b>{html.escape(t['tree_on'].format(replica=replica))}</b></p>" if replica else ""
    if tree.empty:
        return f"{head}<p>{html.escape(t['tree_empty'])}</p>"
    items = [_item(n, t) for n in tree.roots]
    for key, css, n, blocks, unit in (
            ("tree_other", "other", tree.other_branches, tree.other_blocks, "tree_conversations"),
            ("tree_demo", "demo", tree.demo_namespaces, tree.demo_blocks, "tree_namespaces"),
            ("tree_salted", "salt", tree.salted_namespaces, tree.salted_blocks, "tree_namespaces")):
        if n:
            line = t[key].format(what=plural(t, unit, n), blocks=plural(t, "tree_blocks", blocks))
            items.append(f"<li class='{css}'>{html.escape(line)}</li>")
    return f'{head}<div class="cache-tree"><ul>{"".join(items)}</ul></div>'


def template_label(name: str, version: int, candidate: bool, t: dict[str, str]) -> str:
    """A template as the tree and table name it: the published version by name, a candidate with its version."""
    return t["tree_candidate"].format(name=name, version=version) if candidate else name


def _node(branch: CacheBranch, on_prefix: set[int], ends: dict[int, list[TemplateOnNode]], block_size: int,
          probe_id: int | None) -> TreeNode:
    prefix_ids = [b for b in branch.block_ids if b in on_prefix]
    templates = tuple(t for b in prefix_ids for t in ends.get(b, ()))
    ending = ends.get(prefix_ids[-1], ()) if prefix_ids else ()
    offset = ending[0].prefix_tokens - ending[0].num_blocks * block_size if ending else None

    def probe(tokens: tuple[int, ...]) -> bool:
        # The block after a prefix starts with the prefix's last tokens; a warmup's probe token comes next.
        return offset is not None and probe_id is not None and len(tokens) > offset and tokens[offset] == probe_id

    children: list[TreeNode] = []
    conversations = conversation_blocks = 0
    tail = branch.num_blocks - len(prefix_ids)  # blocks past the prefix in this very branch
    if tail:
        if not probe(branch.token_ids[len(prefix_ids) * block_size:]):
            conversations, conversation_blocks = 1, tail + sum(c.num_blocks_below for c in branch.children)
    else:
        for child in branch.children:
            if child.block_ids[0] in on_prefix:
                children.append(_node(child, on_prefix, ends, block_size, probe_id))
            elif not probe(child.token_ids):
                conversations += 1
                conversation_blocks += child.num_blocks_below
    children.sort(key=lambda n: -_weight(n))
    return TreeNode(templates, len(prefix_ids), conversations, conversation_blocks, tuple(children))


def _weight(node: TreeNode) -> int:
    return node.prefix_blocks + node.conversation_blocks + sum(_weight(c) for c in node.children)


def plural(t: dict[str, str], key: str, n: int, **values) -> str:
    """``t[key + "_one"]`` for one, ``t[key]`` otherwise, formatted with ``n`` and ``values``."""
    return t[f"{key}_one" if n == 1 else key].format(n=n, **values)


def _item(node: TreeNode, t: dict[str, str]) -> str:
    if node.templates:
        title = " · ".join(f"{html.escape(template_label(x.name, x.version, x.candidate, t))} — "
                           f"{x.resident_blocks}/{x.num_blocks}" for x in node.templates)
    else:
        title = html.escape(t["tree_shared"])
    detail = plural(t, "tree_blocks", node.prefix_blocks)
    if node.conversations:
        detail += " · " + plural(t, "tree_conversations", node.conversations) + " · " + \
            plural(t, "tree_blocks", node.conversation_blocks)
    bar = "▮" * min(node.prefix_blocks, 40) + ("…" if node.prefix_blocks > 40 else "")
    sub = "<ul>" + "".join(_item(c, t) for c in node.children) + "</ul>" if node.children else ""
    return f"<li><b>{title}</b> <span class='pd-detail'>{html.escape(detail)}</span><br><code>{bar}</code>{sub}</li>"

