"""``agentrl sft``: a real run of the tiny model in a subprocess (the loss falls, the folder loads with
transformers and fits the data better than the model it started from), and one-line errors for mistakes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.environments import make_arithmetic_rows
from agentrl.sft import arithmetic_conversations
from agentrl.testing import build_tiny_model

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
runner = CliRunner()


def _agentrl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    command = Path(sys.executable).parent / "agentrl"  # the installed console script
    return subprocess.run([str(command), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder laid out as the example config expects: models/qwen3-tiny and data/sft_arithmetic.jsonl."""
    root = tmp_path_factory.mktemp("sft")
    build_tiny_model(root / "models" / "qwen3-tiny")
    (root / "data").mkdir()
    rows = arithmetic_conversations(make_arithmetic_rows(48, seed=1000))
    (root / "data" / "sft_arithmetic.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def _mean_nll(model_dir: Path, data: Path) -> float:
    """Mean NLL of the assistant tokens of ``data`` under the model in ``model_dir`` (loaded with transformers)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl.chat import ChatTemplate
    from agentrl.sft import TranscriptBuilder, load_sft_sequences

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    builder = TranscriptBuilder(ChatTemplate.from_name("qwen3", tokenizer=tok))
    total, count = 0.0, 0
    with torch.no_grad():
        for seqs in load_sft_sequences(data, builder)[:16]:
            for seq in seqs:
                logits = model(input_ids=torch.tensor(seq.tokens)[None]).logits[0, :-1]
                nll = torch.nn.functional.cross_entropy(logits, torch.tensor(seq.tokens[1:]), reduction="none")
                mask = torch.tensor(seq.loss_mask[1:], dtype=torch.float32)
                total += float((nll * mask).sum())
                count += int(mask.sum())
    return total / count


@pytest.mark.slow
def test_sft_trains_the_tiny_model_and_writes_a_loadable_folder(workdir: Path) -> None:
    out = workdir / "models" / "qwen3-tiny-sft"
    result = _agentrl("sft", str(EXAMPLES / "sft_tiny_arithmetic.toml"), "train.steps=8", "train.batch_size=8",
                      "train.log_every=1", "train.optimizer.warmup_steps=1", cwd=workdir)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    lines = [json.loads(line) for line in (out / "sft_metrics.jsonl").read_text().splitlines()]
    assert [int(m["step"]) for m in lines] == list(range(1, 9))
    assert lines[-1]["loss"] < lines[0]["loss"] - 0.5, [m["loss"] for m in lines]
    assert all(m["trained_tokens"] > 0 for m in lines)
    summary = json.loads((out / "sft_summary.json").read_text())
    assert summary["steps"] == 8 and summary["conversations"] == 48
    assert json.loads((out / "sft_config.json").read_text())["train"]["steps"] == 8
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (out / name).is_file(), name
    assert f"model written to {Path('models') / 'qwen3-tiny-sft'}" in result.stdout
    data = workdir / "data" / "sft_arithmetic.jsonl"
    assert _mean_nll(out, data) < _mean_nll(workdir / "models" / "qwen3-tiny", data) - 0.5


@pytest.mark.slow
def test_sft_with_lora_trains_the_adapter_alone_and_writes_merged_and_adapter_folders(workdir: Path,
                                                                                      tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    out = tmp_path / "sft-lora"
    result = _agentrl("sft", str(EXAMPLES / "sft_tiny_arithmetic.toml"), f"output={out}", "train.steps=8",
                      "train.batch_size=8", "train.log_every=1", "train.optimizer.warmup_steps=1",
                      "train.optimizer.lr=1e-2", "train.lora.rank=8", cwd=workdir)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"the adapter in {out / 'adapter'}" in result.stdout
    losses = [json.loads(line)["loss"] for line in (out / "sft_metrics.jsonl").read_text().splitlines()]
    assert losses[-1] < losses[0] - 0.3, losses
    config = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == 8 and config["peft_type"] == "LORA"
    adapter = load_file(out / "adapter" / "adapter_model.safetensors")
    assert adapter and all(".lora_A." in k or ".lora_B." in k for k in adapter)
    assert any(".lora_B." in k and v.abs().max() > 0 for k, v in adapter.items())
    # the merged folder differs from the base only in the adapted projections
    base = load_file(workdir / "models" / "qwen3-tiny" / "model.safetensors")
    merged = load_file(out / "model.safetensors")
    changed = {k for k in base if not torch.equal(base[k], merged[k])}
    assert changed and all(k.endswith("proj.weight") for k in changed), sorted(changed)
    assert {k for k in base if "embed" in k or "norm" in k}.isdisjoint(changed)
    data = workdir / "data" / "sft_arithmetic.jsonl"
    assert _mean_nll(out, data) < _mean_nll(workdir / "models" / "qwen3-tiny", data) - 0.3


def test_a_mistake_is_one_line_exit_2_without_traceback(workdir: Path) -> None:
    result = _agentrl("sft", str(EXAMPLES / "sft_tiny_arithmetic.toml"), "train.stpes=3", cwd=workdir)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: train.stpes: unknown key 'stpes' in section [train]; did you mean 'steps'")
    assert line.endswith("(valid keys: autocast, batch_size, device, dtype, epochs, log_every, lora, "
                         "max_tokens_per_micro_batch, optimizer, packing, seed, shared_prefix, shared_prefix_min_tokens, "
                         "steps, threads)")


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _invoke(*args: str) -> Any:
    return runner.invoke(app, ["sft", *args], env={"COLUMNS": "200"})


BASE = 'output = "out"\n[model]\npath = "models/qwen3-tiny"\n[data]\npath = "data/sft_arithmetic.jsonl"\n'


@pytest.mark.parametrize(("text", "overrides", "message"), [
    (BASE, ["train.optimizer.lr=-1"], "train.optimizer.lr = -1.0 (set by override): expected a value > 0.0"),
    (BASE + "[train]\nbatch_size = 0\n", [], "train.batch_size = 0 (set by file): expected a value >= 1"),
    (BASE, ["train.batch_size=many"], "train.batch_size=many: expected an int"),
    (BASE, ["train.packing=random"], "train.packing=random: expected one of 'first_fit_decreasing', "
                                     "'best_fit_decreasing'"),
    (BASE.replace('output = "out"\n', ""), [], "missing required key 'output'"),
    (BASE, ["train.steps"], "override 'train.steps': expected KEY=VALUE with a dotted key"),
    (BASE, ["output.path=x"], "output.path: 'output' is a string, it has no key 'path'"),
    (BASE, ["modle.path=x"], "modle.path: unknown key 'modle' in the top level; did you mean 'model'?"),
    (BASE + "[train\nsteps = 3\n", [], "TOML syntax error: Expected ']' at the end of a table declaration "
                                       "(at line 6, column 7)"),
])
def test_config_mistakes_name_the_key_and_what_is_accepted(tmp_path: Path, text: str, overrides: list[str],
                                                           message: str) -> None:
    result = _invoke(str(_write(tmp_path / "sft.toml", text)), *overrides)
    assert result.exit_code == 2, result.output
    assert message in result.output, result.output


def test_yaml_syntax_errors_give_the_line(tmp_path: Path) -> None:
    result = _invoke(str(_write(tmp_path / "sft.yaml", "output: out\nmodel:\n  path: [unclosed\n")))
    assert result.exit_code == 2
    assert "YAML syntax error at line" in result.output


def test_data_and_model_mistakes_are_reported_before_training(workdir: Path, tmp_path: Path) -> None:
    config = _write(tmp_path / "sft.toml", BASE.replace("models/qwen3-tiny", str(workdir / "models" / "qwen3-tiny"))
                    .replace('output = "out"', f'output = "{tmp_path / "out"}"'))
    missing = _invoke(str(config), f"data.path={tmp_path / 'nope.jsonl'}")
    assert missing.exit_code == 2 and "nope.jsonl'" in missing.output and "cannot read it" in missing.output
    bad = _write(tmp_path / "bad.jsonl", json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    result = _invoke(str(config), f"data.path={bad}")
    assert result.exit_code == 2 and f"{bad}:1: messages: no assistant message" in result.output
    no_model = _invoke(str(config), f"model.path={tmp_path}")
    assert no_model.exit_code == 2 and "model.path" in no_model.output and "config.json" in no_model.output
    assert not (tmp_path / "out").exists()  # nothing was written


def test_print_config_shows_the_resolved_values_and_their_sources(tmp_path: Path) -> None:
    result = _invoke(str(_write(tmp_path / "sft.toml", BASE)), "train.steps=7", "--print-config")
    assert result.exit_code == 0, result.output
    rows = {line.split(" = ")[0]: line for line in result.output.splitlines() if " = " in line}
    assert rows["train.steps"].split("#")[0].strip().endswith("= 7") and rows["train.steps"].endswith("# override")
    assert rows["output"].endswith("# file") and '"out"' in rows["output"]
    assert rows["train.optimizer.lr"].endswith("# default") and "0.0001" in rows["train.optimizer.lr"]
