"""GGUF files → Hugging Face model folders that agentrl's engines and trainers load.

A GGUF file (llama.cpp's format) holds quantised weights, the model's hyper-parameters and its
tokenizer as metadata. SGLang's CPU engine and the torch/Megatron trainers load Hugging Face
folders, so :func:`import_gguf` turns one into the other with the transformers version the project
pins (and the ``gguf`` package): the weights dequantised to ``dtype`` (float32 by default, what the
CPU engine computes in) and saved as safetensors, ``config.json`` without the GGUF quantisation
entry, the tokenizer (``tokenizer.json``) and the file's chat template.

What is checked and fixed on the way:

- **The file and its architecture first.** A file that is not GGUF, or whose
  ``general.architecture`` transformers cannot read, fails at once with :class:`GgufImportError`
  naming the file, the architecture and the architectures transformers reads — before any tensor
  is read.
- **The tokenizer's pre-split.** llama.cpp names how text is split before BPE
  (``tokenizer.ggml.pre``); transformers 5.19 knows some names and silently falls back to GPT-2's
  split for the others. For the names that llama.cpp splits as SmolLM and StarCoder do (each digit
  alone, then GPT-2's split: :data:`DIGIT_SPLIT_PRE`), the import sets that split, so the folder
  tokenises as the model was trained (``"  3"`` is ``["ĠĠ", "3"]``, not ``["Ġ", "Ġ", "3"]``).
- **Nothing half-written.** The folder is written to a temporary sibling and moved into place, with
  ``agentrl_import.json`` (the source file's name, size and sha256, the dtype, the versions used)
  written last; :func:`imported_from` reads it, so a second import of the same file is skipped.

Example::

    report = import_gguf("SmolLM2-135M-Instruct.Q4_1.gguf", "models/smollm2", progress=print)
    report.parameters, report.folder
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = ["DIGIT_SPLIT_PRE", "MARKER", "GgufImportError", "GgufInfo", "ImportReport", "file_sha256",
           "import_gguf", "imported_from", "read_gguf_info", "readable_architectures"]

Dtype = Literal["float32", "bfloat16", "float16"]
DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")
MARKER = "agentrl_import.json"
"""The file an imported folder holds last: where it came from (see the module doc)."""

DIGIT_SPLIT_PRE: frozenset[str] = frozenset(
    {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"})
"""``tokenizer.ggml.pre`` names that llama.cpp splits as each digit alone, then GPT-2's regex
(``llama-vocab.cpp``); the Hugging Face equivalent is ``Digits(individual_digits=True)`` then
``ByteLevel``, the pre-tokeniser of SmolLM's and StarCoder's own ``tokenizer.json``."""

Progress = Callable[[str], None]


class GgufImportError(ValueError):
    """A GGUF file that cannot be imported; the message names the file, what is wrong and what was expected."""


@dataclass(frozen=True)
class GgufInfo:
    """What a GGUF file's header says (read without loading a tensor)."""

    path: Path
    size: int
    architecture: str
    name: str | None
    tensors: int
    tensor_types: dict[str, int]
    tokenizer: str | None
    pre_tokenizer: str | None

    def describe(self) -> str:
        """One line: size, architecture, tensor count and types."""
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(self.tensor_types.items(), key=lambda kv: -kv[1]))
        return (f"{self.path.name} ({self.size / 1e6:.1f} MB): architecture {self.architecture}, "
                f"{self.tensors} tensors ({kinds})")


@dataclass
class ImportReport:
    """What :func:`import_gguf` wrote: the folder, the source's header, the parameter count, the dtype,
    the source's sha256, the tokenizer fix applied (``None``: none), the bytes written and the
    seconds each stage took."""

    folder: Path
    info: GgufInfo
    parameters: int
    dtype: str
    sha256: str
    tokenizer_fix: str | None
    bytes_written: int
    seconds: dict[str, float] = field(default_factory=dict)


# transformers' own names for architectures whose GGUF name differs (its loader renames them)
_GGUF_SPELLING = {"qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe", "gpt_oss": "gpt-oss", "minimax_m2": "minimax-m2"}


def readable_architectures() -> list[str]:
    """The GGUF architectures the installed transformers reads (``general.architecture`` values)."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    names = {_GGUF_SPELLING.get(n, n) for n in GGUF_SUPPORTED_ARCHITECTURES} - {"general", "tokenizer"}
    try:
        from transformers.integrations.gguf.gguf_conversion_mapping import GGUF_ARCHS
        names |= set(GGUF_ARCHS)
    except ImportError:  # older transformers: only the legacy loader
        pass
    return sorted(names)


def _field(reader: Any, key: str) -> Any:
    f = reader.fields.get(key)
    if f is None:
        return None
    try:
        return f.contents()
    except (ValueError, IndexError):
        return None


def read_gguf_info(path: str | os.PathLike[str]) -> GgufInfo:
    """The header of the GGUF file at ``path``; raises :class:`GgufImportError` for a missing file or
    one that is not GGUF."""
    from gguf import GGUFReader

    file = Path(path).expanduser()
    if not file.is_file():
        raise GgufImportError(f"{os.fspath(path)!r}: no such file; expected a .gguf file")
    with file.open("rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise GgufImportError(f"{os.fspath(path)!r}: not a GGUF file (it starts with {magic!r}, expected b'GGUF')")
    try:
        reader = GGUFReader(str(file))
    except (ValueError, OSError) as exc:
        raise GgufImportError(f"{os.fspath(path)!r}: the GGUF header cannot be read: {exc}") from None
    arch = _field(reader, "general.architecture")
    if not isinstance(arch, str):
        raise GgufImportError(f"{os.fspath(path)!r}: no general.architecture in the header; expected a model file")
    kinds = Counter(t.tensor_type.name for t in reader.tensors)
    name, tok, pre = (_field(reader, k) for k in ("general.name", "tokenizer.ggml.model", "tokenizer.ggml.pre"))
    return GgufInfo(path=file.resolve(), size=file.stat().st_size, architecture=arch,
                    name=name if isinstance(name, str) else None, tensors=len(reader.tensors),
                    tensor_types=dict(kinds), tokenizer=tok if isinstance(tok, str) else None,
                    pre_tokenizer=pre if isinstance(pre, str) else None)


def file_sha256(path: str | os.PathLike[str], chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def imported_from(folder: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The import record of a folder :func:`import_gguf` wrote (``None``: not an imported folder)."""
    marker = Path(folder) / MARKER
    if not marker.is_file():
        return None
    try:
        record = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _fix_pre_tokenizer(tokenizer: Any, info: GgufInfo) -> str | None:
    """Sets the digit-then-GPT-2 split for the :data:`DIGIT_SPLIT_PRE` names; returns what it did."""
    from tokenizers import pre_tokenizers
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS

    pre = info.pre_tokenizer
    if info.tokenizer != "gpt2" or pre not in DIGIT_SPLIT_PRE or pre in GGUF_PRE_TOKENIZER_SPLITS:
        return None
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    return f"pre-tokenizer {pre!r}: digits one by one, then GPT-2's split (as llama.cpp)"


def _load_config(info: GgufInfo) -> Any:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(info.path.parent), gguf_file=info.path.name)
    except (ValueError, KeyError) as exc:
        readable = readable_architectures()
        if info.architecture not in readable or "not supported" in str(exc):
            import transformers

            raise GgufImportError(
                f"{info.path}: general.architecture={info.architecture!r} is not an architecture transformers "
                f"{transformers.__version__} reads from GGUF; it reads {', '.join(readable)}") from None
        raise GgufImportError(f"{info.path}: transformers cannot read the model config: {exc}") from None


def _load(info: GgufInfo, dtype: str, progress: Progress, report: ImportReport) -> tuple[Any, Any]:
    """``(tokenizer, model)`` from the file, the model free of GGUF's quantisation entry."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    config = _load_config(info)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(info.path.parent), gguf_file=info.path.name)
    except (ValueError, KeyError, TypeError) as exc:
        raise GgufImportError(f"{info.path}: transformers cannot build the tokenizer (tokenizer.ggml.model="
                              f"{info.tokenizer!r}, tokenizer.ggml.pre={info.pre_tokenizer!r}): {exc}") from None
    report.tokenizer_fix = _fix_pre_tokenizer(tokenizer, info)
    report.seconds["tokenizer"] = time.perf_counter() - started
    progress(f"  tokenizer  {len(tokenizer):,} tokens ({info.tokenizer}, pre-tokenizer {info.pre_tokenizer})"
             + (f"; {report.tokenizer_fix}" if report.tokenizer_fix else "")
             + f"  [{report.seconds['tokenizer']:.1f} s]")
    started = time.perf_counter()
    torch_dtype = getattr(torch, dtype)
    try:
        loaded = AutoModelForCausalLM.from_pretrained(str(info.path.parent), gguf_file=info.path.name,
                                                      config=config, dtype=torch_dtype)
    except (ValueError, KeyError, RuntimeError) as exc:
        raise GgufImportError(f"{info.path}: transformers cannot load the weights: {exc}") from None
    plain = config.to_dict()
    plain.pop("quantization_config", None)
    plain.pop("_name_or_path", None)
    clean = type(config).from_dict(plain)
    with torch.device("meta"):  # the same class without the GGUF quantiser: plain tensors, saveable
        model = AutoModelForCausalLM.from_config(clean, dtype=torch_dtype)
    model.load_state_dict(loaded.state_dict(), strict=True, assign=True)
    model.tie_weights()
    model.generation_config = loaded.generation_config
    report.parameters = sum(p.numel() for p in model.parameters())
    report.seconds["weights"] = time.perf_counter() - started
    progress(f"  weights    {report.parameters / 1e6:.1f}M parameters ({type(model).__name__}) dequantised to "
             f"{dtype}  [{report.seconds['weights']:.1f} s]")
    return tokenizer, model


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("transformers", "gguf", "torch"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "unknown"
    return out


def import_gguf(path: str | os.PathLike[str], out_dir: str | os.PathLike[str], *, dtype: str = "float32",
                overwrite: bool = False, sha256: str | None = None,
                progress: Progress | None = None) -> ImportReport:
    """Writes the model folder for the GGUF file ``path`` to ``out_dir`` (see the module doc).

    ``dtype``: ``float32`` (default), ``bfloat16`` or ``float16``. ``out_dir`` must not exist or be
    empty, unless ``overwrite``. ``sha256``: the file's hash when the caller already knows it (else
    it is computed). ``progress`` receives one line per stage. Raises :class:`GgufImportError` for
    a bad file, an architecture transformers cannot read, a bad ``dtype`` or an occupied ``out_dir``.
    """
    say = progress or (lambda _line: None)
    if dtype not in DTYPES:
        raise GgufImportError(f"dtype={dtype!r}: expected one of {', '.join(DTYPES)}")
    out = Path(out_dir).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise GgufImportError(f"{os.fspath(out_dir)!r} exists and is not an empty folder; expected a new folder "
                              "(or overwrite=True / --force)")
    info = read_gguf_info(path)
    say(f"importing {info.describe()}")
    started = time.perf_counter()
    digest = sha256 or file_sha256(info.path)
    report = ImportReport(folder=out.resolve(), info=info, parameters=0, dtype=dtype, sha256=digest,
                          tokenizer_fix=None, bytes_written=0, seconds={"sha256": time.perf_counter() - started})
    with _quiet_progress_bars():
        tokenizer, model = _load(info, dtype, say, report)
        started = time.perf_counter()
        tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
        _write(tmp, out, tokenizer, model, {
            "source": info.path.name, "size": info.size, "sha256": digest, "architecture": info.architecture,
            "dtype": dtype, "parameters": report.parameters, "tokenizer_fix": report.tokenizer_fix,
            "versions": _versions()})
    report.bytes_written = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    report.seconds["save"] = time.perf_counter() - started
    say(f"  saved      {report.folder} ({report.bytes_written / 1e6:.0f} MB)  [{report.seconds['save']:.1f} s]")
    return report


@contextlib.contextmanager
def _quiet_progress_bars() -> Iterator[None]:
    """transformers' own tqdm bars off (the import prints one line per stage instead)."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


def _write(tmp: Path, out: Path, tokenizer: Any, model: Any, record: dict[str, Any]) -> None:
    """Model, tokenizer and the import record into ``tmp`` (the record last), then ``tmp`` → ``out``."""
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        (tmp / MARKER).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        if out.exists():
            shutil.rmtree(out) if out.is_dir() else out.unlink()
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
