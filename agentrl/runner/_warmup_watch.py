"""The warm-up's progress on the driver: the lines it logs to ``warmup_metrics.jsonl``, as callbacks.

The warm-up runs on the trainer (a thread, or a Ray actor) and logs a line every
``warmup.log_every`` steps and at each check. :func:`watch_warmup` reads that file while the
warm-up runs and hands each new line to the callbacks' ``on_warmup_progress``; it ends once the
warm-up (re)wrote ``warmup.json`` (its report) or when cancelled, after a last read either way. It
reads only whole lines and skips one that is not a JSON object with a whole-number ``step``, so a
line being written or a damaged file never stops a run. A trainer on another node writes where
the driver cannot see: then no line comes, and the run goes on as before.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

from agentrl.runner._interfaces import overriding

__all__ = ["WarmupTail", "warmup_watchers", "watch_warmup"]

log = logging.getLogger(__name__)


def warmup_watchers(callbacks: Sequence[Any]) -> list[Any]:
    """The callbacks that override ``on_warmup_progress`` (duck-typed ones need not have it)."""
    return overriding(callbacks, "on_warmup_progress")


class WarmupTail:
    """The new whole lines of ``warmup_metrics.jsonl`` since the last :meth:`read`."""

    def __init__(self, path: str | Path, *, from_end: bool = False) -> None:
        self.path = Path(path)
        self._offset = 0
        if from_end:  # lines of an earlier run in the same folder are not this warm-up's
            try:
                self._offset = self.path.stat().st_size
            except FileNotFoundError:
                pass

    def read(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next read
        self._offset += end
        rows = []
        for raw in data[:end].splitlines():
            try:
                row = json.loads(raw)
            except ValueError:
                continue
            step = row.get("step") if isinstance(row, dict) else None
            if isinstance(step, int | float) and not isinstance(step, bool) and float(step).is_integer():
                rows.append({**row, "step": int(step)})
        return rows


def watch_warmup(run_dir: str | Path, total_steps: int, callbacks: Sequence[Any], *,
                 interval_s: float = 1.0) -> Coroutine[Any, Any, None]:
    """A coroutine calling ``cb.on_warmup_progress(step, total_steps, metrics)`` for each line the
    warm-up logs; the folder is looked at when this is called (what is there then is not this
    warm-up's), so call it before the warm-up starts."""
    folder = Path(run_dir)
    tail = WarmupTail(folder / "warmup_metrics.jsonl", from_end=True)
    report = folder / "warmup.json"
    return _watch(tail, report, _stamp(report), total_steps, callbacks, interval_s)


async def _watch(tail: WarmupTail, report: Path, before: tuple[int, int] | None, total_steps: int,
                 callbacks: Sequence[Any], interval_s: float) -> None:
    def deliver() -> None:
        for row in tail.read():
            step = row.pop("step")
            metrics = {k: float(v) for k, v in row.items() if isinstance(v, int | float) and not isinstance(v, bool)}
            total = int(metrics.get("cooldown_to", total_steps))  # a cool-down ends the warm-up early
            for cb in callbacks:
                try:
                    cb.on_warmup_progress(step, total, metrics)
                except Exception:  # a display's bug must not stop the warm-up
                    log.exception("on_warmup_progress of %r raised", cb)

    try:
        while _stamp(report) == before:
            deliver()
            await asyncio.sleep(interval_s)
    finally:
        deliver()


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_mtime_ns, st.st_size
