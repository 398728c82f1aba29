"""bench/promql.py, which draws docs/metrics.md's picture of the dashboard: Prometheus' answers on small series."""

import pytest

from bench.promql import PromqlError, evaluate, legend, parse, selectors

A = (("outcome", "ok"), ("template", "a"))
B = (("outcome", "failed"), ("template", "a"))
HISTORY = [
    (0.0, {"x_total": {A: 1.0, B: 0.0}, "q": {(): 4.0}}),
    (10.0, {"x_total": {A: 6.0, B: 2.0}, "q": {(): 8.0}}),
    (20.0, {"x_total": {A: 16.0, B: 2.0}, "q": {(): 0.0}}),
]


def test_rate_sum_by_and_division():
    assert evaluate(parse("rate(x_total[$__rate_interval])", rate_interval="15s"), HISTORY, 2) == {A: 1.0, B: 0.0}
    assert evaluate(parse("rate(x_total[30s])"), HISTORY, 2) == {A: 0.75, B: 0.1}
    assert evaluate(parse("sum by (template) (rate(x_total[30s]))"), HISTORY, 2) == {(("template", "a"),): 0.85}
    assert evaluate(parse('sum(rate(x_total{outcome="ok"}[30s])) / sum(rate(x_total[30s]))'), HISTORY, 2) == {
        (): pytest.approx(0.75 / 0.85)}
    assert evaluate(parse("max(q) / max(q)"), HISTORY, 2) == {}  # 0/0 draws nothing
    assert evaluate(parse("rate(x_total[30s])"), HISTORY, 0) == {}  # one sample is no rate


def test_histogram_quantile_interpolates_within_the_bucket():
    buckets = {"h_bucket": {(("le", "0.1"),): 2.0, (("le", "0.2"),): 6.0, (("le", "+Inf"),): 10.0}}
    assert evaluate(parse("histogram_quantile(0.5, h_bucket)"), [(0.0, buckets)], 0) == {(): pytest.approx(0.175)}
    assert evaluate(parse("histogram_quantile(0.9, h_bucket)"), [(0.0, buckets)], 0) == {(): 0.2}  # in +Inf


def test_names_legends_and_what_it_cannot_read():
    assert selectors(parse("sum(rate(a_total[1m])) / max(b)")) == {"a_total", "b"}
    assert legend("{{template}} v{{version}}", (("template", "shop"), ("version", "2"))) == "shop v2"
    for bad in ("rate(a_total)", "sum by (x) a", 'a{x=y}', "a + b"):
        with pytest.raises(PromqlError):
            parse(bad)
