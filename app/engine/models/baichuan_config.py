"""Baichuan's ``config.json`` as a transformers config class that needs no remote code.

The published checkpoints name ``model_type: "baichuan"`` and ship a configuration file written for
transformers 4; transformers 5 knows no such type, so without this class neither vLLM nor
``AutoConfig`` can read the folder unless they run that code. ``app.engine.models.register`` hands
the class to ``AutoConfig`` (vLLM reads every config through it), in every process that loads the
plugin.

The two Baichuan2 sizes differ in their position encoding, and their configs say so only
indirectly: Baichuan2-7B (RoPE) has ``max_position_embeddings``, Baichuan2-13B (ALiBi) has only
``model_max_length``. vLLM up to 0.23 keyed on ``hidden_size == 4096`` instead, which misreads any
other 7B-like shape (our tiny test models among them); the presence of ``max_position_embeddings``
is what each model's own code reads.
"""

from __future__ import annotations

from transformers import PretrainedConfig

ROPE = "ROPE"
ALIBI = "ALIBI"
BAICHUAN2_VOCAB_SIZE = 125696
BAICHUAN1_VOCAB_SIZE = 64000  # Baichuan-7B/13B (v1): a plain LM head; Baichuan2's rows are L2-normalized


def position_embedding_of(config: dict, architecture: str = "BaichuanForCausalLM") -> str:
    """ROPE or ALIBI for a Baichuan config (as a dict of its config.json)."""
    if config.get("position_embedding") in (ROPE, ALIBI):
        return config["position_embedding"]
    if architecture == "BaiChuanForCausalLM":  # Baichuan-7B (v1), the upper-case C: always RoPE
        return ROPE
    return ROPE if config.get("max_position_embeddings") else ALIBI


class BaichuanConfig(PretrainedConfig):
    """The fields of Baichuan/Baichuan2's config.json, plus what vLLM reads from them.

    ``position_embedding`` is derived (ROPE or ALIBI, see the module docstring). An ALiBi config
    also carries ``position_encoding_type = "alibi"``: that is what vLLM's ``ModelConfig.uses_alibi``
    reads, and it keeps vLLM from choosing cascade attention, which has no ALiBi path (0.26's
    FlashAttention backend asserts on it).
    """

    model_type = "baichuan"
    keys_to_ignore_at_inference = ["past_key_values"]

    def __init__(self, vocab_size: int = BAICHUAN2_VOCAB_SIZE, hidden_size: int = 4096,
                 intermediate_size: int = 11008, num_hidden_layers: int = 32, num_attention_heads: int = 32,
                 hidden_act: str = "silu", max_position_embeddings: int | None = None,
                 model_max_length: int = 4096, rms_norm_eps: float = 1e-6, rope_theta: float = 10000.0,
                 initializer_range: float = 0.02, use_cache: bool = True, pad_token_id: int | None = 0,
                 bos_token_id: int | None = 1, eos_token_id: int | None = 2, tie_word_embeddings: bool = False,
                 position_embedding: str | None = None, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.hidden_act = hidden_act
        self.model_max_length = model_max_length
        self.rms_norm_eps = rms_norm_eps
        self.initializer_range = initializer_range
        self.use_cache = use_cache
        architectures = kwargs.get("architectures") or ["BaichuanForCausalLM"]
        self.position_embedding = position_embedding_of(
            {"position_embedding": position_embedding, "max_position_embeddings": max_position_embeddings},
            architectures[0])
        if self.position_embedding == ROPE:
            self.max_position_embeddings = max_position_embeddings or model_max_length
            self.rope_theta = rope_theta
            self.rope_parameters = {"rope_type": "default", "rope_theta": rope_theta}
        else:
            self.position_encoding_type = "alibi"
        kwargs.pop("rope_parameters", None)
        super().__init__(pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                         tie_word_embeddings=tie_word_embeddings, **kwargs)

    @property
    def normalized_head(self) -> bool:
        """Whether the LM head's rows are L2-normalized before the matmul (Baichuan2's NormHead)."""
        return self.vocab_size != BAICHUAN1_VOCAB_SIZE
