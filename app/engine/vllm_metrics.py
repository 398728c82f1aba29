"""vLLM's own Prometheus figures of the engine in this process (the local engine), unchanged.

``vllm serve`` serves these at its own /metrics; an engine inside the app has no server of its own, and
vLLM's stat logger keeps them in prometheus_client's default registry. /metrics passes them on as vLLM names
them, so that vLLM's dashboards and ours read the same series with either engine.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import Metric

PREFIX = "vllm:"


def vllm_exposition() -> bytes:
    """Prometheus' text format of the ``vllm:`` families in this process (empty before the engine starts)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_VllmOnly())
    return generate_latest(registry)


class _VllmOnly:
    def collect(self) -> Iterator[Metric]:
        return (m for m in REGISTRY.collect() if m.name.startswith(PREFIX))
