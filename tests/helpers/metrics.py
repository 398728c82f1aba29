"""Scraping /metrics as Prometheus would, parsed by prometheus_client's own parser."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

METRICS_TOKEN = "scrape-token-7f3a9c2e5b1d"  # PREFIXDESK_METRICS_TOKEN of the tests' servers that serve /metrics


def scrape(base_url: str, token: str = METRICS_TOKEN) -> dict[str, dict[tuple, float]]:
    """Every sample of ``base_url``/metrics by sample name, then by its labels as sorted (name, value) pairs."""
    r = httpx.get(base_url + "metrics", headers={"Authorization": f"Bearer {token}"}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=")
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return samples


def by(samples: dict[tuple, float], *labels: str, where: dict | None = None) -> dict[tuple, float]:
    """``samples`` keyed by the values of ``labels`` alone, of the samples whose labels match ``where``."""
    out = {}
    for key, value in samples.items():
        d = dict(key)
        if all(d.get(k) == v for k, v in (where or {}).items()):
            out[tuple(d.get(name, "") for name in labels)] = value
    return out
