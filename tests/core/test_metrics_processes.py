"""Several web processes (PREFIXDESK_WEB_PROCESSES > 1) keep their /metrics counts in one folder through
prometheus_client's multiprocess mode; a scrape of any one of them adds up all of them, and passes on none of
vLLM's families written there."""

from __future__ import annotations

import subprocess
import sys

from prometheus_client.parser import text_string_to_metric_families

from app.core.metrics import DeskMetrics
from app.db.rows import StoredFigures
from app.cluster.tier import plan_tier, share_metrics
from tests.helpers.servers import ROOT, settings_for

WORKER = """
from datetime import datetime
from prometheus_client import Counter
from app.core.metrics import DeskMetrics
from app.db.rows import MessageRow

metrics = DeskMetrics()
row = MessageRow(id=1, conversation_id=1, role="assistant", text="hi", status="ok", error=None, template_version_id=1,
                 prompt_tokens={prompt}, num_cached_tokens={cached}, ttft_ms=50.0, output_tokens=3,
                 decode_tokens_per_s=None, replica="http://10.0.0.{n}:8000", created_at=datetime(2026, 12, 2))
metrics.answered(row, template="support-en", version=2)
metrics.refused("rate")
with metrics.answering():
    pass
Counter("vllm:prompt_tokens", "vLLM's own, in the same folder").inc(7)
"""


def test_a_scrape_adds_up_every_web_process(tmp_path):
    for n, (prompt, cached) in enumerate([(600, 576), (610, 0)], start=1):
        env = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
        subprocess.run([sys.executable, "-c", WORKER.format(prompt=prompt, cached=cached, n=n)], cwd=ROOT,
                       env=env, check=True, timeout=120)
    assert len(list(tmp_path.glob("*.db"))) >= 2  # each process wrote files of its own

    text = DeskMetrics(multiproc_dir=tmp_path).exposition(StoredFigures(0, 0, 0.0, (), ())).decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    answers = {labels: v for (name, labels), v in samples.items() if name == "prefixdesk:answers_total"}
    assert answers == {
        (("code", ""), ("outcome", "ok"), ("replica", f"http://10.0.0.{n}:8000"), ("template", "support-en"),
         ("version", "2")): 1.0 for n in (1, 2)}
    prompt = {dict(labels)["replica"]: v for (name, labels), v in samples.items()
              if name == "prefixdesk:prompt_tokens_total"}
    cached = {dict(labels)["replica"]: v for (name, labels), v in samples.items()
              if name == "prefixdesk:prompt_tokens_cached_total"}
    assert (prompt, cached) == ({"http://10.0.0.1:8000": 600, "http://10.0.0.2:8000": 610},
                                {"http://10.0.0.1:8000": 576, "http://10.0.0.2:8000": 0})
    assert samples[("prefixdesk:refused_total", (("reason", "rate"),))] == 2
    assert samples[("prefixdesk:answers_in_flight", ())] == 0
    assert sum(v for (name, _), v in samples.items() if name == "prefixdesk:time_to_first_token_seconds_count") == 2
    assert not [name for name, _ in samples if not name.startswith("prefixdesk:")]


def test_the_supervisor_hands_its_workers_an_empty_metrics_folder(tmp_path):
    settings = settings_for(tmp_path, web_processes=2, engine="remote", engine_url="http://127.0.0.1:9")
    assert settings_for(tmp_path).metrics_dir is None  # one process counts in memory
    stale = tmp_path / "metrics" / "counter_4242.db"
    stale.parent.mkdir()
    stale.write_bytes(b"an earlier run's counts")
    share_metrics(settings.metrics_dir)
    assert list((tmp_path / "metrics").iterdir()) == []
    plan = plan_tier(settings, "model", processes=2, gpu_count=0, cpus=(0, 1))
    assert [dict(w.env)["PROMETHEUS_MULTIPROC_DIR"] for w in plan.workers] == [str((tmp_path / "metrics").resolve())] * 2
    assert [dict(w.env)["PREFIXDESK_WEB_PROCESSES"] for w in plan.workers] == ["2", "2"]  # metrics_dir in each
