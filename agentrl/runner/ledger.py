"""The prompt ledger: which prompts each training step trained, per epoch.

A data cursor says how far the sampler has read; it runs ahead of training (prompts buffered for
rollout, a partial-rollout buffer, a step cut short by a kill). Resuming from the cursor alone
skips or repeats prompts. The ledger records what was actually *trained*, step by step, as
``(epoch, prompt_id)`` pairs, refuses a prompt trained twice in one epoch, and tells which prompts
of a finished epoch were never trained. It is saved inside every checkpoint
(:meth:`PromptLedger.state_dict`, JSON types only) and restored on resume.

Example::

    ledger = PromptLedger()
    ledger.record(1, [(0, "q-17"), (0, "q-3")])
    ledger.record(2, [(0, "q-8"), (1, "q-17")])      # epoch 1 may train q-17 again
    ledger.record(3, [(0, "q-3")])                   # LedgerError: q-3 already trained at step 1
    assert ledger.check_complete(0, ["q-3", "q-8", "q-17", "q-20"]) == ["q-20"]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

__all__ = ["LedgerError", "LedgerStep", "PromptLedger"]

_FORMAT = 1


class LedgerError(ValueError):
    """A step or prompt recorded against the ledger's rules, or a malformed saved ledger."""


class LedgerStep(NamedTuple):
    """What one training step trained: ``(epoch, prompt_id)`` pairs in the order given."""

    step: int
    entries: tuple[tuple[int, str], ...]


def _checked_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise LedgerError(f"{what} = {value!r}; expected an int >= 0")
    return value


def _checked_entries(step: int, entries: Iterable[Any]) -> tuple[tuple[int, str], ...]:
    out = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, tuple | list) or len(entry) != 2:
            raise LedgerError(f"step {step}: entries[{i}] = {entry!r}; expected an (epoch, prompt_id) pair")
        epoch = _checked_int(entry[0], f"step {step}: entries[{i}] epoch")
        if not isinstance(entry[1], str) or not entry[1]:
            raise LedgerError(f"step {step}: entries[{i}] prompt_id = {entry[1]!r}; expected a non-empty str")
        out.append((epoch, entry[1]))
    return tuple(out)


class PromptLedger:
    """Per-epoch record of trained prompts (see the module doc). Steps must increase; a failed
    :meth:`record` changes nothing. Not thread-safe; picklable."""

    def __init__(self) -> None:
        self._steps: list[LedgerStep] = []
        self._trained: dict[int, dict[str, int]] = {}  # epoch -> prompt_id -> step that trained it

    def record(self, step: int, entries: Sequence[tuple[int, str]]) -> None:
        """Records that ``step`` trained ``entries``; raises :class:`LedgerError` (recording nothing)
        when the step is not after the last one, or a prompt is trained twice in one epoch."""
        step = _checked_int(step, "step")
        if self._steps and step <= self._steps[-1].step:
            last = self._steps[-1].step
            what = "is already recorded" if step == last or step in {s.step for s in self._steps} else \
                f"comes after step {last}"
            raise LedgerError(f"step {step} {what}; expected each step recorded once, in increasing order")
        checked = _checked_entries(step, entries)
        seen: dict[tuple[int, str], int] = {}
        for epoch, prompt_id in checked:
            earlier = self._trained.get(epoch, {}).get(prompt_id)
            if earlier is None and (epoch, prompt_id) in seen:
                earlier = step
            if earlier is not None:
                raise LedgerError(f"step {step}: prompt {prompt_id!r} of epoch {epoch} was already trained at "
                                  f"step {earlier}; expected each prompt once per epoch")
            seen[(epoch, prompt_id)] = step
        for epoch, prompt_id in checked:
            self._trained.setdefault(epoch, {})[prompt_id] = step
        self._steps.append(LedgerStep(step, checked))

    def trained(self, epoch: int) -> set[str]:
        """The prompt ids trained in ``epoch`` so far."""
        return set(self._trained.get(epoch, {}))

    def step_of(self, epoch: int, prompt_id: str) -> int | None:
        """The step that trained ``prompt_id`` in ``epoch``, or ``None``."""
        return self._trained.get(epoch, {}).get(prompt_id)

    def steps(self) -> list[LedgerStep]:
        """Every recorded step, in order."""
        return list(self._steps)

    def epochs(self) -> list[int]:
        """Epochs with at least one trained prompt, ascending."""
        return sorted(e for e, prompts in self._trained.items() if prompts)

    @property
    def last_step(self) -> int | None:
        return self._steps[-1].step if self._steps else None

    def __len__(self) -> int:
        """The number of recorded steps."""
        return len(self._steps)

    def check_complete(self, epoch: int, all_prompt_ids: Iterable[str]) -> list[str]:
        """The prompts of ``all_prompt_ids`` never trained in ``epoch``, in the order given (empty when
        the epoch trained every prompt)."""
        trained = self._trained.get(epoch, {})
        return [p for p in all_prompt_ids if p not in trained]

    def trained_count(self) -> int:
        """Prompts trained so far (each step's entries, every epoch)."""
        return sum(len(s.entries) for s in self._steps)

    def state_dict(self) -> dict[str, Any]:
        """JSON types only: ``{"format": 1, "steps": [[step, [[epoch, prompt_id], ...]], ...]}``."""
        return {"format": _FORMAT, "steps": [[s.step, [list(e) for e in s.entries]] for s in self._steps]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Replaces the ledger with a saved one, re-checking every rule (nothing changes on error)."""
        if not isinstance(state, Mapping) or state.get("format") != _FORMAT or not isinstance(state.get("steps"), list):
            raise LedgerError(f"ledger state: expected {{'format': {_FORMAT}, 'steps': [...]}}, got {state!r:.200}")
        fresh = PromptLedger()
        for i, item in enumerate(state["steps"]):
            if not isinstance(item, list | tuple) or len(item) != 2 or not isinstance(item[1], list | tuple):
                raise LedgerError(f"ledger state: steps[{i}] = {item!r:.200}; expected [step, [[epoch, prompt_id], ...]]")
            fresh.record(item[0], item[1])
        self._steps, self._trained = fresh._steps, fresh._trained
