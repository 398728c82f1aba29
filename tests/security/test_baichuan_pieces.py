"""Attack: a hostile Baichuan2 ``tokenizer.model`` (issue 28).

Before: the conversion pasted the chat tokens' piece texts into the chat template's Jinja source, so a piece that
closed the string and opened a ``{% for %}`` loop ran that loop on every prompt (the server never listened in
150 s), a quote made the template a TemplateSyntaxError, and one 400,000-character piece took 95 s to convert,
sliced once per character. After: each piece text is a Jinja string literal of escapes (the template prints it,
exactly), and a piece's cuts are found by hashes, reading each piece once: the conversion is linear in the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import jinja2
import pytest
from jinja2 import nodes

from app.engine.models import baichuan_tokenizer
from app.engine.models.baichuan_tiny import _corpus, _train_tokenizer
from app.engine.models.baichuan_tokenizer import ChatTokens, chat_template, convert_tokenizer
from tests.helpers.servers import ROOT

USER, ASSISTANT = 195, 196  # the chat tokens' ids (generation_config.json's defaults)
LOOP = "'}}{%- for i in range(99999999999) -%}{%- endfor -%}{{'"
QUOTE = "<reserved_107>'"
HALF = 200_000


@pytest.fixture(scope="module")
def spm_bytes() -> bytes:
    """A real SentencePiece BPE model laid out as Baichuan2's (the tiny checkpoints' own trainer)."""
    return _train_tokenizer(_corpus(ROOT / "templates"))


def hostile_model(spm_bytes: bytes, folder: Path, *, user: str, assistant: str, extra: tuple[str, ...] = ()) -> Path:
    """``spm_bytes`` with the chat tokens' texts replaced and ``extra`` normal pieces added, as tokenizer.model."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(spm_bytes)
    proto.pieces[USER].piece, proto.pieces[ASSISTANT].piece = user, assistant
    for k, text in enumerate(extra):
        piece = proto.pieces.add()
        piece.piece, piece.score, piece.type = text, -1_000_000.0 - k, 1  # NORMAL
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tokenizer.model"
    path.write_bytes(proto.SerializeToString())
    return path


def rendered(out: Path, messages: list[dict]) -> str:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(out).apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def template_shape(template: str) -> tuple[int, list[str]]:
    """(the number of for-loops, the constant strings the template sets), read from its parsed source."""
    tree = jinja2.Environment().parse(template)
    sets = [a.node.value for a in tree.find_all(nodes.Assign) if isinstance(a.node, nodes.Const)]
    return len(list(tree.find_all(nodes.For))), sets


MESSAGES = [{"role": "system", "content": "S"}, {"role": "user", "content": "你好"},
            {"role": "assistant", "content": "您好"}, {"role": "user", "content": "开发票"}]


@pytest.mark.parametrize("user, assistant", [(LOOP, "<reserved_107>"), ("<reserved_106>", QUOTE),
                                             ("{{ 7 * 7 }}\\n{# #}%}", "\n\t\"'\\ 😀")])
def test_a_piece_text_is_printed_as_it_is_never_run_as_template(spm_bytes, tmp_path, user, assistant):
    path = hostile_model(spm_bytes, tmp_path / "model", user=user, assistant=assistant)
    tokens = convert_tokenizer(path, tmp_path / "out")
    assert tokens == ChatTokens(user=user, assistant=assistant, eos="</s>")
    config = json.loads((tmp_path / "out" / "tokenizer_config.json").read_text(encoding="utf-8"))
    template = config.get("chat_template") or (tmp_path / "out" / "chat_template.jinja").read_text(encoding="utf-8")
    assert template == chat_template(tokens)
    # One loop (the messages'), and the two texts set as constants: no loop, tag or quote of theirs is source.
    assert template_shape(template) == (1, [user, assistant])
    assert rendered(tmp_path / "out", MESSAGES) == f"S{user}你好{assistant}您好{user}开发票{assistant}"


def test_a_400k_character_piece_converts_with_its_one_merge(spm_bytes, tmp_path):
    left, right = "甲" * HALF, "乙" * HALF
    user = "丙" * (2 * HALF)  # the chat token too: a 400,000-character literal in the template
    path = hostile_model(spm_bytes, tmp_path / "model", user=user, assistant="<reserved_107>",
                         extra=(left, right, left + right))
    tokens = convert_tokenizer(path, tmp_path / "out")
    assert (tokens.user, template_shape(chat_template(tokens))) == (user, (1, [user, "<reserved_107>"]))
    merges = json.loads((tmp_path / "out" / "tokenizer.json").read_text(encoding="utf-8"))["model"]["merges"]
    long_merges = [m for m in merges if max(len(x) for x in m) > 16]
    assert long_merges == [[left, right]]  # the long piece made of the two halves, and nothing else of them
    assert rendered(tmp_path / "out", MESSAGES[:2]) == f"S{user}你好<reserved_107>"


class Counted(str):
    """A piece text that counts the characters read from it (iterated, or sliced)."""

    reads = 0

    def __iter__(self):
        Counted.reads += len(self)
        return super().__iter__()

    def __getitem__(self, key):
        out = super().__getitem__(key)
        Counted.reads += len(out)
        return out


def test_finding_the_merges_reads_each_piece_once(monkeypatch):
    """Linear, asserted as work rather than time: the characters read to find the merges of a model with one
    4,000-character piece are the model's characters, once: 8,006 (slicing at every cut read 23,992,004)."""
    texts = ["a", "b", "ab", "x" * 2_000, "y" * 2_000, "x" * 2_000 + "y" * 2_000, "ba"]
    pieces = [SimpleNamespace(piece=Counted(t), score=-float(k), type=1) for k, t in enumerate(texts)]
    Counted.reads = 0
    merges = baichuan_tokenizer._merges(SimpleNamespace(pieces=pieces))
    assert merges == [("a", "b"), ("x" * 2_000, "y" * 2_000), ("b", "a")]
    assert Counted.reads == sum(map(len, texts))
