"""Baichuan2 (7B: RoPE, 13B: ALiBi) as a vLLM model of our own, for vLLM 0.26 (GPU) and 0.32 (CPU).

vLLM served ``BaichuanForCausalLM`` / ``BaiChuanForCausalLM`` until 0.23.0 and then removed them
(the "previously supported" table in ``vllm/model_executor/models/registry.py``). This is a port of
that implementation to the model API both releases share — the ``(*, vllm_config, prefix)``
constructor, ``Attention(..., alibi_slopes=...)``, ``AutoWeightsLoader`` — registered by
``app.engine.models.register`` (see that package for how a process finds the plugin).

A decoder layer is the LLaMA one with three differences, all in the published weights' layout:
- q, k and v are one fused matrix ``self_attn.W_pack`` ([q; k; v] along the output dim), loaded into
  a ``QKVParallelLinear``, whose loader splits it into q/k/v and each into its tensor-parallel shard;
- 13B has no position embedding but an ALiBi bias per head, with the standard slopes (also for a
  head count that is not a power of two: 13B has 40 heads); each tensor-parallel rank keeps its heads';
- Baichuan2's LM head (``NormHead``) L2-normalizes each row of its weight before the matmul; the
  rows are normalized once, while loading, which gives the same logits (Baichuan 1 does not).
"""

# No `from __future__ import annotations`: vLLM's @support_torch_compile reads forward()'s annotations
# as types to find the dynamic (token) dimensions.
import math
from collections.abc import Iterable
from itertools import islice

import torch
from torch import nn
from vllm.compilation.decorators import support_torch_compile
from vllm.config import CacheConfig, VllmConfig
from vllm.distributed import get_pp_group, get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size
from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.quantization import QuantizationConfig
from vllm.model_executor.layers.rotary_embedding import get_rope
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.model_executor.models.interfaces import SupportsPP, SupportsQuant
from vllm.model_executor.models.utils import (AutoWeightsLoader, PPMissingLayer, is_pp_missing_parameter,
                                              make_empty_intermediate_tensors_factory, make_layers, maybe_prefix)
from vllm.sequence import IntermediateTensors

from app.engine.models.baichuan_config import ALIBI, BAICHUAN1_VOCAB_SIZE, ROPE, position_embedding_of


def alibi_slopes(num_heads: int) -> list[float]:
    """The ALiBi slope of each head (Press et al.): a geometric series from 2^(-8/n) for the
    largest power of two n <= num_heads, the remaining heads taking every other slope of 2n's series."""
    closest = 2 ** math.floor(math.log2(num_heads))
    base = 2.0 ** (-8.0 / closest)
    slopes = [base ** (i + 1) for i in range(closest)]
    if closest != num_heads:
        extra_base = 2.0 ** (-8.0 / (2 * closest))
        slopes += [extra_base ** (2 * i + 1) for i in range(num_heads - closest)]
    return slopes


def alibi_slopes_for_rank(num_heads: int, tp_rank: int, tp_size: int) -> list[float]:
    """The slopes of the heads that tensor-parallel rank ``tp_rank`` of ``tp_size`` holds."""
    per_rank = num_heads // tp_size
    return alibi_slopes(num_heads)[tp_rank * per_rank:(tp_rank + 1) * per_rank]


class BaichuanMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), gate and up as one column-parallel matmul."""

    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str,
                 quant_config: QuantizationConfig | None = None, prefix: str = ""):
        super().__init__()
        if hidden_act != "silu":
            raise ValueError(f"Baichuan's MLP is SwiGLU; hidden_act {hidden_act!r} is not supported")
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2, bias=False,
                                                       quant_config=quant_config, prefix=f"{prefix}.gate_up_proj")
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=False, quant_config=quant_config,
                                           prefix=f"{prefix}.down_proj")
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up, _ = self.gate_up_proj(x)
        x, _ = self.down_proj(self.act_fn(gate_up))
        return x


class BaichuanAttention(nn.Module):
    def __init__(self, config, position_embedding: str, cache_config: CacheConfig | None = None,
                 quant_config: QuantizationConfig | None = None, prefix: str = ""):
        super().__init__()
        tp_size = get_tensor_model_parallel_world_size()
        self.total_num_heads = config.num_attention_heads
        if self.total_num_heads % tp_size:
            raise ValueError(f"{self.total_num_heads} attention heads do not split over tensor_parallel_size={tp_size}")
        self.num_heads = self.total_num_heads // tp_size
        self.head_dim = config.hidden_size // self.total_num_heads
        self.q_size = self.num_heads * self.head_dim
        self.position_embedding = position_embedding
        # pylint: disable=invalid-name  (the published name, so the checkpoint loads as is)
        self.W_pack = QKVParallelLinear(config.hidden_size, self.head_dim, self.total_num_heads, self.total_num_heads,
                                        bias=False, quant_config=quant_config, prefix=f"{prefix}.W_pack")
        self.o_proj = RowParallelLinear(self.total_num_heads * self.head_dim, config.hidden_size, bias=False,
                                        quant_config=quant_config, prefix=f"{prefix}.o_proj")
        slopes = None
        if position_embedding == ALIBI:
            slopes = alibi_slopes_for_rank(self.total_num_heads, get_tensor_model_parallel_rank(), tp_size)
        else:
            self.rotary_emb = get_rope(self.head_dim, max_position=config.max_position_embeddings,
                                       rope_parameters=getattr(config, "rope_parameters", None)
                                       or {"rope_type": "default", "rope_theta": 10000.0})
        self.attn = Attention(self.num_heads, self.head_dim, self.head_dim**-0.5, alibi_slopes=slopes,
                              cache_config=cache_config, quant_config=quant_config, prefix=f"{prefix}.attn")

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv, _ = self.W_pack(hidden_states)
        q, k, v = qkv.split([self.q_size, self.q_size, self.q_size], dim=-1)
        if self.position_embedding == ROPE:
            q, k = self.rotary_emb(positions, q, k)
        output, _ = self.o_proj(self.attn(q, k, v))
        return output


class BaichuanDecoderLayer(nn.Module):
    def __init__(self, config, position_embedding: str, cache_config: CacheConfig | None = None,
                 quant_config: QuantizationConfig | None = None, prefix: str = ""):
        super().__init__()
        self.self_attn = BaichuanAttention(config, position_embedding, cache_config, quant_config,
                                           prefix=f"{prefix}.self_attn")
        self.mlp = BaichuanMLP(config.hidden_size, config.intermediate_size, config.hidden_act, quant_config,
                               prefix=f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor,
                residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        # vLLM's fused RMSNorm adds the residual and normalizes in one kernel.
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


@support_torch_compile
class BaichuanModel(nn.Module):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "", position_embedding: str = ROPE):
        super().__init__()
        config = vllm_config.model_config.hf_config
        cache_config, quant_config = vllm_config.cache_config, vllm_config.quant_config
        self.config = config
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.start_layer, self.end_layer, self.layers = make_layers(
            config.num_hidden_layers,
            lambda prefix: BaichuanDecoderLayer(config, position_embedding, cache_config, quant_config, prefix=prefix),
            prefix=f"{prefix}.layers",
        )
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.make_empty_intermediate_tensors = make_empty_intermediate_tensors_factory(
            ["hidden_states", "residual"], config.hidden_size)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor,
                intermediate_tensors: IntermediateTensors | None,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor | IntermediateTensors:
        if get_pp_group().is_first_rank:
            hidden_states = inputs_embeds if inputs_embeds is not None else self.embed_input_ids(input_ids)
            residual = None
        else:
            assert intermediate_tensors is not None
            hidden_states, residual = intermediate_tensors["hidden_states"], intermediate_tensors["residual"]
        for layer in islice(self.layers, self.start_layer, self.end_layer):
            hidden_states, residual = layer(positions, hidden_states, residual)
        if not get_pp_group().is_last_rank:
            return IntermediateTensors({"hidden_states": hidden_states, "residual": residual})
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load the published names; gate_proj and up_proj go into the merged gate_up_proj, W_pack
        (already fused on disk) into the QKVParallelLinear as one piece."""
        stacked = [("gate_up_proj", "gate_proj", 0), ("gate_up_proj", "up_proj", 1)]
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, weight in weights:
            if "rotary_emb.inv_freq" in name:  # Baichuan2-7B saves its RoPE frequencies; vLLM computes them
                continue
            for param_name, shard_name, shard_id in stacked:
                if shard_name not in name:
                    continue
                name = name.replace(shard_name, param_name)
                if is_pp_missing_parameter(name, self):
                    break
                param = params[name]
                param.weight_loader(param, weight, shard_id)
                loaded.add(name)
                break
            else:
                if name.endswith(".bias") and name not in params:  # GPTQ checkpoints carry unused biases
                    continue
                if is_pp_missing_parameter(name, self):
                    continue
                param = params[name]
                getattr(param, "weight_loader", default_weight_loader)(param, weight)
                loaded.add(name)
        return loaded


class BaichuanBaseForCausalLM(nn.Module, SupportsPP, SupportsQuant):
    packed_modules_mapping = {"W_pack": ["W_pack"], "gate_up_proj": ["gate_proj", "up_proj"]}

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "", position_embedding: str = ROPE):
        super().__init__()
        config = vllm_config.model_config.hf_config
        quant_config = vllm_config.quant_config
        self.config = config
        self.quant_config = quant_config
        self.model = BaichuanModel(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"),
                                   position_embedding=position_embedding)
        if get_pp_group().is_last_rank:
            self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, quant_config=quant_config,
                                          prefix=maybe_prefix(prefix, "lm_head"))
            if config.vocab_size != BAICHUAN1_VOCAB_SIZE and hasattr(self.lm_head, "weight"):
                self.lm_head.weight.weight_loader = _normalizing(self.lm_head.weight.weight_loader)
            self.logits_processor = LogitsProcessor(config.vocab_size)
        else:
            self.lm_head = PPMissingLayer()
        self.make_empty_intermediate_tensors = self.model.make_empty_intermediate_tensors

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_input_ids(input_ids)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor,
                intermediate_tensors: IntermediateTensors | None = None,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor | IntermediateTensors:
        return self.model(input_ids, positions, intermediate_tensors, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.logits_processor(self.lm_head, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return AutoWeightsLoader(self).load_weights(weights)


class BaichuanForCausalLM(BaichuanBaseForCausalLM):
    """Baichuan2-7B (RoPE), Baichuan2-13B and Baichuan-13B (ALiBi): the config tells which."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        config = vllm_config.model_config.hf_config
        position_embedding = getattr(config, "position_embedding", None) or position_embedding_of(config.to_dict())
        super().__init__(vllm_config=vllm_config, prefix=prefix, position_embedding=position_embedding)


class BaiChuanForCausalLM(BaichuanBaseForCausalLM):
    """Baichuan-7B (v1; the upper-case C is its published name): RoPE."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix, position_embedding=ROPE)


def _normalizing(weight_loader):
    """``weight_loader`` with each row of the loaded LM head L2-normalized first (Baichuan2's NormHead)."""

    def load(param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        normalized = nn.functional.normalize(loaded_weight.to(torch.float32), dim=-1)
        weight_loader(param, normalized.to(loaded_weight.dtype))

    return load
