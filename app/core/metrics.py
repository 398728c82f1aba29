"""The app's own figures for Prometheus, served at /metrics: what vLLM cannot know (which template and version
answered, what the customer saw first, who rated it, who waits for a person). Every name and label is listed
in docs/metrics.md; vLLM's own figures keep vLLM's names and come from vLLM.

Two kinds, chosen per figure:
- counted at the event, in memory, by the desk's answer path (``DeskMetrics``' methods: no I/O, a few
  dictionary updates): answers by outcome, tokens, the engine's first token, the browser's first text,
  answers in flight, refusals;
- read from the database when /metrics is scraped (``StoredFigures``, off the event loop): the person queue,
  the stored ratings and the live splits, which are states, not events, and which every web process shares.

With several web processes each keeps its counts in files under ``settings.metrics_dir`` (prometheus_client's
multiprocess mode, which the supervisor turns on for its workers), and whichever process is scraped adds
them all up. Label values are bounded: template names and versions are the operators', codes and reasons
the desk's own (app/core/refusals.py), replicas the configured engine URLs; never a customer's text.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector

from app.db.rows import MessageRow, StoredFigures
from app.db.states import AnswerStatus

PREFIX = "prefixdesk:"
# The engine's first token: vLLM's own buckets up to a minute (vllm:time_to_first_token_seconds).
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                  20.0, 40.0, 80.0)
# The customer's first text: a browser adds tens of milliseconds to the engine's first token, often more.
FIRST_VISIBLE_BUCKETS_S = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 60.0)
# An answer row's status → its outcome label.
OUTCOMES = {AnswerStatus.OK: "ok", AnswerStatus.STOPPED: "stopped", AnswerStatus.ERROR: "failed"}


class DeskMetrics:
    """The figures the desk counts as answers happen, and the exposition of a scrape.

    ``multiproc_dir``: the folder the web processes share (prometheus_client's PROMETHEUS_MULTIPROC_DIR, set
    for this process before prometheus_client was imported); a scrape then adds up every process's files.
    None: this process's counts, in memory. Each instance has a registry of its own, so two desks in one
    process (tests) never share counts.
    """

    def __init__(self, *, multiproc_dir: Path | None = None):
        self.multiproc_dir = multiproc_dir
        self.registry = r = CollectorRegistry()
        by_answer = ["template", "replica"]
        self.answers = Counter("prefixdesk:answers", "Answers the model finished, by template, version and "
                               "outcome (ok, stopped, failed); code: why it failed.",
                               ["template", "version", "outcome", "code", "replica"], registry=r)
        self.refusals = Counter("prefixdesk:refused", "Messages refused before anything was stored, by reason.",
                                ["reason"], registry=r)
        self.prompt_tokens = Counter("prefixdesk:prompt_tokens", "Prompt tokens of answers, by template.",
                                     by_answer, registry=r)
        self.cached_tokens = Counter("prefixdesk:prompt_tokens_cached", "Prompt tokens of answers that the "
                                     "engine's prefix cache held (reused, not computed), by template.",
                                     by_answer, registry=r)
        self.generation_tokens = Counter("prefixdesk:generation_tokens", "Tokens the model wrote in answers, by "
                                         "template.", by_answer, registry=r)
        self.ttft = Histogram("prefixdesk:time_to_first_token_seconds", "The engine's first token of an answer, "
                              "from the request, by template.", by_answer, buckets=TTFT_BUCKETS_S, registry=r)
        self.first_visible = Histogram("prefixdesk:first_visible_seconds", "Send to the answer's first text on "
                                       "the customer's screen, as the browser measured and reported it, by "
                                       "template.", ["template"], buckets=FIRST_VISIBLE_BUCKETS_S, registry=r)
        self.in_flight = Gauge("prefixdesk:answers_in_flight", "Answers being generated now.", registry=r,
                               multiprocess_mode="livesum")

    def answered(self, row: MessageRow, *, template: str, version: int | None) -> None:
        """Count a stored answer (ok, stopped or failed) of ``template`` at ``version``."""
        outcome = OUTCOMES.get(row.status)
        if outcome is None:
            return
        replica = row.replica or ""
        self.answers.labels(template, "" if version is None else str(version), outcome,
                            row.error_code if outcome == "failed" else "", replica).inc()
        if row.prompt_tokens is not None:
            self.prompt_tokens.labels(template, replica).inc(row.prompt_tokens)
            self.cached_tokens.labels(template, replica).inc(row.num_cached_tokens or 0)
        if row.output_tokens is not None:
            self.generation_tokens.labels(template, replica).inc(row.output_tokens)
        if row.ttft_ms is not None:
            self.ttft.labels(template, replica).observe(row.ttft_ms / 1000)

    def refused(self, code: str) -> None:
        """Count a message refused with ``code`` (a key of app/core/refusals.py's ENGLISH)."""
        self.refusals.labels(code).inc()

    def shown(self, *, template: str, ms: float) -> None:
        """Count a browser's report of an answer's first visible text, ``ms`` after Send."""
        self.first_visible.labels(template).observe(ms / 1000)

    @contextlib.contextmanager
    def answering(self) -> Iterator[None]:
        """An answer in flight for the block's duration."""
        self.in_flight.inc()
        try:
            yield
        finally:
            self.in_flight.dec()

    def exposition(self, stored: StoredFigures) -> bytes:
        """Prometheus' text format of the counted figures (every web process's, in multiprocess mode) and
        ``stored``. Reads files in multiprocess mode: call it off the event loop."""
        registry = CollectorRegistry(auto_describe=False)
        if self.multiproc_dir is not None:
            registry.register(_Ours(MultiProcessCollector(None, path=str(self.multiproc_dir))))
        else:
            registry.register(_Ours(self.registry))
        registry.register(_Stored(stored))
        return generate_latest(registry)


class _Ours:
    """Only ``prefixdesk:`` families of a collector (a multiprocess folder may also hold vLLM's)."""

    def __init__(self, source):
        self._source = source

    def collect(self) -> Iterator[Metric]:
        return (m for m in self._source.collect() if m.name.startswith(PREFIX))


class _Stored:
    """The figures read from the database at this scrape, as gauges."""

    def __init__(self, stored: StoredFigures):
        self._stored = stored

    def collect(self) -> Iterator[Metric]:
        s = self._stored
        yield GaugeMetricFamily("prefixdesk:person_queue_waiting", "Conversations waiting for a person.",
                                value=s.person_waiting)
        yield GaugeMetricFamily("prefixdesk:person_queue_oldest_wait_seconds", "How long the longest-waiting "
                                "conversation has waited for a person; 0 when none waits.", value=s.oldest_wait_s)
        yield GaugeMetricFamily("prefixdesk:person_answering", "Conversations a person is answering.",
                                value=s.person_answering)
        ratings = GaugeMetricFamily("prefixdesk:ratings", "Answers the customers rated, by template version and "
                                    "thumbs (up, down); rating again replaces a rating.",
                                    labels=["template", "version", "thumbs"])
        for r in s.ratings:
            ratings.add_metric([r.template, str(r.version), "up" if r.thumbs > 0 else "down"], r.count)
        yield ratings
        share = GaugeMetricFamily("prefixdesk:split_share", "Share of new conversations each arm of a live A/B "
                                  "split gets (0-1).", labels=["template", "version", "arm"])
        started = GaugeMetricFamily("prefixdesk:split_conversations", "Conversations started on each arm of a "
                                    "live A/B split since it began.", labels=["template", "version", "arm"])
        for a in s.splits:
            labels = [a.template, str(a.version), a.arm]
            share.add_metric(labels, a.share)
            started.add_metric(labels, a.num_conversations)
        yield share
        yield started
