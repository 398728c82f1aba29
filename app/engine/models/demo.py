"""The demo model: a tiny Qwen2 with random weights, built offline and deterministically.

It lets the whole product run (and be tested) on a machine with no model weights: the tokenizer
is a byte-level BPE trained on the 3,755 common Chinese characters of GB2312 level 1 plus the
seed templates' text, and the weights come from a fixed seed. Its replies are placeholder text;
token counts, caching and streaming are real.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from app import template_files

BUILD_VERSION = 4  # bump when the recipe below changes, so cached builds are rebuilt
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB_SIZE = 12000
_CJK = re.compile(r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]")

# ChatML; a system message is rendered exactly as given and nothing is injected when it is
# absent (no default system prompt, no date), so a template's prefix is byte-identical.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_ENGLISH = (
    "Hello, how can I help you today? Thank you for contacting customer service. "
    "order refund return shipping invoice warranty membership price protection delivery "
    "account password payment discount coupon exchange repair please sorry wait minute"
)


def common_chinese_characters() -> list[str]:
    """The 3,755 level-1 characters of GB2312, in code order."""
    chars = []
    for high in range(0xB0, 0xD8):
        for low in range(0xA1, 0xFF):
            try:
                chars.append(bytes([high, low]).decode("gb2312"))
            except UnicodeDecodeError:
                continue
    return chars


def ensure_demo_model(data_dir: Path, templates_dir: Path) -> Path:
    """Return the folder of the demo model, building it first if it is missing or stale."""
    corpus = _corpus(templates_dir)
    digest = hashlib.sha256(f"{BUILD_VERSION}\n{corpus}".encode()).hexdigest()[:12]
    folder = Path(data_dir) / "demo-model" / digest
    if (folder / "model.safetensors").exists():
        return folder
    tmp = folder.with_name(folder.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    _build(tmp, corpus)
    tmp.rename(folder)
    return folder


def _corpus(templates_dir: Path) -> str:
    texts = ["\n".join(common_chinese_characters()), _ENGLISH]
    for template in template_files.read_folder(templates_dir):
        # Spaces between CJK characters keep merges inside one character, so Chinese text
        # tokenizes about one token per character, as a general-purpose tokenizer would.
        # Only the prompts' text: the files' headers are no text a customer or model sees.
        texts.append(_CJK.sub(r"\g<0> ", template.text))
    return "\n".join(texts)


def _build(folder: Path, corpus: str) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus.splitlines(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        model_max_length=8192,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(fast),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=fast.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=fast.convert_tokens_to_ids("<|endoftext|>"),
        torch_dtype="float32",
    )
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(folder, safe_serialization=True)
    (folder / "generation_config.json").write_text(
        json.dumps({"eos_token_id": config.eos_token_id, "pad_token_id": config.pad_token_id})
    )
