"""The tree's layers, read from the imports: the composition root (app.server) → {chat, web, admin} → core →
{engine, db} → settings; only the composition root imports admin and the chat (the edge takes the chat's words
from it), nothing of the product imports bench, and no module imports itself back through others."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# What each layer may import of the app (besides itself and the shared leaves below).
MAY_IMPORT = {
    "app.server": {"app.chat", "app.web", "admin", "app.core", "app.engine", "app.db"},  # the composition root
    "app.chat": {"app.core", "app.engine", "app.db"},  # the customer's page
    "app.web": {"app.core", "app.engine", "app.db"},
    "admin": {"app.core", "app.engine", "app.db"},
    "app.core": {"app.engine", "app.db"},
    "app.engine": set(),
    "app.db": set(),
    "app.cluster": {"app.core", "app.engine", "app.db"},  # the launcher: a leaf beside the product
    "app.__main__": {"app.server", "app.web", "app.engine", "app.cluster"},
}
# Imported by every layer, importing nothing of the app.
LEAVES = {"app", "app.settings", "app.template_files", "app.log_text"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted([*ROOT.glob("app/**/*.py"), *ROOT.glob("admin/**/*.py"), *ROOT.glob("bench/**/*.py")]):
        if "migrations/versions" in str(path):
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _imports(path: Path) -> set[str]:
    """The project modules ``path`` imports, at any depth of the file (lazy imports count too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # ``from app.db import templates`` imports app.db.templates; ``from app.db import Database``, app.db
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module
                     for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            if name.split(".")[0] in ("app", "admin", "bench"):
                while name not in MODULES and "." in name:
                    name = name.rsplit(".", 1)[0]
                if name in MODULES:
                    found.add(name)
    return found


GRAPH = {m: _imports(p) - {m} for m, p in MODULES.items()}


def _layer(module: str) -> str:
    for layer in sorted(MAY_IMPORT, key=len, reverse=True):
        if module == layer or module.startswith(layer + "."):
            return layer
    return module


def test_every_import_goes_down_a_layer():
    wrong = []
    for module, deps in GRAPH.items():
        if module.startswith("bench") or module in LEAVES:
            continue
        layer = _layer(module)
        assert layer in MAY_IMPORT, f"{module} is in no layer of MAY_IMPORT: place it"
        for dep in deps:
            if dep in LEAVES or _layer(dep) == layer or _layer(dep) in MAY_IMPORT[layer]:
                continue
            wrong.append(f"{module} imports {dep}")
    assert wrong == []


def test_the_shared_leaves_import_nothing_of_the_app():
    assert {m: GRAPH[m] for m in LEAVES} == {m: set() for m in LEAVES}


def test_only_the_composition_root_imports_admin():
    assert sorted({m for m, deps in GRAPH.items() if not m.startswith("admin") and not m.startswith("bench")
                   for d in deps if d.split(".")[0] == "admin"}) == ["app.server"]


def test_nothing_of_the_product_imports_the_benchmark():
    assert [f"{m} imports {d}" for m, deps in GRAPH.items() if m.split(".")[0] in ("app", "admin") for d in deps
            if d.startswith("bench")] == []


def test_no_module_imports_itself_back():
    cycles = []
    for start in GRAPH:
        stack, seen = [(start, (start,))], set()
        while stack:
            module, path = stack.pop()
            for dep in GRAPH[module]:
                if dep == start:
                    cycles.append(" → ".join((*path, dep)))
                elif dep not in seen and dep.split(".")[0] == start.split(".")[0]:
                    seen.add(dep)
                    stack.append((dep, (*path, dep)))
    assert cycles == []
