"""/metrics after known traffic through a running app's desk: answers ok, stopped and failed, refusals, tokens,
the engine's and the browser's first text, ratings, a person request and a live split, each figure equal to
what the database holds, scraped and parsed as Prometheus does."""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

import httpx
import pytest
import sqlite_utils
from prometheus_client.parser import text_string_to_metric_families
from vllm.v1.metrics import loggers as vllm_loggers

from bench.promql import parse, selectors

from app.core.desk import DeskInputError, Finished, Progress
from app.db import templates as db_templates
from app.db.models import utcnow
from tests.helpers.metrics import METRICS_TOKEN, by, scrape
from tests.helpers.servers import ROOT, STEP_DELAY_MS, SecondServer, collect

KEY = "metrics-session-1"
CLIENT = "192.0.2.61"
SHOP, SUPPORT = "电商客服", "support-en"
NO_CHECK = lambda *_: None  # noqa: E731


@pytest.fixture(scope="module")
def traffic(services, engine_loop, tmp_path_factory, aio):
    """A server with a metrics token, after the known traffic; yields (its URL, its database, the times around
    the person request)."""
    server = SecondServer(services, engine_loop, tmp_path_factory.mktemp("metrics"), metrics_token=METRICS_TOKEN,
                          max_tokens=600, step_delay_ms=STEP_DELAY_MS)
    with server as url:
        desk = server.services.desk
        db = server.services.db

        async def ask(template: str, text: str, **kwargs) -> Finished:
            events = await collect(desk.answer(session_key=KEY, client=CLIENT, template_name=template, message=text,
                                               max_tokens=4, **kwargs))
            return events[-1]

        ok1 = aio(ask(SHOP, "运费怎么算？"))
        ok2 = aio(ask(SHOP, "可以开发票吗？"))
        # A live split of support-en: new conversations are drawn to v1 or v2 half and half.
        db.run(db_templates.save_version, name=SUPPORT, text="You answer orders and returns, briefly.",
               base_version=1, user="ops", check_fits=NO_CHECK)
        db.run(db_templates.start_split, name=SUPPORT, version=2, share=0.5, user="ops", check_fits=NO_CHECK)
        aio(server.services.catalog.refresh())
        for question in ("Where is my parcel?", "Can I return shoes?", "How long is a refund?"):
            aio(ask(SUPPORT, question))
        aio(_stopped(desk))
        failed = aio(ask(SHOP, "退货" * 9_000))  # more tokens than the context holds: stored as failed
        assert (failed.message.status, failed.message.error_code) == ("error", "message_too_long")
        with pytest.raises(DeskInputError):  # refused by admit, on its way out through answer: counted once
            aio(collect(desk.answer(session_key=KEY, client=CLIENT, template_name=SHOP, message="x" * 20_001)))
        with pytest.raises(DeskInputError):
            aio(collect(desk.answer(session_key=KEY, client=CLIENT, template_name="<no such topic 7341>",
                                    message="hello")))
        with pytest.raises(DeskInputError):
            desk.admit(client=CLIENT, message=["not", "text"])
        assert aio(desk.rate(session_key=KEY, message_id=ok1.message.id, thumbs=1))
        assert aio(desk.rate(session_key=KEY, message_id=ok2.message.id, thumbs=-1))
        assert aio(desk.first_visible(session_key=KEY, conversation_id=ok1.message.conversation_id, ms=321.5))
        before = utcnow()
        assert aio(desk.request_person(session_key=KEY, conversation_id=ok2.message.conversation_id))
        yield url, sqlite_utils.Database(server.settings.database_url.removeprefix("sqlite:///")), before


async def _stopped(desk) -> None:
    """An answer the customer stops at its first text (each engine step pauses, so it is still streaming)."""
    stream = desk.answer(session_key=KEY, client=CLIENT, template_name=SHOP, message="请详细介绍退货流程。",
                         max_tokens=500, ignore_eos=True)
    async for event in stream:
        if isinstance(event, Progress):
            break
    await stream.aclose()


ANSWERS_BY_LABELS = """
    SELECT t.name, CAST(v.number AS TEXT), CASE m.status WHEN 'error' THEN 'failed' ELSE m.status END,
           m.error_code, COALESCE(m.replica, ''), COUNT(*)
    FROM messages m JOIN template_versions v ON m.template_version_id = v.id JOIN templates t ON v.template_id = t.id
    WHERE m.role = 'assistant' AND m.author = '' GROUP BY 1, 2, 3, 4, 5"""
PER_TEMPLATE = """
    SELECT t.name, SUM(m.prompt_tokens), SUM(m.num_cached_tokens), SUM(m.output_tokens), COUNT(m.ttft_ms),
           SUM(m.ttft_ms), COUNT(m.first_visible_ms), SUM(m.first_visible_ms)
    FROM messages m JOIN template_versions v ON m.template_version_id = v.id JOIN templates t ON v.template_id = t.id
    WHERE m.role = 'assistant' AND m.author = '' GROUP BY 1"""


def test_answers_by_template_version_and_outcome_are_the_stored_answers(traffic):
    url, db, _ = traffic
    samples = scrape(url)
    counted = by(samples["prefixdesk:answers_total"], "template", "version", "outcome", "code", "replica")
    stored = {tuple(row[:5]): row[5] for row in db.execute(ANSWERS_BY_LABELS).fetchall()}
    assert counted == stored
    by_outcome = {}
    for (template, _, outcome, code, _), n in counted.items():
        by_outcome[(template, outcome, code)] = by_outcome.get((template, outcome, code), 0) + n
    assert by_outcome == {(SHOP, "ok", ""): 2, (SHOP, "stopped", ""): 1, (SHOP, "failed", "message_too_long"): 1,
                          (SUPPORT, "ok", ""): 3}
    assert {v for (t, v, *_) in counted if t == SHOP} == {"1"}
    assert by(samples["prefixdesk:refused_total"], "reason") == {
        ("message_chars",): 1, ("no_template",): 1, ("not_text",): 1}
    assert samples["prefixdesk:answers_in_flight"] == {(): 0}


def test_tokens_and_first_text_by_template_are_the_stored_sums(traffic):
    url, db, _ = traffic
    samples = scrape(url)
    stored = {row[0]: row[1:] for row in db.execute(PER_TEMPLATE).fetchall()}
    assert set(stored) == {SHOP, SUPPORT}
    for template, (prompt, cached, output, n_ttft, ttft_ms, n_shown, shown_ms) in stored.items():
        one = {"template": template}
        assert by(samples["prefixdesk:prompt_tokens_total"], where=one) == {(): prompt}
        assert by(samples["prefixdesk:prompt_tokens_cached_total"], where=one) == {(): cached}
        assert by(samples["prefixdesk:generation_tokens_total"], where=one) == {(): output}
        assert by(samples["prefixdesk:time_to_first_token_seconds_count"], where=one) == {(): n_ttft}
        assert by(samples["prefixdesk:time_to_first_token_seconds_sum"], where=one) == {
            (): pytest.approx(ttft_ms / 1000, rel=1e-9)}
        infinite = by(samples["prefixdesk:time_to_first_token_seconds_bucket"], where={**one, "le": "+Inf"})
        assert infinite == {(): n_ttft}
        if n_shown:
            assert by(samples["prefixdesk:first_visible_seconds_count"], where=one) == {(): n_shown}
            assert by(samples["prefixdesk:first_visible_seconds_sum"], where=one) == {(): shown_ms / 1000}
    # The stopped answer has no stats; the failed one never reached the engine; every other answer has both.
    assert (stored[SHOP][3], stored[SUPPORT][3]) == (2, 3)
    assert (stored[SHOP][5], stored[SHOP][6]) == (1, 321.5)
    assert by(samples["prefixdesk:first_visible_seconds_count"], "template") == {(SHOP,): 1}
    assert by(samples["prefixdesk:first_visible_seconds_bucket"], "le", where={"template": SHOP})[("0.4",)] == 1
    assert by(samples["prefixdesk:first_visible_seconds_bucket"], "le", where={"template": SHOP})[("0.3",)] == 0


def test_ratings_the_person_queue_and_the_split_are_read_from_the_database(traffic):
    url, db, requested_before = traffic
    before = utcnow()
    samples = scrape(url)
    after = utcnow()
    assert by(samples["prefixdesk:ratings"], "template", "version", "thumbs") == {
        (SHOP, "1", "up"): 1, (SHOP, "1", "down"): 1}
    assert samples["prefixdesk:person_queue_waiting"] == {(): 1}
    assert samples["prefixdesk:person_answering"] == {(): 0}
    [requested] = [datetime.fromisoformat(r["handoff_requested_at"])
                   for r in db["conversations"].rows_where("handoff = 'waiting'")]
    assert requested_before <= requested
    wait_s = samples["prefixdesk:person_queue_oldest_wait_seconds"][()]
    assert (before - requested).total_seconds() <= wait_s <= (after - requested).total_seconds()

    [support] = db["templates"].rows_where("name = ?", [SUPPORT])
    started = {row[0]: row[1] for row in db.execute(
        "SELECT v.number, COUNT(*) FROM conversations c JOIN template_versions v ON c.template_version_id = v.id "
        "WHERE c.template_id = ? AND c.created_at >= ? GROUP BY 1", [support["id"], support["candidate_since"]])}
    assert sum(started.values()) == 3
    assert by(samples["prefixdesk:split_conversations"], "template", "version", "arm") == {
        (SUPPORT, "1", "published"): started.get(1, 0), (SUPPORT, "2", "candidate"): started.get(2, 0)}
    assert by(samples["prefixdesk:split_share"], "template", "version", "arm") == {
        (SUPPORT, "1", "published"): 0.5, (SUPPORT, "2", "candidate"): 0.5}
    support_versions = {v for (t, v, *_) in by(samples["prefixdesk:answers_total"], "template", "version")
                        if t == SUPPORT}
    assert support_versions == {str(n) for n in started}


def test_with_the_local_engine_vllms_own_figures_come_along_under_vllms_names(traffic):
    url, _, _ = traffic
    samples = scrape(url)
    assert {"vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting",
            "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"} <= set(samples)
    assert {name.split(":")[0] for name in samples} == {"prefixdesk", "vllm"}


DASHBOARD = ROOT / "docs" / "grafana" / "prefixdesk.json"
METRICS_DOC = ROOT / "docs" / "metrics.md"
OURS_ON_THE_DASHBOARD = {
    "prefixdesk:answers_total", "prefixdesk:refused_total", "prefixdesk:prompt_tokens_total",
    "prefixdesk:prompt_tokens_cached_total", "prefixdesk:time_to_first_token_seconds_bucket",
    "prefixdesk:first_visible_seconds_bucket", "prefixdesk:answers_in_flight", "prefixdesk:person_queue_waiting",
    "prefixdesk:person_answering", "prefixdesk:person_queue_oldest_wait_seconds", "prefixdesk:ratings",
    "prefixdesk:split_conversations"}
VLLMS_ON_THE_DASHBOARD = {"vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total", "vllm:kv_cache_usage_perc",
                          "vllm:num_requests_running", "vllm:num_requests_waiting",
                          "vllm:time_to_first_token_seconds_bucket"}


def _dashboard_names() -> set[str]:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return set().union(*(selectors(parse(t["expr"])) for p in dashboard["panels"] for t in p.get("targets", [])))


def test_the_dashboard_reads_what_metrics_serves_and_what_vllm_defines(traffic):
    url, _, _ = traffic
    served = set(scrape(url))
    names = _dashboard_names()
    ours = {n for n in names if n.startswith("prefixdesk:")}
    assert ours == OURS_ON_THE_DASHBOARD
    assert ours & served == ours
    theirs = names - ours
    assert theirs == VLLMS_ON_THE_DASHBOARD
    assert theirs & served == theirs  # the local engine's, passed on
    defined = set(re.findall(r'name="(vllm:[a-z_]+)"', Path(vllm_loggers.__file__).read_text(encoding="utf-8")))
    assert {n.removesuffix("_total").removesuffix("_bucket") for n in theirs} - defined == set()


def test_the_dashboard_imports_as_is_on_any_prometheus_data_source():
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    [variable] = dashboard["templating"]["list"]
    assert (variable["type"], variable["name"], variable["query"]) == ("datasource", "datasource", "prometheus")
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for p in panels:
        if p["type"] != "row":
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert {t["datasource"]["uid"] for t in p["targets"]} == {"${datasource}"}


def test_docs_list_every_metric_served_with_its_type(traffic):
    url, _, _ = traffic
    r = httpx.get(url + "metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}, timeout=60)
    served = {(f.name + "_total" if f.type == "counter" else f.name, f.type)
              for f in text_string_to_metric_families(r.text)
              if f.name.startswith("prefixdesk:") and not f.name.endswith("_created")}  # (prometheus_client's own)
    documented = set(re.findall(r"^\| `(prefixdesk:[a-z_]+)` \| (\w+) \|", METRICS_DOC.read_text(encoding="utf-8"),
                                flags=re.M))
    assert documented == served
