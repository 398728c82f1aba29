"""The few PromQL forms docs/grafana/prefixdesk.json uses, evaluated over scrapes kept in memory: no Grafana or
Prometheus can run here, so bench/dashboard.py draws the dashboard's panels with this.

Forms: a selector ``name{label="value", ...}``, ``rate(selector[30s])``, ``sum|max|avg|min by (labels) (expr)``,
``histogram_quantile(q, expr)``, ``a / b`` (series matched on equal labels) and numbers. ``rate`` here is the
increase between the first and the last sample in the window over the time between them; Prometheus
extrapolates to the window's edges, so its values differ a little at a series' start.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

Labels = tuple  # sorted (name, value) pairs
Samples = dict[str, dict[Labels, float]]  # a scrape: sample name → labels → value
AGGREGATIONS = {"sum": sum, "max": max, "min": min, "avg": lambda xs: sum(xs) / len(xs)}
_TOKEN = re.compile(r'\s*(?:(?P<num>\d+(?:\.\d+)?)|(?P<dur>\[\d+[smh]\])|(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)|'
                    r'(?P<str>"[^"]*")|(?P<op>[(){},=/]))')


class PromqlError(ValueError):
    """An expression outside the forms above."""


@dataclass(frozen=True)
class Node:
    kind: str  # selector, rate, agg, quantile, div, number
    name: str = ""
    matchers: tuple = ()
    window_s: float = 0.0
    by: tuple = ()
    args: tuple = ()
    value: float = 0.0


def parse(expr: str, *, rate_interval: str = "30s") -> Node:
    """The expression's tree; raises PromqlError. ``$__rate_interval`` stands for ``rate_interval``."""
    text = expr.replace("$__rate_interval", rate_interval)
    tokens, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            if text[pos:].strip() == "":
                break
            raise PromqlError(f"cannot read {text[pos:]!r}")
        tokens.append((m.lastgroup, m.group(m.lastgroup)))
        pos = m.end()
    parser = _Parser(tokens)
    node = parser.expr()
    if parser.i != len(tokens):
        raise PromqlError(f"unexpected {tokens[parser.i][1]!r}")
    return node


def selectors(node: Node) -> set[str]:
    """Every metric name the expression reads (as the samples are named: ``_total``, ``_bucket``)."""
    if node.kind == "selector":
        return {node.name}
    return set().union(*(selectors(a) for a in node.args)) if node.args else set()


def evaluate(node: Node, history: list[tuple[float, Samples]], at: int) -> dict[Labels, float]:
    """The value of ``node`` at scrape ``at`` of ``history`` ((time, samples) in time order)."""
    kind = node.kind
    if kind == "number":
        return {(): node.value}
    if kind == "selector":
        return _select(history[at][1], node)
    if kind == "rate":
        [sel] = node.args
        t_end = history[at][0]
        window = [(t, _select(s, sel)) for t, s in history[:at + 1] if t > t_end - sel.window_s]
        out = {}
        for labels in set().union(*(v for _, v in window)) if window else ():
            points = [(t, v[labels]) for t, v in window if labels in v]
            if len(points) >= 2 and points[-1][0] > points[0][0]:
                out[labels] = max(0.0, points[-1][1] - points[0][1]) / (points[-1][0] - points[0][0])
        return out
    if kind == "agg":
        groups: dict[Labels, list[float]] = {}
        for labels, v in evaluate(node.args[0], history, at).items():
            key = tuple((k, x) for k, x in labels if k in node.by)
            groups.setdefault(key, []).append(v)
        return {k: AGGREGATIONS[node.name](vs) for k, vs in groups.items()}
    if kind == "div":
        a, b = (evaluate(x, history, at) for x in node.args)
        return {k: a[k] / b[k] for k in a if k in b and b[k] != 0}
    if kind == "quantile":
        return _quantile(node.args[0].value, evaluate(node.args[1], history, at))
    raise PromqlError(kind)


def legend(template: str, labels: Labels) -> str:
    """Grafana's legend: ``{{label}}`` replaced by the series' value of it."""
    values = dict(labels)
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: values.get(m.group(1), ""), template)


def _select(samples: Samples, sel: Node) -> dict[Labels, float]:
    return {labels: v for labels, v in samples.get(sel.name, {}).items()
            if all(dict(labels).get(k, "") == want for k, want in sel.matchers)}


def _quantile(q: float, buckets: dict[Labels, float]) -> dict[Labels, float]:
    """Prometheus' histogram_quantile: linear within the bucket the rank falls in."""
    series: dict[Labels, list[tuple[float, float]]] = {}
    for labels, v in buckets.items():
        d = dict(labels)
        le = float(d.pop("le"))
        series.setdefault(tuple(sorted(d.items())), []).append((le, v))
    out = {}
    for labels, points in series.items():
        points.sort()
        total = points[-1][1]
        if total <= 0 or not math.isinf(points[-1][0]):
            continue
        rank = q * total
        lower_le, lower_count = 0.0, 0.0
        for le, count in points:
            if count >= rank:
                if math.isinf(le):
                    out[labels] = lower_le
                else:
                    out[labels] = lower_le + (le - lower_le) * (rank - lower_count) / max(count - lower_count, 1e-12)
                break
            lower_le, lower_count = le, count
    return out


class _Parser:
    def __init__(self, tokens):
        self.tokens, self.i = tokens, 0

    def peek(self):
        return self.tokens[self.i] if self.i < len(self.tokens) else (None, None)

    def take(self, value=None):
        kind, text = self.peek()
        if kind is None or (value is not None and text != value):
            raise PromqlError(f"expected {value!r}, found {text!r}")
        self.i += 1
        return kind, text

    def expr(self) -> Node:
        node = self.unary()
        while self.peek()[1] == "/":
            self.take("/")
            node = Node("div", args=(node, self.unary()))
        return node

    def unary(self) -> Node:
        kind, text = self.take()
        if kind == "num":
            return Node("number", value=float(text))
        if kind != "name":
            raise PromqlError(f"unexpected {text!r}")
        if text in AGGREGATIONS:
            by = ()
            if self.peek()[1] == "by":
                self.take("by")
                by = self.names()
            self.take("(")
            inner = self.expr()
            self.take(")")
            return Node("agg", name=text, by=by, args=(inner,))
        if text == "rate":
            self.take("(")
            sel = self.selector(self.take()[1])
            kind, window = self.take()
            if kind != "dur":
                raise PromqlError("rate needs a [window]")
            self.take(")")
            unit = {"s": 1, "m": 60, "h": 3600}[window[-2]]
            return Node("rate", args=(Node("selector", name=sel.name, matchers=sel.matchers,
                                           window_s=float(window[1:-2]) * unit),))
        if text == "histogram_quantile":
            self.take("(")
            q = self.unary()
            self.take(",")
            inner = self.expr()
            self.take(")")
            return Node("quantile", args=(q, inner))
        return self.selector(text)

    def selector(self, name: str) -> Node:
        matchers = []
        if self.peek()[1] == "{":
            self.take("{")
            while self.peek()[1] != "}":
                label = self.take()[1]
                self.take("=")
                kind, value = self.take()
                if kind != "str":
                    raise PromqlError("a label's value must be quoted")
                matchers.append((label, value[1:-1]))
                if self.peek()[1] == ",":
                    self.take(",")
            self.take("}")
        return Node("selector", name=name, matchers=tuple(matchers))

    def names(self) -> tuple:
        self.take("(")
        out = []
        while self.peek()[1] != ")":
            out.append(self.take()[1])
            if self.peek()[1] == ",":
                self.take(",")
        self.take(")")
        return tuple(out)
