"""The article's workload: long shared system prompts, short distinct questions, fixed-length answers.

A workload is a list of ``BenchRequest``s (which template, which question, which cache salt) and
the templates they name. Four modes; the first three reproduce the article's three rows:

* ``none``: every request carries its own ``cache_salt``, so vLLM shares no block between them;
* ``static``: a few templates, each warmed once before the run;
* ``dynamic``: more templates than one engine's KV cache holds, Zipf-skewed traffic, and a few
  pinned templates that the load generator keeps warm while the rest compete for the cache;
* ``families``: two template families at once, half the traffic each (which replica serves which
  family, and whether each replica's batch still shares one prefix).

Open-loop runs are windows: Poisson arrivals for ``warmup_s + window_s`` seconds, of which only the
requests arriving after the warm-up are counted (``poisson_window``).

Everything here is pure and deterministic for a given seed; nothing imports vLLM or a UI.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from app import template_files
from app.core.demo import ISSUES, PRODUCTS
from app.core.demo import customer_questions as questions
from app.core.prompts import system_text

MODES = ("none", "static", "dynamic", "families")
TEMPLATE_SETS = ("ecommerce", "long", "family")
DEFAULT_TEMPLATE = "电商客服"
LONG_TEMPLATE_TOKENS = 2000

_CATALOGUE_ITEMS = ("旗舰款", "标准款", "青春款", "礼盒装", "家庭装", "便携款", "升级款", "限定款")
_SHOP_NAME = "优选商城"


@dataclass(frozen=True)
class BenchTemplate:
    """A template as the benchmark sends it: its name, its chain of texts (root first), its parent's
    name (a child of a repository template) and its family (the root's name: the routing key)."""

    name: str
    chain: tuple[str, ...]
    pinned: bool = False
    parent: str = ""
    family: str = ""

    @property
    def system(self) -> str:
        return system_text(self.chain)

    @property
    def routing_family(self) -> str:
        return self.family or self.name


@dataclass(frozen=True)
class BenchRequest:
    index: int
    template: str
    question: str
    cache_salt: str | None  # set in mode "none": a private cache namespace per request


@dataclass(frozen=True)
class Workload:
    mode: str
    templates: tuple[BenchTemplate, ...]
    requests: tuple[BenchRequest, ...]
    warm_first: tuple[str, ...]  # templates computed once before the run starts
    keep_warm: tuple[str, ...]  # templates re-warmed during the run (dynamic mode's pinned ones)

    def template(self, name: str) -> BenchTemplate:
        return next(t for t in self.templates if t.name == name)


class WorkloadError(ValueError):
    """The workload options do not make sense together; the message names the option."""


def base_templates(templates_dir: Path) -> dict[str, BenchTemplate]:
    """The repository's template files as chains (parents first), keyed by name."""
    files = template_files.read_folder(templates_dir)
    by_name = {f.name: f for f in files}
    out: dict[str, BenchTemplate] = {}
    for f in files:
        chain: list[str] = []
        node, root = f, f.name
        while node is not None:
            chain.insert(0, node.text)
            root = node.name
            node = by_name.get(node.parent) if node.parent else None
        out[f.name] = BenchTemplate(f.name, tuple(chain), f.pinned, parent=f.parent, family=root)
    return out


def template_set(kind: str, templates_dir: Path, count_tokens: Callable[[str], int]) -> list[BenchTemplate]:
    """The templates of one workload: ``ecommerce`` (~600 tokens), ``long`` (~2,000) or ``family``.

    ``family`` is the two-level family of the repository: a shared parent and its children, so
    requests share the parent's blocks and, per child, the child's.
    """
    base = base_templates(templates_dir)
    if kind == "ecommerce":
        return [base[DEFAULT_TEMPLATE]]
    if kind == "long":
        return [long_template(base[DEFAULT_TEMPLATE], count_tokens, LONG_TEMPLATE_TOKENS)]
    if kind == "family":
        children = [t for t in base.values() if len(t.chain) > 1]
        if not children:
            raise WorkloadError(f"{templates_dir} has no template with a parent; 'family' needs one")
        return children
    raise WorkloadError(f"--templates must be one of {', '.join(TEMPLATE_SETS)}, not {kind!r}")


def long_template(base: BenchTemplate, count_tokens: Callable[[str], int], target_tokens: int) -> BenchTemplate:
    """``base`` followed by a generated product catalogue, grown until it has ``target_tokens``."""
    rng = random.Random(7)
    lines = [base.system, "", "七、在售商品目录（回答价格与库存问题时以此为准）"]
    i = 0
    while count_tokens("\n".join(lines)) < target_tokens:
        i += 1
        product = PRODUCTS[i % len(PRODUCTS)]
        lines.append(f"{i}. {product}{_CATALOGUE_ITEMS[i % len(_CATALOGUE_ITEMS)]}：售价{rng.randint(19, 4999)}元，"
                     f"库存{rng.randint(0, 500)}件，{rng.choice(ISSUES[:3])}时按第一、三条处理。")
    return BenchTemplate(f"{base.name}-长版", ("\n".join(lines),))


def shop_variants(base: BenchTemplate, n: int, *, tag: str = "") -> list[BenchTemplate]:
    """``n`` root templates that differ from ``base`` in the shop's name near the start, so none share
    blocks; each is a family of its own. ``tag`` tells sets of variants apart (``-A01``)."""
    out = []
    for i in range(n):
        shop = f"{_SHOP_NAME}{tag}第{i + 1:03d}号店"
        name = f"{base.name}-{tag}{i + 1:03d}"
        out.append(BenchTemplate(name, (system_text(tuple(t.replace(_SHOP_NAME, shop) for t in base.chain)),)))
    return out


def dynamic_template_count(capacity_tokens: int, prefix_tokens: int, factor: float = 1.5) -> int:
    """How many variants the dynamic mode uses: ``factor`` times the templates one engine's (one
    replica's) KV cache holds, so they do not all fit in one cache (and, at 1.5, do fit in two)."""
    if prefix_tokens < 1:
        raise WorkloadError("the template has no tokens")
    return max(4, round(factor * capacity_tokens / prefix_tokens))


def build_workload(
    mode: str,
    templates: Sequence[BenchTemplate],
    n_requests: int,
    *,
    seed: int = 0,
    dynamic_templates: int = 0,
    pinned: int = 2,
    zipf_s: float = 1.1,
    salt_prefix: str = "bench",
    families: Sequence[BenchTemplate] = (),
) -> Workload:
    """The requests of one mode. Templates are chosen round-robin, Zipf-skewed in ``dynamic``
    (``zipf_s`` 0: uniform), and at random between the two ``families`` in ``families`` mode.

    In ``dynamic`` mode ``templates[0]`` is copied into ``dynamic_templates`` shop variants; the
    ``pinned`` most popular are kept warm. Raises WorkloadError for options that do not fit.
    """
    if mode not in MODES:
        raise WorkloadError(f"--modes takes {', '.join(MODES)}, not {mode!r}")
    if n_requests < 1:
        raise WorkloadError("a run needs at least 1 request")
    qs = questions(n_requests, seed=seed)
    rng = random.Random(seed + 1)
    if mode == "dynamic":
        if dynamic_templates < 2:
            raise WorkloadError("dynamic mode needs --dynamic-templates of at least 2")
        variants = shop_variants(templates[0], dynamic_templates)
        pinned = max(0, min(pinned, dynamic_templates))
        variants = [replace(t, pinned=i < pinned) for i, t in enumerate(variants)]
        weights = [1.0 / (rank + 1) ** zipf_s for rank in range(len(variants))]
        picks = rng.choices(range(len(variants)), weights=weights, k=n_requests)
        requests = tuple(BenchRequest(i, variants[k].name, q, None) for i, (k, q) in enumerate(zip(picks, qs)))
        keep = tuple(t.name for t in variants if t.pinned)
        return Workload(mode, tuple(variants), requests, warm_first=keep, keep_warm=keep)
    if mode == "families":
        if len(families) != 2:
            raise WorkloadError("families mode needs two template families")
        picks = [rng.randrange(2) for _ in range(n_requests)]
        requests = tuple(BenchRequest(i, families[k].name, q, None) for i, (k, q) in enumerate(zip(picks, qs)))
        names = tuple(t.name for t in families)
        return Workload(mode, tuple(families), requests, warm_first=names, keep_warm=())
    names = [t.name for t in templates]
    requests = tuple(
        BenchRequest(i, names[i % len(names)], q, f"{salt_prefix}-{i}" if mode == "none" else None)
        for i, q in enumerate(qs)
    )
    warm = tuple(names) if mode == "static" else ()
    return Workload(mode, tuple(templates), requests, warm_first=warm, keep_warm=())


def poisson_arrivals(rate_per_s: float, n: int, *, seed: int = 0) -> list[float]:
    """Send times in seconds from the start for ``n`` requests of a Poisson process at ``rate_per_s``."""
    if rate_per_s <= 0:
        raise WorkloadError(f"--rate must be above 0, not {rate_per_s}")
    rng = random.Random(seed + 2)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate_per_s)
    return out


def poisson_window(rate_per_s: float, *, warmup_s: float, window_s: float, seed: int = 0) -> list[float]:
    """Arrival times (s from the start) of a Poisson process at ``rate_per_s`` over ``warmup_s + window_s``.

    The requests arriving before ``warmup_s`` are the warm-up: sent, never counted. The same seed
    gives the same times, and the times of a shorter window are a prefix of a longer one's.
    """
    if rate_per_s <= 0:
        raise WorkloadError(f"--rate must be above 0, not {rate_per_s}")
    if window_s <= 0 or warmup_s < 0:
        raise WorkloadError(f"--window-s must be above 0 and --warmup-s at least 0, not {window_s} and {warmup_s}")
    rng = random.Random(seed + 2)
    t, out = 0.0, []
    while t < warmup_s + window_s:
        out.append(t)
        t += rng.expovariate(rate_per_s)
    return out


def write_template_folder(folder: Path, templates: Sequence[BenchTemplate], repository_dir: Path) -> int:
    """Write ``templates`` in the templates/ file format into ``folder`` (emptied first), with the
    repository files of their parents, so an app seeded from ``folder`` publishes exactly these
    templates under these names; returns the number of files."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.txt"):
        old.unlink()
    repository = {f.name: f for f in template_files.read_folder(repository_dir)}
    files: dict[str, template_files.TemplateFile] = {}
    for t in templates:
        parent = t.parent
        while parent and parent not in files:  # ancestors come from the repository, unchanged
            files[parent] = repository[parent]
            parent = repository[parent].parent
        text = t.chain[-1] if t.parent else t.system
        files[t.name] = template_files.TemplateFile(t.name, text, parent=t.parent)
    for i, f in enumerate(files.values()):
        (folder / f"{i:05d}.txt").write_text(template_files.render(f), encoding="utf-8")
    return len(files)
