"""Where the test tokenizer and tiny model are cached, and how a cached folder is (re)built.

A folder counts as built when its ``required`` files exist. Building writes into a sibling
``.tmp<pid>`` folder, then moves each file into place, the ``required`` ones last, so a crash
mid-build never leaves a folder that looks complete and the next call builds it again. Files
already in the folder that the build does not write are left alone (``path=`` may name a folder
the caller owns). Builds are deterministic, so two processes building one folder at once write
the same bytes.

With a ``key`` (what was built: version, configuration, seed), the folder also records it in
``BUILD_KEY_FILE``, written last, and counts as built only when that record matches: a folder the
caller names (``examples/demo_prepare.py --seed 1`` into ``models/demo-tiny``) is rebuilt when it
holds another seed's or shape's model instead of being returned as it is.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path


def cache_root() -> Path:
    """``$AGENTRL_CACHE``, else ``~/.cache/agentrl``."""
    return Path(os.environ.get("AGENTRL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "agentrl"))


BUILD_KEY_FILE = ".agentrl-build"


def _built_key(folder: Path) -> str | None:
    try:
        return (folder / BUILD_KEY_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        return None


def build_folder(folder: Path, required: tuple[str, ...], write: Callable[[Path], object], *,
                 key: str | None = None) -> Path:
    """Returns ``folder``, first building it with ``write(tmp)`` unless all ``required`` files exist
    (and, with ``key``, the folder records that key)."""
    if all((folder / name).exists() for name in required) and (key is None or _built_key(folder) == key):
        return folder
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        write(tmp)
        if key is not None:
            (tmp / BUILD_KEY_FILE).write_text(key + "\n", encoding="utf-8")
        folder.mkdir(parents=True, exist_ok=True)
        if key is not None:  # another build's record goes first: a crash below leaves no stale match
            (folder / BUILD_KEY_FILE).unlink(missing_ok=True)
        last = (*required, BUILD_KEY_FILE)
        for name in sorted(os.listdir(tmp), key=lambda n: (n in last, n == BUILD_KEY_FILE)):
            os.replace(tmp / name, folder / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder
