"""A disk that fills up while a checkpoint is written: a real tmpfs of 24 MiB mounted for the test (root
only; skipped with the reason elsewhere) holds the run folder; the run is the tiny model's with the real
torch trainer and real checkpoints, on the fake engine (the fault is the filesystem's).

Right before step 2's checkpoint a filler file takes all but 64 KiB of the disk. Expected: the run stops
with an error that says the disk is full and names the checkpoint folder; the latest complete
checkpoint is still step 1's and no half-written one looks complete; once space is freed the run
resumes from step 1 and trains exactly the prompts an uninterrupted run trains, each once.
"""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrl.runner import RunCallback
from agentrl.runner.checkpoint import RunCheckpointer
from agentrl.testing.runner import build_fake_runner, fake_run_config, trained_prompts

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

STEPS, ROWS = 4, 8
SIZE_MB = 24


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE_MB}m", "tmpfs", str(mount)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root / CAP_SYS_ADMIN): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


class FillDisk(RunCallback):
    """Fills the disk right before ``at``'s checkpoint, leaving ``leave`` bytes."""

    def __init__(self, disk: Path, at: int, leave: int = 64 << 10) -> None:
        self.disk, self.at, self.leave = disk, at, leave
        self.filler = disk / "filler.bin"

    def on_phase(self, phase: str, step: int) -> None:
        if phase == "checkpoint" and step == self.at:
            free = shutil.disk_usage(self.disk).free - self.leave
            with open(self.filler, "wb") as fh:
                fh.truncate(0)
                chunk = b"\0" * (1 << 20)
                while free > 0:
                    free -= fh.write(chunk[: min(len(chunk), free)])


def test_a_disk_filling_up_during_a_checkpoint_stops_the_run_clearly_and_resume_loses_nothing(
        small_disk: Path, tmp_path: Path) -> None:
    straight = fake_run_config(tmp_path / "straight", steps=STEPS, rows=ROWS)
    runner, _ = build_fake_runner(straight)
    asyncio.run(asyncio.wait_for(runner.run(), 120))
    expected = trained_prompts(runner.run_dir)

    config = fake_run_config(small_disk / "job", steps=STEPS, rows=ROWS)
    fill = FillDisk(small_disk, at=2)
    runner, _ = build_fake_runner(config, callbacks=(fill,))
    with pytest.raises(OSError) as info:
        asyncio.run(asyncio.wait_for(runner.run(), 120))
    print(f"\nthe run stopped with: {type(info.value).__name__}: {info.value}")
    assert info.value.errno == errno.ENOSPC or "No space left on device" in str(info.value)
    assert "checkpoints" in str(info.value), "the error does not name where it was writing"
    ckpt = RunCheckpointer(config.run_dir() / "checkpoints", keep_last=2, config_hash=config.hash())
    latest = ckpt.latest()
    assert latest is not None and latest.name == "step_000001"
    complete = sorted(p.name for p in (config.run_dir() / "checkpoints").iterdir() if (p / "meta.json").exists())
    assert complete == ["step_000001"]

    os.remove(fill.filler)  # space freed: resume
    resumed, _ = build_fake_runner(config, resume=str(config.run_dir()))
    asyncio.run(asyncio.wait_for(resumed.run(), 120))
    steps = trained_prompts(resumed.run_dir)
    assert steps == expected, f"resumed {steps}, uninterrupted {expected}"
    flat = [p for s in steps for p in s]
    assert len(flat) == len(set(flat)) == STEPS * 2
