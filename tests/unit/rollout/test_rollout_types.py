"""SamplingParams, result parsing and the continuation budget (pure, no network)."""

from __future__ import annotations

import dataclasses
import json
import pickle
import re

import pytest

from agentrl.rollout import (
    FinishKind,
    PromptTooLongError,
    ProtocolError,
    SamplingParams,
    continuation_budget,
    parse_generate_response,
)

# The keys SGLang 0.5.23 accepts inside sampling_params (from its 400 "expected one of ..." message).
SGLANG_SAMPLING_KEYS = {
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "json_schema", "regex",
    "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
    "no_stop_trim", "custom_params", "stream_interval", "logit_bias", "sampling_seed",
}


def test_defaults_are_the_rl_settings() -> None:
    payload = SamplingParams().to_payload()
    assert payload["no_stop_trim"] is True
    assert payload["skip_special_tokens"] is False
    assert payload["spaces_between_special_tokens"] is False
    assert "stop" not in payload and "top_k" not in payload  # unset fields are left to the engine


def test_every_field_is_an_sglang_key() -> None:
    full = SamplingParams(max_new_tokens=3, temperature=0.5, top_p=0.9, top_k=20, min_p=0.1, min_new_tokens=1,
                          stop=("x",), stop_token_ids=(2,), ignore_eos=True, repetition_penalty=1.1,
                          frequency_penalty=0.1, presence_penalty=0.1, sampling_seed=7, regex="[0-9]+",
                          logit_bias={3: -1.5})
    assert set(full.to_payload()) <= SGLANG_SAMPLING_KEYS
    assert {f.name for f in dataclasses.fields(SamplingParams)} <= SGLANG_SAMPLING_KEYS


def test_constrained_decoding_and_logit_bias_pass_through_typed() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    params = SamplingParams(json_schema=schema, logit_bias={7: -100, 9: 2.5})
    payload = params.to_payload()
    assert json.loads(payload["json_schema"]) == schema and params.json_schema == payload["json_schema"]
    assert payload["logit_bias"] == {"7": -100.0, "9": 2.5}  # SGLang reads string keys
    assert SamplingParams(regex=r"\d+").to_payload()["regex"] == r"\d+"
    assert SamplingParams(ebnf='root ::= "yes" | "no"').to_payload()["ebnf"] == 'root ::= "yes" | "no"'
    assert pickle.loads(pickle.dumps(params)) == params and hash(params) == hash(params.replace())
    for bad, needle in [
        ({"regex": "a", "ebnf": "b"}, "regex and ebnf are all set; expected at most one"),
        ({"json_schema": "[1, 2]"}, "json_schema='[1, 2]': expected a JSON schema object"),
        ({"json_schema": "{not json"}, "expected a JSON schema object"),
        ({"regex": ""}, "regex='': expected None or a non-empty string"),
        ({"logit_bias": {"7": 1.0}}, "logit_bias: key '7': expected a token id"),
        ({"logit_bias": {7: float("nan")}}, "logit_bias[7]=nan: expected a finite number"),
        ({"logit_bias": [(7, 1.0)]}, "expected a mapping of token id to bias"),
    ]:
        with pytest.raises(ValueError, match=re.escape(needle)):
            SamplingParams(**bad)  # type: ignore[arg-type]


def test_immutable_and_replace_validates() -> None:
    params = SamplingParams(stop_token_ids=[2, 3])  # type: ignore[arg-type]
    assert params.stop_token_ids == (2, 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.max_new_tokens = 5  # type: ignore[misc]
    assert params.replace(max_new_tokens=5).max_new_tokens == 5
    assert params.max_new_tokens == 128
    with pytest.raises(ValueError, match=r"max_new_tokens=-1"):
        params.replace(max_new_tokens=-1)
    assert pickle.loads(pickle.dumps(params)) == params


@pytest.mark.parametrize(("field", "value", "needle"), [
    ("temperature", -0.1, "temperature=-0.1"),
    ("top_p", 0.0, "top_p=0.0"),
    ("top_k", 0, "top_k=0"),
    ("stop", "abc", "stop='abc'"),
    ("stop_token_ids", (-1,), "stop_token_ids=(-1,)"),
])
def test_bad_values_name_field_and_value(field: str, value: object, needle: str) -> None:
    with pytest.raises(ValueError) as info:
        SamplingParams(**{field: value})  # type: ignore[arg-type]
    assert needle in str(info.value) and "expected" in str(info.value)


def test_continuation_budget() -> None:
    # fresh turn: the whole budget, capped by the context
    assert continuation_budget(100, 0, prompt_tokens=50, context_length=1000) == 100
    assert continuation_budget(100, 0, prompt_tokens=950, context_length=1000) == 50
    # resumed after an abort that produced 30 tokens: the prompt grew by those 30
    assert continuation_budget(100, 30, prompt_tokens=80, context_length=1000) == 70
    assert continuation_budget(100, 30, prompt_tokens=960, context_length=1000) == 40
    # nothing left: truncated, no request
    assert continuation_budget(100, 100, prompt_tokens=150, context_length=1000) == 0
    assert continuation_budget(100, 10, prompt_tokens=1000, context_length=1000) == 0
    assert continuation_budget(100, 10, prompt_tokens=1200, context_length=1000) == 0
    with pytest.raises(ValueError, match="generated=-1"):
        continuation_budget(100, -1, 10, 100)


def _body(**meta: object) -> dict[str, object]:
    base: dict[str, object] = {
        "id": "r", "prompt_tokens": 4, "completion_tokens": 2, "cached_tokens": 3, "weight_version": "7",
        "finish_reason": {"type": "stop", "matched": 2},
        "output_token_logprobs": [[-0.5, 9, None], [-0.25, 2, None]],
    }
    base.update(meta)
    return {"text": "ab", "output_ids": [9, 2], "meta_info": base}


def test_parse_keeps_everything_as_returned() -> None:
    res = parse_generate_response(_body(), "r")
    assert res.output_ids == (9, 2) and res.output_logprobs == (-0.5, -0.25)
    assert res.finish_reason.kind is FinishKind.STOP and res.finish_reason.matched == 2
    assert (res.weight_version, res.cached_tokens, res.prompt_tokens) == ("7", 3, 4)
    assert res.weight_version_spans == ()
    spans = parse_generate_response(_body(weight_versions=[{"version": "6", "start": 0, "end": 1},
                                                          {"version": "7", "start": 1, "end": 2}]), "r")
    assert spans.weight_version_spans == (("6", 0, 1), ("7", 1, 2))
    assert not res.aborted
    assert pickle.loads(pickle.dumps(res)) == res


def test_parse_abort_and_length() -> None:
    aborted = parse_generate_response(_body(finish_reason={"type": "abort", "message": "Aborted"}), "r")
    assert aborted.aborted and aborted.finish_reason.message == "Aborted"
    length = parse_generate_response(_body(finish_reason={"type": "length", "length": 2}), "r")
    assert length.finish_reason.kind is FinishKind.LENGTH


@pytest.mark.parametrize(("change", "needle"), [
    ({"output_token_logprobs": [[-0.5, 9, None], [-0.25, 3, None]]}, "differ"),
    ({"completion_tokens": 5}, "completion_tokens=5"),
    ({"finish_reason": {"type": "weird"}}, "'weird'"),
    ({"finish_reason": None}, "finish_reason"),
])
def test_parse_rejects_inconsistent_answers(change: dict[str, object], needle: str) -> None:
    with pytest.raises(ProtocolError, match=needle):
        parse_generate_response(_body(**change), "r")


def test_errors_survive_pickling() -> None:
    err = PromptTooLongError(400, "too long", "http://x/generate")
    again = pickle.loads(pickle.dumps(err))
    assert isinstance(again, PromptTooLongError) and again.status == 400 and "too long" in str(again)


def _scored(ids: tuple[int, ...]) -> object:
    from agentrl.rollout import FinishReason, GenerateResult

    return GenerateResult(rid="r", output_ids=(), output_logprobs=(), finish_reason=FinishReason.from_meta({"type": "length"}),
                          weight_version="0", prompt_tokens=4, cached_tokens=0, completion_tokens=0,
                          input_logprobs=(None,) * len(ids), input_ids_scored=ids)


def test_the_scored_ids_check_allows_sglangs_clipped_last_rows_and_finds_a_shift() -> None:
    sent = [5, 1791, 7, 9]
    assert _scored((5, 1791, 7, 9)).first_misscored(sent) is None  # type: ignore[attr-defined]
    # SGLang reports an id >= vocab_size - 1 (here the last row, 1791) as 0
    assert _scored((5, 0, 7, 9)).first_misscored(sent) is None  # type: ignore[attr-defined]
    assert _scored(()).first_misscored(sent) is None  # type: ignore[attr-defined]
    assert _scored((1791, 7, 9, 4)).first_misscored(sent) == 0  # type: ignore[attr-defined]
    assert _scored((5, 0, 8, 9)).first_misscored(sent) == 2  # type: ignore[attr-defined]
    assert _scored((5, 1791, 7)).first_misscored(sent) == 3  # type: ignore[attr-defined]
