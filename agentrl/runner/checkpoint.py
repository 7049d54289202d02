"""Run checkpoints written atomically: a killed writer never leaves a checkpoint that looks complete.

Layout of ``directory`` (a run folder's ``checkpoints/``)::

    step_000003/
      trainer/        written by the caller's ``write_trainer`` (model, optimiser, RNG per rank)
      state.json      the runner's JSON state: scheduler, ledger, RNG, policy version, ...
      meta.json       {"format", "step", "config_hash", "time", "agentrl_version"}; written LAST
    .tmp-step_000004-1a2b3c4d/     a save in progress (or one a kill interrupted)

:meth:`RunCheckpointer.save` builds the checkpoint in a ``.tmp-`` folder, fsyncs every file and
folder in it, then renames it to ``step_NNNNNN`` and fsyncs ``directory``. A checkpoint counts as
complete when its ``meta.json`` exists, so a kill at any point leaves :meth:`RunCheckpointer.latest`
at the previous checkpoint. Old checkpoints are renamed to a ``.tmp-`` name before they are
deleted, so a kill mid-delete cannot leave a complete-looking half checkpoint. One history per
folder: saving step *k* replaces an existing ``step_k`` and removes checkpoints of later steps
(left by a run that was resumed from an earlier one).

Example::

    ckpt = RunCheckpointer(run.checkpoints_dir, keep_last=2, config_hash=config.hash())
    ckpt.save(3, write_trainer=backend.save_checkpoint, state={"ledger": ledger.state_dict()})
    loaded = ckpt.load(RunCheckpointer.resolve("runs/exp1"))    # the run's latest checkpoint
    backend.load_checkpoint(loaded.trainer_dir); ledger.load_state_dict(loaded.state["ledger"])
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import agentrl
from agentrl.runner._files import fsync_dir, fsync_tree, json_bytes, read_json_object, write_atomic

__all__ = ["CheckpointError", "CheckpointWriteError", "LoadedCheckpoint", "RunCheckpointer"]

_FORMAT = 1
_STEP_RE = re.compile(r"step_(\d{6,})")
_TMP_PREFIX = ".tmp-"


class CheckpointError(RuntimeError):
    """No checkpoint where one was expected, a malformed one, or one written for another config."""


class CheckpointWriteError(OSError):
    """Writing a checkpoint failed (nothing complete was left behind). The message names the step, the
    folder, the cause and, when the filesystem is full, says so with its free space; ``errno`` is the
    cause's, or ``ENOSPC`` when the disk is full and the writer's own error did not say so (torch
    reports a full disk as a zip-writer position mismatch)."""


_FULL_BELOW = 1 << 20  # a filesystem with less than this free after a failed write counts as full
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def _write_error(step: int, tmp: Path, exc: BaseException, free: int | None) -> CheckpointWriteError:
    cause: BaseException | None = exc
    code = None
    while cause is not None and code is None:  # the errno of the first OSError in the chain
        code = cause.errno if isinstance(cause, OSError) else None
        cause = cause.__cause__ or cause.__context__
    full = code in _FULL_ERRNOS or (free is not None and free < _FULL_BELOW)
    message = f"checkpoint of step {step}: writing {tmp} failed: {type(exc).__name__}: {exc}"
    if full:
        message += (f"; the disk is full ({free if free is not None else '?'} bytes free on the filesystem of "
                    f"{tmp.parent}); free space, then resume from the latest complete checkpoint")
        code = code if code in _FULL_ERRNOS else errno.ENOSPC
    return CheckpointWriteError(code, message) if code is not None else CheckpointWriteError(message)


@dataclass(frozen=True)
class LoadedCheckpoint:
    """A complete checkpoint read back: ``state`` as saved, ``trainer_dir`` for the backend to load."""

    path: Path
    step: int
    state: dict[str, Any]
    trainer_dir: Path
    meta: dict[str, Any]


def _free_bytes(directory: Path) -> int | None:
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return None


def _is_complete(path: Path) -> bool:
    return _STEP_RE.fullmatch(path.name) is not None and (path / "meta.json").is_file()


def _complete(directory: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints in ``directory`` by ascending step."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        match = _STEP_RE.fullmatch(name)
        if match and (directory / name / "meta.json").is_file():
            found.append((int(match.group(1)), directory / name))
    return sorted(found)


def _read_object(path: Path) -> dict[str, Any]:
    return read_json_object(path, CheckpointError, "missing; expected a complete checkpoint")


class RunCheckpointer:
    """Saves, lists, prunes and loads the checkpoints in ``directory`` (see the module doc).

    One writer per folder; readers (:meth:`latest`, :meth:`load`) may run alongside it.
    """

    def __init__(self, directory: Path | str, *, keep_last: int, config_hash: str) -> None:
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
            raise CheckpointError(f"keep_last = {keep_last!r}; expected an int >= 1")
        if not isinstance(config_hash, str) or not config_hash:
            raise CheckpointError(f"config_hash = {config_hash!r}; expected a non-empty str")
        self.directory = Path(directory)
        self.keep_last = keep_last
        self.config_hash = config_hash
        self.directory.mkdir(parents=True, exist_ok=True)

    def checkpoints(self) -> list[Path]:
        """Complete checkpoints, oldest first."""
        return [path for _step, path in _complete(self.directory)]

    def latest(self) -> Path | None:
        """The complete checkpoint of the highest step, or ``None``."""
        found = _complete(self.directory)
        return found[-1][1] if found else None

    def save(self, step: int, *, write_trainer: Callable[[Path], object], state: Mapping[str, Any]) -> Path:
        """Writes checkpoint ``step`` (see the module doc) and returns its folder. If ``write_trainer``
        or a write fails, nothing complete is left behind and :class:`CheckpointWriteError` says what
        failed, where, and whether the disk is full (a non-JSON ``state`` raises before any write)."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise CheckpointError(f"step = {step!r}; expected an int >= 0")
        self._remove_stale_temps()
        state_bytes = json_bytes(dict(state), what="state")  # fail before any write on a non-JSON state
        name = f"step_{step:06d}"
        tmp = self.directory / f"{_TMP_PREFIX}{name}-{secrets.token_hex(4)}"
        tmp.mkdir()
        try:
            (tmp / "trainer").mkdir()
            write_trainer(tmp / "trainer")
            (tmp / "state.json").write_bytes(state_bytes)
            fsync_tree(tmp)
            meta = {"format": _FORMAT, "step": step, "config_hash": self.config_hash, "time": time.time(),
                    "agentrl_version": agentrl.__version__}
            write_atomic(tmp / "meta.json", json_bytes(meta, what="meta"))
            final = self.directory / name
            if final.exists():
                self._discard(final)
            os.rename(tmp, final)
        except Exception as exc:
            free = _free_bytes(self.directory)  # before the partial checkpoint is removed
            shutil.rmtree(tmp, ignore_errors=True)
            raise _write_error(step, tmp, exc, free) from exc
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        fsync_dir(self.directory)
        self._prune(step)
        return final

    def _discard(self, path: Path) -> None:
        """Renames ``path`` out of the listing first (atomic), then deletes it."""
        doomed = self.directory / f"{_TMP_PREFIX}old-{path.name}-{secrets.token_hex(4)}"
        os.rename(path, doomed)
        shutil.rmtree(doomed, ignore_errors=True)

    def _prune(self, saved_step: int) -> None:
        found = _complete(self.directory)
        later = [path for s, path in found if s > saved_step]
        upto = [path for s, path in found if s <= saved_step]
        for path in later + upto[: max(0, len(upto) - self.keep_last)]:
            self._discard(path)
        fsync_dir(self.directory)

    def _remove_stale_temps(self) -> None:
        for name in os.listdir(self.directory):
            if name.startswith(_TMP_PREFIX):
                shutil.rmtree(self.directory / name, ignore_errors=True)

    def load(self, path: Path | str, *, allow_config_change: bool = False) -> LoadedCheckpoint:
        """Reads a checkpoint (``path`` as :meth:`resolve` takes it). A checkpoint saved under another
        config hash raises :class:`CheckpointError` naming both, unless ``allow_config_change``."""
        folder = self.resolve(path)
        meta = _read_object(folder / "meta.json")
        saved_hash = meta.get("config_hash")
        if saved_hash != self.config_hash and not allow_config_change:
            raise CheckpointError(
                f"{folder}: saved with config hash {saved_hash!r}, this run's config hash is {self.config_hash!r}; "
                f"resume with the same config, or pass allow_config_change=True to load it anyway")
        step = meta.get("step")
        if isinstance(step, bool) or not isinstance(step, int):
            raise CheckpointError(f"{folder / 'meta.json'}: step = {step!r}; expected an int")
        state = _read_object(folder / "state.json")
        return LoadedCheckpoint(path=folder, step=step, state=state, trainer_dir=folder / "trainer", meta=meta)

    @staticmethod
    def resolve(path: Path | str) -> Path:
        """A complete checkpoint folder as is; a checkpoints folder, or a run folder (its
        ``checkpoints/``), as its latest complete checkpoint. Anything else raises :class:`CheckpointError`."""
        path = Path(path)
        if not path.exists():
            raise CheckpointError(f"checkpoint path {str(path)!r} does not exist")
        if _is_complete(path):
            return path
        if _STEP_RE.fullmatch(path.name):
            raise CheckpointError(f"{path}: incomplete checkpoint (no meta.json; its writer was interrupted)")
        for folder in (path, path / "checkpoints"):
            found = _complete(folder)
            if found:
                return found[-1][1]
        raise CheckpointError(f"{path}: no complete checkpoint (looked for step_NNNNNN/meta.json in it and "
                              f"in its checkpoints/ folder)")
