"""Config files and overrides (``agentrl.cli.config_files``): parsing, typing by the schema, provenance."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentrl.cli.config_files import (
    ConfigError,
    apply_overrides,
    load_config_file,
    load_run_config,
    parse_override,
)
from agentrl.runner import RunConfig

BASE = """
[model]
path = "m"
[data.train]
path = "t.jsonl"
[environment]
name = "toy_arithmetic"
[train]
steps = 3
"""


def write(tmp_path: Path, text: str, name: str = "run.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_toml_and_yaml_give_the_same_config(tmp_path: Path) -> None:
    toml = write(tmp_path, BASE + "[rollout.scheduler]\ngroup_size = 4\n")
    yaml = write(tmp_path, "model: {path: m}\ndata:\n  train: {path: t.jsonl}\nenvironment: {name: toy_arithmetic}\n"
                           "train: {steps: 3}\nrollout:\n  scheduler:\n    group_size: 4\n", "run.yaml")
    a, b = load_run_config(toml).config, load_run_config(yaml).config
    assert a == b and a.rollout.scheduler.group_size == 4 and a.hash() == b.hash()


@pytest.mark.parametrize(("override", "path", "expected"), [
    ("train.steps=7", ("train", "steps"), 7),
    ("train.steps=none", ("train", "steps"), None),
    ("rollout.sampling.temperature=0.7", ("rollout", "sampling", "temperature"), 0.7),
    ("train.fused_lm_head=true", ("train", "fused_lm_head"), True),
    ("train.verify_packing=OFF", ("train", "verify_packing"), False),
    ("algorithm.estimator=GSPO", ("algorithm", "estimator"), "gspo"),
    ("train.optimizer.betas=0.9,0.95", ("train", "optimizer", "betas"), [0.9, 0.95]),
    ("rollout.sampling.stop=[\"</a>\", \"</b>\"]", ("rollout", "sampling", "stop"), ["</a>", "</b>"]),
    ("model.path=/x=y", ("model", "path"), "/x=y"),
    ("environment.options.digits=4", ("environment", "options", "digits"), 4),
    ("environment.options.mode=fast", ("environment", "options", "mode"), "fast"),
    ("rollout.engines.env={OMP = \"1\"}", ("rollout", "engines", "env"), {"OMP": "1"}),
])
def test_overrides_are_typed_by_the_schema(override: str, path: tuple[str, ...], expected: Any) -> None:
    data, keys = apply_overrides({"train": {"steps": 3}}, [override])
    node: Any = data
    for part in path:
        node = node[part]
    assert node == expected and type(node) is type(expected)
    assert keys == [override.partition("=")[0]]


def test_a_number_in_a_key_indexes_a_list() -> None:
    data, _ = apply_overrides({"data": {"eval": [{"path": "a"}, {"path": "b"}]}}, ["data.eval.1.name=held"])
    assert data["data"]["eval"] == [{"path": "a"}, {"path": "b", "name": "held"}]
    with pytest.raises(ConfigError, match=r"data\.eval has 2 entries, no entry 5"):
        apply_overrides({"data": {"eval": [{"path": "a"}, {"path": "b"}]}}, ["data.eval.5.name=x"])


@pytest.mark.parametrize(("override", "message"), [
    ("train.stpes=3", r"train\.stpes: unknown key 'stpes' in section \[train\]; did you mean 'steps'"),
    ("rollout.sampler.temperature=1", r"unknown key 'sampler' in section \[rollout\]; did you mean 'sampling'"),
    ("trian.steps=1", r"unknown key 'trian' in the top level; did you mean 'train'"),
    ("steps=2", r"^steps: unknown key 'steps' in the top level; did you mean 'train\.steps' or 'warmup\.steps'\? "
                r"\(valid keys: algorithm,"),
    ("lr=0.1", r"unknown key 'lr' in the top level; did you mean 'train\.optimizer\.lr' or 'warmup\.optimizer\.lr'"),
    ("train.lr=0.1", r"unknown key 'lr' in section \[train\]; did you mean 'train\.optimizer\.lr'\?"),
    ("temperature=0.5", r"unknown key 'temperature' in the top level; did you mean 'rollout\.sampling\.temperature'\?"),
    ("train.steps=three", r"train\.steps=three: expected an int or none"),
    ("train.fused_lm_head=maybe", r"expected true or false"),
    ("cluster.accelerator=tpu", r"cluster\.accelerator=tpu: expected one of 'cpu', 'gpu', 'npu'"),
    ("train.steps.max=1", r"'train\.steps' is an int or none, it has no key 'max'"),
    ("train..steps=1", r"empty key segment"),
    ("train.steps", r"override 'train\.steps': expected KEY=VALUE"),
    ("=3", r"expected KEY=VALUE"),
])
def test_bad_overrides_name_the_key_value_and_what_is_accepted(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        apply_overrides({}, [override])


def test_a_section_key_at_the_top_of_a_file_is_pointed_to_its_section(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"run\.toml: steps: unknown key 'steps' in the top level; did you mean "
                                          r"'train\.steps' or 'warmup\.steps'\?"):
        load_run_config(write(tmp_path, "steps = 2\n" + BASE))


def test_parse_override_keeps_the_value_verbatim() -> None:
    assert parse_override("a.b= x = y ") == ("a.b", " x = y ")


def test_provenance_default_file_override(tmp_path: Path) -> None:
    resolved = load_run_config(write(tmp_path, BASE), ["rollout.sampling.temperature=0.5"])
    assert resolved.source("train.steps") == "file"
    assert resolved.source("model.path") == "file"
    assert resolved.source("rollout.sampling.temperature") == "override"
    assert resolved.source("rollout.sampling.top_p") == "default"
    lines = resolved.format().splitlines()
    assert lines[0].startswith("# resolved config from") and resolved.config.hash()[:12] in lines[0]
    by_key = {line.split(" = ")[0]: line for line in lines[1:]}
    assert by_key["train.steps"].endswith("# file") and " = 3 " in by_key["train.steps"]
    assert by_key["rollout.sampling.temperature"].endswith("# override")
    assert by_key["train.optimizer.lr"].endswith("# default")
    assert len(by_key) == len(lines) - 1  # one line per leaf value, none repeated


def test_validation_errors_are_gathered_with_their_source(tmp_path: Path) -> None:
    path = write(tmp_path, BASE + "[rollout.scheduler]\ngroup_size = 0\n[algorithm]\nestimator = 'gspo'\n"
                                  "policy_loss = 'ppo'\n")
    with pytest.raises(ConfigError) as info:
        load_run_config(path, ["train.optimizer.lr=-1"])
    text = str(info.value)
    assert text.startswith(f"{path}: 3 problems:")
    assert "rollout.scheduler.group_size = 0 (set by file): expected a value >= 1" in text
    assert "train.optimizer.lr = -1.0 (set by override): expected a value > 0" in text
    assert "policy_loss='ppo' does not fit estimator='gspo'" in text


def test_missing_required_keys_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_run_config(write(tmp_path, "[model]\npath = 'm'\n"))
    assert "missing required key 'data'" in str(info.value)
    assert "missing required key 'environment'" in str(info.value)
    with pytest.raises(ConfigError, match=r"missing required key 'data\.train\.path' \(section \[data\.train\]\)"):
        load_run_config(write(tmp_path, BASE.replace('path = "t.jsonl"', 'seed = 1')))


def test_syntax_errors_give_line_and_column(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"run\.toml: TOML syntax error: .*\(at line 4, column 9\)"):
        load_config_file(write(tmp_path, "[model]\npath = 'm'\n\nsteps = = 3\n"))
    with pytest.raises(ConfigError, match=r"run\.yaml: YAML syntax error at line 4, column 1: while parsing a flow "
                                          r"sequence \(started at line 3, column 10\) expected ',' or '\]'"):
        load_config_file(write(tmp_path, "model:\n  path: m\n  dtype: [float32\n", "run.yaml"))


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such config file"):
        load_config_file(tmp_path / "absent.toml")
    with pytest.raises(ConfigError, match=r"unknown config file type '\.ini'; expected \.toml, \.yaml, \.yml or \.json"):
        load_config_file(write(tmp_path, "{}", "run.ini"))
    assert load_config_file(write(tmp_path, '{"train": {"steps": 2}}', "run.json")) == {"train": {"steps": 2}}
    with pytest.raises(ConfigError, match=r"run.json: JSON syntax error at line 2, column 1"):
        load_config_file(write(tmp_path, '{"train":\n', "run.json"))
    with pytest.raises(ConfigError, match="expected a table of sections at the top level, got list"):
        load_config_file(write(tmp_path, "- a\n- b\n", "run.yaml"))
    assert load_config_file(write(tmp_path, "", "empty.yaml")) == {}
    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes('[train]\nsteps = 2\nname = "café"\n'.encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin1\.toml: not valid UTF-8 at line 3, column 12 \(byte b'\\xe9': "
                                          r"invalid continuation byte\); expected a UTF-8 text file"):
        load_config_file(latin1)


def test_resolved_config_round_trips() -> None:
    data, _ = apply_overrides({"model": {"path": "m"}, "data": {"train": {"path": "t"}},
                               "environment": {"name": "e"}, "train": {"steps": 2}}, ["train.seed=5"])
    assert RunConfig.from_dict(data).train.seed == 5
