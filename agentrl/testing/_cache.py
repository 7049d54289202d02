"""Where the test tokenizer and tiny model are cached, and how a cached folder is (re)built.

A folder counts as built when its ``required`` files exist. Building writes into a sibling
``.tmp<pid>`` folder, then moves each file into place, the ``required`` ones last, so a crash
mid-build never leaves a folder that looks complete and the next call builds it again. Files
already in the folder that the build does not write are left alone (``path=`` may name a folder
the caller owns). Builds are deterministic, so two processes building one folder at once write
the same bytes.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path


def cache_root() -> Path:
    """``$AGENTRL_CACHE``, else ``~/.cache/agentrl``."""
    return Path(os.environ.get("AGENTRL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "agentrl"))


def build_folder(folder: Path, required: tuple[str, ...], write: Callable[[Path], object]) -> Path:
    """Returns ``folder``, first building it with ``write(tmp)`` unless all ``required`` files exist."""
    if all((folder / name).exists() for name in required):
        return folder
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        write(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for name in sorted(os.listdir(tmp), key=lambda n: n in required):
            os.replace(tmp / name, folder / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder
