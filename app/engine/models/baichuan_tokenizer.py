"""Baichuan2's SentencePiece ``tokenizer.model`` as a fast tokenizer with the Baichuan2 chat template.

The published checkpoints tokenize with remote code (``BaichuanTokenizer``) written for transformers
4, which does not load on transformers 5. The SentencePiece model itself is a plain byte-fallback
BPE, so it converts exactly into a ``tokenizers`` BPE: the same pieces and ids, merges in the order
of the pieces' scores, spaces as "▁", and (as Baichuan2 trains it) no normalization and no dummy
prefix — the module reads those choices from the model rather than assuming them.

The chat template is what Baichuan2's ``build_chat_input`` assembles: the system text first as plain
text, then each user turn as the user token (``<reserved_106>``, id 195) + its text, each assistant
turn as the assistant token (``<reserved_107>``, id 196) + its text, and the assistant token again
to ask for an answer; ``</s>`` ends it. The token ids come from the folder's generation_config.json
(``user_token_id``, ``assistant_token_id``), as Baichuan2's own code reads them.

The converted folder lives under the data dir, keyed by a digest of what it is made from, and is
built beside its final place and renamed into it, so the user's model folder is never written and an
interrupted conversion never looks finished.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import string
import tempfile
from dataclasses import dataclass
from pathlib import Path

from app.engine.types import EngineStartError

CONVERSION_VERSION = 2  # bump when the conversion below changes, so converted folders are rebuilt
USER_TOKEN_ID = 195  # Baichuan2's generation_config.json defaults
ASSISTANT_TOKEN_ID = 196
EOS_TOKEN_ID = 2

# SentencePiece piece types (sentencepiece_model.proto)
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6


class TokenizerConversionError(EngineStartError):
    """A Baichuan folder's tokenizer cannot be converted; the message says what to do."""


@dataclass(frozen=True)
class ChatTokens:
    """The pieces Baichuan2's chat format is made of."""

    user: str
    assistant: str
    eos: str


def chat_template(tokens: ChatTokens) -> str:
    """Baichuan2's chat format as a Jinja chat template (see the module docstring).

    The chat tokens are the model file's piece texts, which anyone who hands over a model folder writes: each
    is set once as a Jinja string literal (``jinja_literal``), so a quote, a ``{% for %}`` or a brace in it is
    text the template prints, never template source."""
    return (
        f"{{%- set user_token = {jinja_literal(tokens.user)} -%}}"
        f"{{%- set assistant_token = {jinja_literal(tokens.assistant)} -%}}"
        "{%- for message in messages -%}"
        "{%- if message['role'] == 'system' -%}{{ message['content'] }}"
        "{%- elif message['role'] == 'user' -%}{{ user_token + message['content'] }}"
        "{%- elif message['role'] == 'assistant' -%}{{ assistant_token + message['content'] }}"
        "{%- else -%}{{ raise_exception('Baichuan2 has system, user and assistant turns, not ' + message['role']) }}"
        "{%- endif -%}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{ assistant_token }}{%- endif -%}"
    )


def jinja_literal(text: str) -> str:
    """``text`` as a single-quoted Jinja string literal that evaluates to exactly ``text``: every character but
    ASCII letters, digits and ``<>_/|.-=:[]()`` written as a \\u or \\U escape (Jinja reads a literal's
    escapes as Python's unicode-escape), so the literal holds no quote, backslash, brace, percent sign or line
    break of the text's own. Linear in ``len(text)``."""
    return "'" + "".join(ch if ch in _LITERAL_SAFE else f"\\u{ord(ch):04x}" if ord(ch) < 0x10000
                         else f"\\U{ord(ch):08x}" for ch in text) + "'"


_LITERAL_SAFE = frozenset(string.ascii_letters + string.digits + "<>_/|.-=:[]()")


def ensure_converted_tokenizer(model_dir: Path, data_dir: Path) -> Path:
    """The folder of ``model_dir``'s converted tokenizer under ``data_dir``, converting it first if needed.

    Raises TokenizerConversionError when ``model_dir`` has no tokenizer.model or it is no BPE model.
    """
    model_dir = Path(model_dir)
    spm_path = model_dir / "tokenizer.model"
    if not spm_path.is_file():
        raise TokenizerConversionError(
            f"{model_dir} is a Baichuan model without tokenizer.model; copy the checkpoint's tokenizer.model "
            "into it, or set PREFIXDESK_TOKENIZER to a folder with a fast tokenizer (tokenizer.json)")
    generation = _read_json(model_dir / "generation_config.json")
    config = _read_json(model_dir / "config.json")
    ids = (generation.get("user_token_id", USER_TOKEN_ID), generation.get("assistant_token_id", ASSISTANT_TOKEN_ID),
           _first(generation.get("eos_token_id", config.get("eos_token_id", EOS_TOKEN_ID))))
    max_length = config.get("model_max_length") or config.get("max_position_embeddings") or 4096
    # vLLM reads a config beside every tokenizer (and waits and retries when there is none); this one is
    # the model's own, less the remote code it names.
    beside = {k: v for k, v in config.items() if k not in ("auto_map", "tokenizer_class")}
    digest = hashlib.sha256(spm_path.read_bytes() + json.dumps([CONVERSION_VERSION, ids, beside]).encode())
    folder = Path(data_dir).resolve() / "tokenizers" / f"{model_dir.name}-{digest.hexdigest()[:12]}"
    if (folder / "tokenizer.json").is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{folder.name}.partial-", dir=folder.parent))
    try:
        convert_tokenizer(spm_path, work, user_token_id=ids[0], assistant_token_id=ids[1], eos_token_id=ids[2],
                          model_max_length=max_length)
        if beside:
            (work / "config.json").write_text(json.dumps(beside, indent=2) + "\n", encoding="utf-8")
        try:
            work.rename(folder)
        except OSError:  # another process finished the same conversion first
            if not (folder / "tokenizer.json").is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return folder


def convert_tokenizer(spm_path: Path, out: Path, *, user_token_id: int = USER_TOKEN_ID,
                      assistant_token_id: int = ASSISTANT_TOKEN_ID, eos_token_id: int = EOS_TOKEN_ID,
                      model_max_length: int = 4096) -> ChatTokens:
    """Write the fast tokenizer of ``spm_path`` into ``out``: tokenizer.json, tokenizer_config.json and
    the chat template. Returns the chat format's pieces."""
    from transformers import PreTrainedTokenizerFast

    proto = _load_proto(spm_path)
    pieces = [p.piece for p in proto.pieces]
    for what, token_id in (("user", user_token_id), ("assistant", assistant_token_id), ("eos", eos_token_id)):
        if not 0 <= token_id < len(pieces):
            raise TokenizerConversionError(f"{spm_path}: the {what} token id {token_id} is outside its "
                                           f"{len(pieces)} pieces; check generation_config.json")
    tokens = ChatTokens(user=pieces[user_token_id], assistant=pieces[assistant_token_id], eos=pieces[eos_token_id])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=_fast_tokenizer(proto, spm_path),
        bos_token=pieces[proto.trainer_spec.bos_id] if proto.trainer_spec.bos_id >= 0 else None,
        eos_token=tokens.eos,
        unk_token=pieces[proto.trainer_spec.unk_id],
        pad_token=pieces[proto.trainer_spec.unk_id],  # Baichuan2 pads with <unk> (pad_token_id 0)
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = chat_template(tokens)
    fast.save_pretrained(out)
    return tokens


def _fast_tokenizer(proto, spm_path: Path):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers

    spec = proto.trainer_spec
    if spec.model_type != 2:  # TrainerSpec.ModelType: 1 unigram, 2 bpe
        raise TokenizerConversionError(f"{spm_path} is no BPE SentencePiece model (type {spec.model_type}); "
                                       "set PREFIXDESK_TOKENIZER to a fast tokenizer for it")
    vocab = {p.piece: i for i, p in enumerate(proto.pieces)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=_merges(proto), unk_token=proto.pieces[spec.unk_id].piece,
                                     fuse_unk=True, byte_fallback=spec.byte_fallback))
    norm = proto.normalizer_spec
    steps = []
    if norm.precompiled_charsmap:
        steps.append(normalizers.Precompiled(norm.precompiled_charsmap))
    if norm.remove_extra_whitespaces:
        steps += [normalizers.Strip(), normalizers.Replace(Regex(" {2,}"), " ")]
    if norm.add_dummy_prefix:
        steps.append(normalizers.Prepend("▁"))
    if norm.escape_whitespaces:
        steps.append(normalizers.Replace(" ", "▁"))
    tokenizer.normalizer = normalizers.Sequence(steps)
    decode = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if norm.add_dummy_prefix:
        decode.append(decoders.Strip(content=" ", left=1))
    tokenizer.decoder = decoders.Sequence(decode)
    # Control pieces (<s>, </s>, the <reserved_N> chat tokens) are special: matched whole in a chat
    # template's text, skipped when decoding, and plain text when a customer types them.
    tokenizer.add_special_tokens([AddedToken(p.piece, special=True, normalized=False)
                                  for p in proto.pieces if p.type in (_UNKNOWN, _CONTROL)])
    tokenizer.add_tokens([AddedToken(p.piece, special=False, normalized=False)
                          for p in proto.pieces if p.type == _USER_DEFINED])
    return tokenizer


def _merges(proto) -> list[tuple[str, str]]:
    """BPE merges in SentencePiece's order: a piece made of two shorter pieces merges in the order of
    its score (higher first), as SentencePiece's BPE picks the highest-scoring adjacent pair.

    A piece's cuts are looked up by the hashes of their two halves, never by slicing the piece (a slice per
    cut made one 400,000-character piece take minutes): each piece is read once, so the work is linear in the
    model file. Two independent polynomial hashes (61 and 89 bits) with the length name a piece."""
    normal: dict[tuple[int, int, int], tuple[float, int]] = {}
    prefixes: list[tuple[list[int], list[int]]] = []
    lengths: set[int] = set()
    normal_ids = [i for i, p in enumerate(proto.pieces) if p.type == _NORMAL]
    for i in normal_ids:
        p = proto.pieces[i]
        h1, h2 = _prefix_hashes(p.piece)
        prefixes.append((h1, h2))
        normal[(len(h1) - 1, h1[-1], h2[-1])] = (p.score, i)
        lengths.add(len(h1) - 1)
    longest = max(lengths, default=0)
    pow1, pow2 = _powers(_B1, _M1, longest), _powers(_B2, _M2, longest)
    ranked = []
    for i, (h1, h2) in zip(normal_ids, prefixes):
        n = len(h1) - 1
        score = proto.pieces[i].score
        for cut in range(1, n):
            if cut not in lengths or n - cut not in lengths:
                continue
            left = normal.get((cut, h1[cut], h2[cut]))
            if left is None:
                continue
            right = normal.get((n - cut, (h1[n] - h1[cut] * pow1[n - cut]) % _M1,
                                (h2[n] - h2[cut] * pow2[n - cut]) % _M2))
            if right is not None:
                ranked.append((-score, i, left[1], right[1]))
    ranked.sort()
    return [(proto.pieces[left].piece, proto.pieces[right].piece) for _, _, left, right in ranked]


_M1, _B1 = (1 << 61) - 1, 1_000_003
_M2, _B2 = (1 << 89) - 1, 911_382_323


def _prefix_hashes(text: str) -> tuple[list[int], list[int]]:
    """The two polynomial hashes of every prefix of ``text`` (``[0]``: the empty one)."""
    h1, h2 = [0], [0]
    a = b = 0
    for code in map(ord, text):
        a = (a * _B1 + code + 1) % _M1
        b = (b * _B2 + code + 1) % _M2
        h1.append(a)
        h2.append(b)
    return h1, h2


def _powers(base: int, mod: int, n: int) -> list[int]:
    out = [1] * (n + 1)
    for k in range(1, n + 1):
        out[k] = out[k - 1] * base % mod
    return out


def _load_proto(spm_path: Path):
    try:
        from sentencepiece import sentencepiece_model_pb2
    except ImportError:
        from transformers.utils import sentencepiece_model_pb2_new as sentencepiece_model_pb2
    proto = sentencepiece_model_pb2.ModelProto()
    try:
        proto.ParseFromString(spm_path.read_bytes())
    except Exception as exc:  # protobuf's DecodeError and friends
        raise TokenizerConversionError(f"{spm_path} is no SentencePiece model ({exc})") from exc
    if not proto.pieces:
        raise TokenizerConversionError(f"{spm_path} is no SentencePiece model (it has no pieces)")
    return proto


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _first(value):
    return value[0] if isinstance(value, list) else value
