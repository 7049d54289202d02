"""PromptLedger: per-epoch records, the twice-trained and step-order errors (naming step, epoch and
prompt, recording nothing), completeness of a finished epoch, and a JSON state round trip."""

from __future__ import annotations

import pickle
import random

import orjson
import pytest

from agentrl.runner.ledger import LedgerError, LedgerStep, PromptLedger


def test_records_per_step_and_per_epoch() -> None:
    ledger = PromptLedger()
    ledger.record(1, [(0, "a"), (0, "b")])
    ledger.record(2, [(0, "c"), (1, "a")])  # an epoch boundary inside a step
    ledger.record(5, [])
    assert ledger.trained(0) == {"a", "b", "c"} and ledger.trained(1) == {"a"} and ledger.trained(2) == set()
    assert ledger.steps() == [LedgerStep(1, ((0, "a"), (0, "b"))), LedgerStep(2, ((0, "c"), (1, "a"))),
                              LedgerStep(5, ())]
    assert ledger.step_of(1, "a") == 2 and ledger.step_of(1, "b") is None
    assert ledger.epochs() == [0, 1] and ledger.last_step == 5 and len(ledger) == 3


def test_a_prompt_trained_twice_in_an_epoch_raises_naming_step_epoch_and_prompt() -> None:
    ledger = PromptLedger()
    ledger.record(1, [(0, "a"), (0, "b")])
    with pytest.raises(LedgerError, match="step 2: prompt 'b' of epoch 0 was already trained at step 1"):
        ledger.record(2, [(0, "c"), (0, "b")])
    with pytest.raises(LedgerError, match="step 2: prompt 'd' of epoch 3 was already trained at step 2"):
        ledger.record(2, [(3, "d"), (3, "d")])
    # nothing of the refused steps was recorded
    assert ledger.trained(0) == {"a", "b"} and ledger.trained(3) == set() and len(ledger) == 1
    ledger.record(2, [(0, "c")])
    assert ledger.trained(0) == {"a", "b", "c"}


def test_a_step_recorded_twice_or_out_of_order_raises() -> None:
    ledger = PromptLedger()
    ledger.record(3, [(0, "a")])
    with pytest.raises(LedgerError, match="step 3 is already recorded"):
        ledger.record(3, [(0, "b")])
    with pytest.raises(LedgerError, match="step 2 comes after step 3"):
        ledger.record(2, [(0, "b")])
    assert ledger.trained(0) == {"a"}


@pytest.mark.parametrize(("step", "entries", "message"), [
    (-1, [], "step = -1; expected an int >= 0"),
    (True, [], "step = True"),
    (1, [(0,)], r"step 1: entries\[0\] = \(0,\); expected an \(epoch, prompt_id\) pair"),
    (1, ["ab"], r"entries\[0\] = 'ab'"),
    (1, [(0, "a"), (-2, "b")], r"step 1: entries\[1\] epoch = -2"),
    (1, [(0, 7)], r"step 1: entries\[0\] prompt_id = 7; expected a non-empty str"),
    (1, [(0, "")], r"prompt_id = ''"),
])
def test_malformed_records_are_refused(step: int, entries: list[tuple[int, str]], message: str) -> None:
    ledger = PromptLedger()
    with pytest.raises(LedgerError, match=message):
        ledger.record(step, entries)
    assert len(ledger) == 0 and ledger.trained(0) == set()


def test_check_complete_lists_the_untrained_prompts_of_an_epoch_in_order() -> None:
    ledger = PromptLedger()
    ledger.record(1, [(0, "p3"), (0, "p1")])
    ledger.record(2, [(1, "p2")])
    everything = ["p0", "p1", "p2", "p3", "p4"]
    assert ledger.check_complete(0, everything) == ["p0", "p2", "p4"]
    assert ledger.check_complete(1, everything) == ["p0", "p1", "p3", "p4"]
    ledger.record(3, [(0, p) for p in ("p0", "p2", "p4")])
    assert ledger.check_complete(0, everything) == []


def test_state_round_trips_through_json_and_keeps_enforcing_the_rules() -> None:
    rng = random.Random(7)
    ledger = PromptLedger()
    prompts = [f"q{i}" for i in range(50)]
    step = 0
    for epoch in range(3):
        order = prompts[:]
        rng.shuffle(order)
        while order:
            step += rng.randint(1, 2)
            ledger.record(step, [(epoch, order.pop()) for _ in range(min(len(order), rng.randint(1, 7)))])
    state = orjson.loads(orjson.dumps(ledger.state_dict()))
    back = PromptLedger()
    back.load_state_dict(state)
    assert back.steps() == ledger.steps()
    assert all(back.trained(e) == set(prompts) for e in range(3))
    assert pickle.loads(pickle.dumps(back)).steps() == ledger.steps()
    with pytest.raises(LedgerError, match="prompt 'q0' of epoch 2 was already trained"):
        back.record(step + 1, [(2, "q0")])
    with pytest.raises(LedgerError, match=f"step {step} is already recorded"):
        back.record(step, [(3, "q0")])


@pytest.mark.parametrize("state", [
    {"steps": []},
    {"format": 1, "steps": {}},
    {"format": 1, "steps": [[1]]},
    {"format": 1, "steps": [[1, [[0, "a"]]], [2, [[0, "a"]]]]},
    {"format": 1, "steps": [[2, []], [1, []]]},
])
def test_a_malformed_or_inconsistent_state_is_refused_and_changes_nothing(state: dict[str, object]) -> None:
    ledger = PromptLedger()
    ledger.record(1, [(0, "kept")])
    with pytest.raises(LedgerError):
        ledger.load_state_dict(state)
    assert ledger.steps() == [LedgerStep(1, ((0, "kept"),))]
