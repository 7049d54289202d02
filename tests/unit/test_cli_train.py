"""``agentrl train``: user mistakes (one message each, exit status 2, no traceback), ``--dry-run`` of
every example config, ``--print-config``, and the ``--resume`` checks. Nothing here starts an engine
or Ray: every case stops in the pre-flight. Most cases run the command in-process (typer's runner, on
real files); a few run the installed ``agentrl`` script in a subprocess."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.environments import make_arithmetic_rows
from agentrl.testing import build_tiny_model, build_tiny_moe_model

ROOT = Path(__file__).resolve().parents[2]
# every training config under examples/ (``sft_*.toml`` are `agentrl sft` configs, run by the SFT tests;
# the demo's config reads the files examples/demo_prepare.py writes, and has its own test; so does the
# distillation config, tests/unit/test_example_distill.py; the long-horizon config reads what
# examples/long_horizon_prepare.py writes, tested below)
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.toml")
                  if not p.name.startswith(("sft_", "demo_", "distill_", "long_horizon_")))
runner = CliRunner()


@pytest.fixture(scope="module")
def tiny() -> str:
    return str(build_tiny_model())


@pytest.fixture(scope="module")
def tiny_moe() -> str:
    """The tiny Qwen3-MoE (8 experts, top-2): what the MoE recipes dry-run on."""
    return str(build_tiny_moe_model())


def _model_for(example: Path, tiny: str, tiny_moe: str) -> str:
    """The tiny model a recipe dry-runs on: the MoE one for a recipe with expert parallelism."""
    return tiny_moe if "expert_parallel_size" in example.read_text() else tiny


@pytest.fixture
def run_files(tmp_path: Path, tiny: str) -> dict[str, Path]:
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in make_arithmetic_rows(12, seed=0)))
    config = tmp_path / "run.toml"
    config.write_text(f"""
[model]
path = "{tiny}"
dtype = "float32"
[data.train]
path = "{data}"
[environment]
name = "toy_arithmetic"
[rollout.engines]
max_total_tokens = 4096
[rollout.scheduler]
groups_per_step = 2
group_size = 2
[train]
steps = 2
[logging]
run_dir = "{tmp_path / 'run'}"
""")
    return {"config": config, "data": data, "dir": tmp_path}


def invoke(args: list[str]) -> Any:
    result = runner.invoke(app, ["train", *args], env={"COLUMNS": "200"})
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), \
        f"traceback instead of a message: {result.exception!r}"
    return result


def edit(path: Path, old: str, new: str) -> Path:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    return path


def _bad_row(f: dict[str, Path]) -> list[str]:
    with f["data"].open("a") as out:
        out.write(json.dumps({"question": "What is 2 * 2?", "answer": "four"}) + "\n")
    lines = f["data"].read_text().splitlines()
    f["data"].write_text("\n".join([lines[-1], *lines[:-1]]) + "\n")  # the bad row first
    return [str(f["config"]), "--dry-run"]


def _not_a_model(f: dict[str, Path]) -> list[str]:
    folder = f["dir"] / "not_a_model"
    folder.mkdir()
    (folder / "config.json").write_text("{ not json")
    return [str(f["config"]), f"model.path={folder}", "--dry-run"]


def _not_a_run(f: dict[str, Path]) -> list[str]:
    folder = f["dir"] / "somewhere"
    folder.mkdir()
    return [str(folder), "--resume"]


CASES: list[tuple[str, Any, str]] = [
    ("unknown key", lambda f: [str(edit(f["config"], "steps = 2", "stepz = 2"))],
     r"train\.stepz: unknown key 'stepz' in section \[train\]; did you mean 'steps'"),
    ("wrong type", lambda f: [str(edit(f["config"], "steps = 2", "steps = 'two'"))],
     r"train\.steps = \"two\" \(set by file\): expected an int"),
    ("out of range", lambda f: [str(f["config"]), "rollout.scheduler.group_size=0"],
     r"rollout\.scheduler\.group_size = 0 \(set by override\): expected a value >= 1"),
    ("unknown environment", lambda f: [str(f["config"]), "environment.name=toy_arithmetc", "--dry-run"],
     r"environment\.name: unknown environment 'toy_arithmetc'; did you mean 'toy_arithmetic'\?; expected one of: "
     r"long_key \(built-in\), long_recall \(built-in\), retool_math \(built-in\), toy_arithmetic \(built-in\)"),
    ("missing data file", lambda f: [str(f["config"]), "data.train.path=nowhere.jsonl"],
     r"data\.train\.path='nowhere\.jsonl': no such file or folder"),
    ("bad data row", _bad_row,
     r"data\.train: bad row .*train\.jsonl:1: field 'answer': String should match pattern .*'four'.* against "
     r"ArithmeticTask"),
    ("estimator/loss mismatch", lambda f: [str(f["config"]), "algorithm.estimator=gspo", "algorithm.policy_loss=ppo"],
     r"policy_loss='ppo' does not fit estimator='gspo': expected 'gspo'"),
    ("impossible placement", lambda f: [str(f["config"]), "cluster.accelerator=gpu", "cluster.num_accelerators=1",
                                        "cluster.placement=disaggregated"],
     r"rollout\.engines\.count=1 engines × 1 \+ 1 for the trainer need 2 accelerators with "
     r"placement='disaggregated', but cluster\.num_accelerators=1"),
    ("too many CPU engines", lambda f: [str(f["config"]), f"rollout.engines.count={len(os.sched_getaffinity(0))}"],
     r"rollout\.engines\.count=\d+ CPU engines need a core each and the trainer one more"),
    ("bad override syntax", lambda f: [str(f["config"]), "train.steps:3"],
     r"override 'train\.steps:3': expected KEY=VALUE"),
    ("bad override value", lambda f: [str(f["config"]), "algorithm.estimator=grpoo"],
     r"algorithm\.estimator=grpoo: expected one of 'grpo', .*; did you mean 'grpo'"),
    ("TOML syntax error", lambda f: [str(edit(f["config"], "steps = 2", "steps = [2"))],
     r"run\.toml: TOML syntax error: .*\(at line \d+, column \d+\)"),
    ("YAML syntax error", lambda f: [str(_write(f["dir"] / "run.yaml", "model:\n  path: [m\n"))],
     r"run\.yaml: YAML syntax error at line 3, column 1"),
    ("unreadable model folder", _not_a_model,
     r"model\.path='.*not_a_model': cannot read config\.json \(JSONDecodeError"),
    ("missing model folder", lambda f: [str(f["config"]), "model.path=models/none"],
     r"model\.path='models/none': no such folder; expected a Hugging Face model folder"),
    ("resume folder not a run", _not_a_run, r"somewhere: not a run folder \(no config\.json\)"),
    ("resume without a run", lambda f: [str(f["config"]), "--resume"],
     r"--resume: run folder '.*run' does not exist"),
    ("unknown reward", lambda f: [str(f["config"]), "--reward", "nope", "--dry-run"],
     r"--reward: unknown reward 'nope'; expected one of: none, or 'module:attr' for your own code"),
    ("module:attr that does not import", lambda f: [str(f["config"]), "environment.name=no_such_mod:Env"],
     r"environment\.name: environment 'no_such_mod:Env': cannot import module 'no_such_mod'"),
]


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize(("args", "message"), [(c[1], c[2]) for c in CASES], ids=[c[0] for c in CASES])
def test_user_mistakes_are_one_message_and_exit_2(run_files: dict[str, Path], args: Any, message: str) -> None:
    result = invoke(args(run_files))
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: "), result.stderr
    assert re.search(message, result.stderr), result.stderr
    assert "Traceback" not in result.output
    assert not (run_files["dir"] / "run").exists()  # nothing was started or written


def test_dry_run_prints_the_plan_and_starts_nothing(run_files: dict[str, Path], tiny: str) -> None:
    result = invoke([str(run_files["config"]), "train.steps=5", "--dry-run"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert f"model         {tiny} (qwen3, 2 layers, serving float32), template qwen3" in out
    assert "environment   toy_arithmetic -> ToyArithmeticEnv" in out
    assert "steps         5\n" in out
    assert "per step      2 prompts x 2 samples = 4 episodes" in out
    assert "data          12 training rows" in out
    assert "algorithm     grpo, ppo loss, clip ±0.2, no KL loss" in out  # no upper clip given: symmetric
    assert out.rstrip().endswith("dry run: nothing started")
    assert not (run_files["dir"] / "run").exists()
    asymmetric = invoke([str(run_files["config"]), "algorithm.eps_clip_high=0.28", "--dry-run"])
    assert "algorithm     grpo, ppo loss, clip 0.2/0.28, no KL loss" in asymmetric.stdout, asymmetric.output


def test_a_key_of_a_section_given_at_the_top_level_is_pointed_to_its_section(run_files: dict[str, Path]) -> None:
    result = invoke([str(run_files["config"]), "steps=2", "--dry-run"])
    assert result.exit_code == 2
    assert "error: steps: unknown key 'steps' in the top level; did you mean 'train.steps' or 'warmup.steps'?" \
        in result.output


def test_print_config_shows_every_value_and_its_source(run_files: dict[str, Path]) -> None:
    result = invoke([str(run_files["config"]), "train.seed=9", "--print-config"])
    assert result.exit_code == 0, result.output
    lines = {line.split(" = ")[0]: line for line in result.stdout.splitlines()[1:]}
    assert lines["train.seed"].endswith("# override") and " = 9 " in lines["train.seed"]
    assert lines["train.steps"].endswith("# file")
    assert lines["rollout.router.policy"].endswith("# default")


# Recipes whose data is prepared by examples/prepare_dapo_math.py point at its output; CI dry-runs them
# on the small samples of the same layout that the repository ships.
PREPARED_DATA = {"data/retool/dapo_math_17k.jsonl": "examples/data/dapo_math_sample.jsonl",
                 "data/retool/aime_2024.jsonl": "examples/data/aime_sample.jsonl"}
GPU_RECIPES = {"retool_qwen3_4b_instruct_8gpu.toml": "qwen3", "retool_qwen3_5_8gpu.toml": "qwen3_5"}


def shipped_data(example: Path) -> list[str]:
    """Overrides pointing a recipe's prepared data files at the shipped samples."""
    from agentrl.cli._toml import loads

    data = loads(example.read_text())["data"]
    keys = [("data.train.path", data["train"]["path"])]
    keys += [(f"data.eval.{i}.path", ev["path"]) for i, ev in enumerate(data.get("eval", []))]
    return [f"{key}={PREPARED_DATA[path]}" for key, path in keys if path in PREPARED_DATA]


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_config_dry_runs(example: Path, tiny: str, tiny_moe: str,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Run from the repository root (the examples' paths are relative to it), on the tiny model (the
    tiny mixture of experts for a recipe with expert parallelism); a GPU recipe on a machine without
    GPUs reports what is missing and still passes."""
    monkeypatch.chdir(ROOT)
    model = _model_for(example, tiny, tiny_moe)
    result = invoke([str(example.relative_to(ROOT)), f"model.path={model}", *shipped_data(example), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "dry run: nothing started" in result.stdout
    if "accelerator = \"gpu\"" in example.read_text() and not _cuda():
        assert "missing on this machine: cluster.accelerator='gpu': no CUDA GPU is visible here" in result.stdout


def test_the_demo_config_dry_runs_on_what_its_prepare_script_writes(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``make demo``'s two steps, the second as a dry run: the prepare script builds the model and
    the data the config names (relative to the working directory), and every check passes."""
    monkeypatch.chdir(tmp_path)
    prep = subprocess.run([sys.executable, str(ROOT / "examples" / "demo_prepare.py"), "--warmup-rows", "64",
                           "--train-rows", "64"], capture_output=True, text=True, timeout=300)
    assert prep.returncode == 0, prep.stderr[-2000:]
    assert (tmp_path / "models" / "demo-tiny" / "config.json").is_file()
    assert json.loads((tmp_path / "models" / "demo-tiny" / "config.json").read_text())["num_hidden_layers"] == 4
    result = invoke([str(ROOT / "examples" / "demo_cpu.toml"), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "warm-up       1000 supervised steps x 32 of 64 conversations (data/demo/warmup.jsonl)" in result.stdout
    assert "held-out token accuracy >= 0.97 (data/demo/warmup_check.jsonl)" in result.stdout
    assert "per step      8 prompts x 8 samples = 64 episodes" in result.stdout
    held = [json.loads(line)["question"] for line in (tmp_path / "data/demo/held_out.jsonl").read_text().splitlines()]
    train = [json.loads(line)["question"] for line in (tmp_path / "data/demo/train.jsonl").read_text().splitlines()]
    warm = (tmp_path / "data/demo/warmup.jsonl").read_text()
    assert not set(held) & set(train) and not any(q in warm for q in held)  # the held-out questions stay unseen
    answers = [json.loads(line)["answer"] for line in (tmp_path / "data/demo/held_out.jsonl").read_text().splitlines()]
    assert len(answers) == 64 and all(len(a) == 6 for a in answers)  # the demo's task: six-digit products


def test_the_long_horizon_config_dry_runs_on_what_its_prepare_script_writes(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The long-horizon experiment's first and third steps (the warm-up's output replaced by the prepared
    model): the prepare script writes the model and the data the config names, and the dry run names the
    budgets and the summarize policy."""
    monkeypatch.chdir(tmp_path)
    prep = subprocess.run([sys.executable, str(ROOT / "examples" / "long_horizon_prepare.py"), "--warmup-rows", "2",
                           "--drill-rows", "4", "--copy-drills", "4", "--train-rows", "8", "--held-out-rows", "4"],
                          capture_output=True, text=True, timeout=300)
    assert prep.returncode == 0, prep.stderr[-2000:]
    result = invoke([str(ROOT / "examples" / "long_horizon_cpu.toml"), "model.path=models/long-tiny", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "budgets       max_turns 40, max_sampled_tokens 3000" in result.stdout
    assert "context       policy summarize, compacts when a request would pass 1100 tokens" in result.stdout
    assert "data          8 training rows (data/long_horizon/train.jsonl)" in result.stdout
    held = [json.loads(line) for line in (tmp_path / "data/long_horizon/held_out.jsonl").read_text().splitlines()]
    train = [json.loads(line) for line in (tmp_path / "data/long_horizon/train.jsonl").read_text().splitlines()]
    assert len(held) == 4 and not {json.dumps(r, sort_keys=True) for r in held} & {json.dumps(r, sort_keys=True)
                                                                                  for r in train}
    drills = [json.loads(line) for line in (tmp_path / "data/long_horizon/copy.jsonl").read_text().splitlines()]
    assert len(drills) == 4  # stage 1 of the warm-up: the reply copies the one key of the user message
    for drill in drills:
        user, reply = (m["content"] for m in drill["messages"])
        assert re.fullmatch(r"key \d", reply) and re.findall(r"key \d", user) == [reply]


@pytest.mark.parametrize("recipe", sorted(GPU_RECIPES))
def test_gpu_recipes_plan_the_8_gpu_retool_run(recipe: str, tiny: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ReTool recipes: 2 engines x TP 2 and a Megatron TP 2 x DP 2 trainer on 8 GPUs, 32 prompts x 8
    samples, ReTool's clip range and KL loss, AIME-style pass@k eval, the sandboxed ReTool environment
    and each recipe's template, validated against the shipped DAPO-style samples."""
    monkeypatch.chdir(ROOT)
    path = f"examples/{recipe}"
    result = invoke([path, f"model.path={tiny}", *shipped_data(ROOT / path), "--dry-run"])
    assert result.exit_code == 0, result.output
    lines = dict(re.split(r" {2,}", line, maxsplit=1) for line in result.stdout.splitlines()
                 if line and not line.startswith(("missing on this machine", "dry run")))
    assert lines["placement"] == ("disaggregated, gpu x8: 2 engine(s) x 2 (tp=2 dp=1), trainer x 4; "
                                  "mode one_step_off")
    assert lines["sandboxes"].startswith("local: in the rollout process")
    fleet = invoke([path, f"model.path={tiny}", *shipped_data(ROOT / path), "--dry-run", "sandbox.executor=ray",
                    "sandbox.executors_per_node=2", "sandbox.concurrency=16"])
    assert fleet.exit_code == 0, fleet.output
    planned = dict(re.split(r" {2,}", line, maxsplit=1) for line in fleet.stdout.splitlines()
                   if line and not line.startswith(("missing on this machine", "dry run", " ")))
    assert planned["sandboxes"] == ("ray: 2 executor(s) per node on nodes carrying Ray resource 'sandbox' (CPU-only "
                                    "ones first); 16 calls at once each, 64 waiting, 64 workspaces; admission deadline "
                                    "60 s; start-up 120 s x 3 tries")
    wrong = invoke([path, f"model.path={tiny}", *shipped_data(ROOT / path), "--dry-run", "sandbox.executors_per_node=0"])
    assert wrong.exit_code != 0 and "sandbox.executors_per_node" in wrong.output
    assert lines["trainer"] == "megatron, dp=2 tp=2 pp=1, bfloat16"
    assert lines["per step"] == "32 prompts x 8 samples = 256 episodes"
    assert lines["algorithm"] == "grpo, ppo loss, clip 0.2/0.28, KL loss k3 x 0.01 to the reference model, tis correction"
    assert lines["eval aime_2024"].startswith("4 prompts x 16 samples, pass@1,4,16, every 20 steps")
    assert lines["environment"] == "retool_math -> RetoolMathEnv"
    assert lines["model"].endswith(f"serving bfloat16), template {GPU_RECIPES[recipe]}")
    assert lines["data"] == "8 training rows (examples/data/dapo_math_sample.jsonl), first 8 valid"
    if not _cuda():
        assert "missing on this machine: cluster.accelerator='gpu': no CUDA GPU is visible here; expected 8" \
            in result.stdout


def test_tensor_parallel_sizes_must_split_the_models_heads(tiny: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny model has 4 attention heads and 2 KV heads: Megatron TP=4 cannot split the KV heads,
    an engine of TP=3 cannot split the attention heads; both found by the pre-flight, before any GPU."""
    monkeypatch.chdir(ROOT)
    path = "examples/retool_qwen3_4b_instruct_8gpu.toml"
    result = invoke([path, f"model.path={tiny}", *shipped_data(ROOT / path), "train.tensor_parallel_size=4",
                     "train.data_parallel_size=1", "rollout.engines.tp_size=3", "cluster.num_accelerators=10",
                     "--dry-run"])
    assert result.exit_code == 2
    assert "rollout.engines.tp_size=3: the model has num_attention_heads=4" in result.stderr
    assert "train.backend='megatron' with model.path=" in result.stderr
    assert "tensor_parallel_size=4: must divide the model's num_key_value_heads=2" in result.stderr


def test_qwen3_5_folder_on_megatron_is_refused_and_the_torch_fallback_dry_runs(
        tiny: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Qwen3.5-shaped folder (a vision-language config with the language model under text_config):
    the engines' head check reads text_config, the megatron backend refuses the architecture, and the
    torch-backend override the recipe documents passes."""
    import shutil

    folder = tmp_path / "qwen3_5"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(tiny) / name, folder / name)
    text = json.loads((Path(tiny) / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3_5", "text_config": text}))
    monkeypatch.chdir(ROOT)
    path = "examples/retool_qwen3_5_8gpu.toml"
    base = [path, f"model.path={folder}", *shipped_data(ROOT / path)]
    result = invoke([*base, "--dry-run"])
    assert result.exit_code == 2
    assert "model_type: expected 'qwen3' (dense Qwen3) or 'qwen3_moe' (Qwen3 mixture of experts), got 'qwen3_5'" \
        in result.stderr
    result = invoke([*base, "rollout.engines.tp_size=3", "cluster.num_accelerators=10", "train.backend=torch",
                     "train.tensor_parallel_size=1", "train.data_parallel_size=4", "--dry-run"])
    assert result.exit_code == 2 and "the model has num_attention_heads=4" in result.stderr
    result = invoke([*base, "train.backend=torch", "train.tensor_parallel_size=1", "train.data_parallel_size=4",
                     "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "trainer         torch, dp=4 tp=1 pp=1, bfloat16" in result.stdout
    # the memory planner does not model it, and says so rather than printing wrong figures
    assert "not planned: model_type='qwen3_5' nests its language model under text_config" in result.stdout


QWEN3_4B_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 2560, "intermediate_size": 9728, "max_position_embeddings": 40960, "model_type": "qwen3",
    "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_sliding_window": False,
    "vocab_size": 151936}


@pytest.fixture(scope="module")
def qwen3_4b(tiny: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A folder with Qwen3-4B's real config.json (and the tiny tokenizer): what the planner reads."""
    import shutil

    folder = tmp_path_factory.mktemp("qwen3-4b")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(tiny) / name, folder / name)
    (folder / "config.json").write_text(json.dumps(QWEN3_4B_CONFIG))
    return str(folder)


def _memory_lines(stdout: str) -> list[str]:
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("memory "))
    out = [lines[start]]
    for line in lines[start + 1:]:
        if not line.startswith(" "):
            break
        out.append(line.strip())
    return out


@pytest.mark.parametrize(("recipe", "trainer"), [
    ("retool_qwen3_4b_gpu.toml", "trainer rank (torch, bfloat16 + float32 master weights, FSDP over 4)"),
    ("retool_qwen3_4b_instruct_8gpu.toml",
     "trainer rank (megatron, bfloat16 + float32 master weights, distributed optimizer over 2)")])
def test_gpu_recipes_fit_the_memory_they_declare(recipe: str, trainer: str, qwen3_4b: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The real Qwen3-4B shape on each Qwen3 recipe's 80 GB GPUs: the plan prints the planner's table
    per device (weights, gradients, master weights, optimizer state, activations with and without
    checkpointing, the logits working set; the engines' KV cache in tokens) and the peak fits."""
    monkeypatch.chdir(ROOT)
    path = f"examples/{recipe}"
    result = invoke([path, f"model.path={qwen3_4b}", *shipped_data(ROOT / path), "--dry-run"])
    assert result.exit_code == 0, result.output
    table = _memory_lines(result.stdout)
    print("\n".join(table))
    assert table[1].startswith(trainer + ": weights ")
    assert "optimizer state" in table[1] and "master weights" in table[1]
    assert table[2].startswith("activations at 32768 tokens") and "checkpointing full; full 6.3, selective" in table[2]
    assert "logits working set" in table[2]
    peak = float(re.search(r"peak ~([\d.]+) GiB of 80.0 GiB", table[3]).group(1))  # type: ignore[union-attr]
    assert 25 < peak < 80 * 0.92
    assert re.match(r"engine rank \(tp=\d, bfloat16\): weights [\d.]+ GiB, KV cache [\d,]+ tokens at "
                    r"mem_fraction_static 0\.8", table[4])


@pytest.fixture(scope="module")
def qwen3_8b(tiny: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A folder with Qwen3-8B's real config.json (and the tiny tokenizer)."""
    import shutil

    folder = tmp_path_factory.mktemp("qwen3-8b")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(tiny) / name, folder / name)
    (folder / "config.json").write_text(json.dumps({**QWEN3_4B_CONFIG, "hidden_size": 4096, "intermediate_size": 12288,
                                                    "tie_word_embeddings": False}))
    return str(folder)


def test_the_lora_recipe_fits_qwen3_8b_on_one_node(qwen3_8b: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Qwen3-8B with a rank-64 adapter on every linear layer, 4 engines and 4 trainer ranks on one
    node of 80 GB GPUs: each trainer rank holds the whole frozen bf16 base (no FSDP: only the adapter
    trains), the adapter's gradients and Adam state are small, no reference copy is planned, the
    engines set aside their adapter slots before the KV cache; the peak fits. On 24 GB it does not,
    and the refusal says the frozen base is replicated."""
    monkeypatch.chdir(ROOT)
    path = "examples/retool_qwen3_8b_lora_gpu.toml"
    base = [path, f"model.path={qwen3_8b}", *shipped_data(ROOT / path)]
    result = invoke([*base, "--dry-run"])
    assert result.exit_code == 0, result.output
    lines = dict(re.split(r" {2,}", line, maxsplit=1) for line in result.stdout.splitlines()
                 if line and not line.startswith(("missing on this machine", "dry run", " ")))
    assert lines["placement"] == "disaggregated, gpu x8: 4 engine(s) x 1 (tp=1 dp=1), trainer x 4; mode one_step_off"
    assert lines["trainer"].startswith("torch, dp=4 tp=1 pp=1, bfloat16, LoRA rank 64 alpha 128 on q_proj, k_proj")
    table = _memory_lines(result.stdout)
    print("\n".join(table))
    assert table[1].startswith("trainer rank (torch, bfloat16 frozen base + LoRA rank 64, 174.6M float32 parameters): "
                               "weights 15.9 GiB (frozen base 15.3, adapter 0.7), gradients 0.7, master weights 0.0, "
                               "optimizer state 1.3")
    assert "FSDP" not in table[1] and "reference" not in table[1]
    assert table[2].startswith("activations at 32768 tokens") and "checkpointing full; full 9.8" in table[2]
    peak = float(re.search(r"peak ~([\d.]+) GiB of 80.0 GiB", table[3]).group(1))  # type: ignore[union-attr]
    assert 30 < peak < 80 * 0.92
    assert re.match(r"engine rank \(tp=1, bfloat16\): weights 15\.3 GiB, LoRA slots 1\.3 GiB \(4 adapters of rank "
                    r"64\), KV cache [\d,]+ tokens at mem_fraction_static 0\.8", table[4])
    small = invoke([*base, "cluster.accelerator_memory_gib=24", "--dry-run"])
    assert small.exit_code == 2
    assert "the largest term is weights" in small.stderr and "holds the whole frozen base on every rank" in small.stderr


def test_a_plan_over_capacity_is_refused_naming_the_largest_term_and_the_setting(
        qwen3_4b: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    path = "examples/retool_qwen3_4b_gpu.toml"
    base = [path, f"model.path={qwen3_4b}", *shipped_data(ROOT / path)]
    result = invoke([*base, "train.activation_checkpointing=none", "--dry-run"])
    assert result.exit_code == 2
    assert re.search(r"memory: a trainer rank needs ~\d+\.\d GiB at its peak but an accelerator has 80\.0 GiB",
                     result.stderr)
    assert "the largest term is activations" in result.stderr
    assert "expected train.activation_checkpointing='full'" in result.stderr
    result = invoke([*base, "train.sharding=none", "train.data_parallel_size=4", "--dry-run"])
    assert result.exit_code == 2 and "the largest term is optimizer state" in result.stderr
    assert "train.sharding='fsdp'" in result.stderr
    result = invoke([*base, "train.attention=model", "--dry-run"])  # transformers' dense [S, S] mask
    assert result.exit_code == 2
    assert "train.attention='model': dense attention at train.max_tokens_per_micro_batch=32768 builds [S, S]" \
        in result.stderr and "expected train.attention='auto'" in result.stderr
    megatron = "examples/retool_qwen3_4b_instruct_8gpu.toml"
    result = invoke([megatron, f"model.path={qwen3_4b}", *shipped_data(ROOT / megatron), "train.attention=dense",
                     "--dry-run"])
    assert result.exit_code == 2 and "train.attention='dense'" in result.stderr


def _cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def test_gpu_recipe_without_dry_run_refuses_on_a_machine_without_cuda(tiny: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if _cuda():
        pytest.skip("this machine has CUDA")
    monkeypatch.chdir(ROOT)
    result = invoke(["examples/retool_qwen3_4b_gpu.toml", f"model.path={tiny}"])
    assert result.exit_code == 2
    assert "error: cluster.accelerator='gpu': no CUDA GPU is visible here; expected 8" in result.stderr


def test_resume_refuses_a_changed_config(run_files: dict[str, Path]) -> None:
    from agentrl.cli.config_files import load_run_config
    from agentrl.runner.rundir import RunDirectory

    config = load_run_config(run_files["config"]).config
    RunDirectory(config.run_dir(), config_hash=config.hash()).write_config(config.to_dict())
    result = invoke([str(run_files["config"]), "train.seed=3", "--resume"])
    assert result.exit_code == 2
    assert "was run with another config" in result.stderr and "changed: train.seed" in result.stderr
    result = invoke([str(run_files["config"]), "--resume"])
    assert result.exit_code == 2
    assert "--resume: " in result.stderr and "no complete checkpoint" in result.stderr


def test_subprocess_errors_and_dry_run(run_files: dict[str, Path]) -> None:
    """The installed script: a mistake is one stderr line and status 2; a dry run's wall time."""
    exe = Path(sys.executable).with_name("agentrl")
    bad = subprocess.run([str(exe), "train", str(run_files["config"]), "train.stpes=3"], capture_output=True,
                         text=True, timeout=300)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.startswith("error: train.stpes: unknown key 'stpes' in section [train]; did you mean 'steps'")
    assert len(bad.stderr.splitlines()) == 1
    t0 = time.perf_counter()
    ok = subprocess.run([str(exe), "train", str(run_files["config"]), "--dry-run"], capture_output=True, text=True,
                        timeout=300)
    wall = time.perf_counter() - t0
    assert ok.returncode == 0, ok.stderr
    assert "dry run: nothing started" in ok.stdout
    print(f"dry run wall {wall:.2f} s")


def test_checks_and_dry_run_import_neither_torch_nor_ray(run_files: dict[str, Path]) -> None:
    """Every check runs before the heavy stacks load: Python's own import log of a dry run (a CPU
    one and a GPU one with its device map, and of a config mistake) names no torch, Ray or SGLang
    module, nor the rollout's HTTP clients (aiohttp, httptools, httpx), which only a running rollout needs."""
    gpu = ["--dry-run", "cluster.accelerator=gpu", "cluster.placement=disaggregated", "cluster.accelerator_memory_gib=80"]
    lora = [*gpu, "train.lora.rank=8"]  # the planner's LoRA terms and the engines' adapter slots
    for extra in (["--dry-run"], ["train.steps=0"], gpu, lora):
        proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "agentrl.cli.main", "train",
                               str(run_files["config"]), *extra], capture_output=True, text=True, timeout=300)
        assert proc.returncode == (2 if extra == ["train.steps=0"] else 0), proc.stderr[-2000:]
        if extra in (gpu, lora):  # the device map is planned without torch (nvidia-smi, the config)
            assert "node 0 GPU 0: engine 0" in proc.stdout
        if extra is lora:
            assert "LoRA rank 8" in proc.stdout and "LoRA slots" in proc.stdout
        imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if "import time:" in line}
        assert "agentrl.runner.config" in imported
        heavy = sorted(m for m in imported
                       if m.split(".")[0] in ("torch", "ray", "sglang", "aiohttp", "httptools", "httpx"))
        assert heavy == [], heavy[:5]


def test_a_checkpoint_that_cannot_be_written_stops_with_the_reason_and_the_resume_hint(
        run_files: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from agentrl.runner import api
    from agentrl.runner.checkpoint import CheckpointWriteError

    def full_disk(*args: Any, **kwargs: Any) -> Any:
        raise CheckpointWriteError(errno.ENOSPC, "checkpoint of step 2: writing /x/.tmp-step_000002 failed: "
                                                 "OSError: no space; the disk is full (0 bytes free ...)")

    monkeypatch.setattr(api, "run", full_disk)
    result = invoke([str(run_files["config"])])
    assert result.exit_code == 1, result.output
    assert "error: [Errno 28] checkpoint of step 2: writing /x/.tmp-step_000002 failed" in result.stderr
    assert f"the run folder {run_files['dir'] / 'run'} can be resumed with --resume" in result.stderr
    assert "Traceback" not in result.output


def test_a_run_stopped_by_a_repeated_failure_is_one_error_with_where_and_exit_1(
        run_files: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    from agentrl.rollout.scheduler import RepeatedFailureError
    from agentrl.runner import api
    from agentrl.trajectory import EpisodeError, ErrorKind

    error = EpisodeError(ErrorKind.REWARD, "RewardValueError: score result: expected a float or Reward, got str: 'yes'",
                         component="reward", origin="my_rewards.py:3 in score")

    def stopped(*args: Any, **kwargs: Any) -> Any:
        raise RepeatedFailureError(error, 16, 16)

    monkeypatch.setattr(api, "run", stopped)
    result = invoke([str(run_files["config"])])
    assert result.exit_code == 1, result.output
    assert ("error: 16 prompt groups in a row failed with the same reward error (max_consecutive_failed_groups=16); "
            "the first: reward: RewardValueError: score result: expected a float or Reward, got str: 'yes'\n"
            "  at my_rewards.py:3 in score\n") in result.stderr
    assert "Traceback" not in result.output


def test_mixture_of_experts_models_the_torch_backend_cannot_train_are_refused_before_anything_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny Qwen3-MoE dry-runs with routing replay; a Qwen3.5-MoE folder and a LoRA adapter on the
    experts are refused with the reason; an attention-only adapter passes."""
    import shutil

    moe = build_tiny_moe_model()
    monkeypatch.chdir(ROOT)
    path = "examples/tiny_cpu.toml"
    base = [path, f"model.path={moe}", *shipped_data(ROOT / path), "algorithm.routing_replay=rollout"]
    result = invoke([*base, "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "MoE routing replayed in every training forward (2 layers x top-2 of 8, 4 B/token)" in result.stdout
    result = invoke([*base, "train.lora.rank=8", "--dry-run"])
    assert result.exit_code == 2 and "LoRA adapts attention only" in result.stderr
    result = invoke([*base, "train.lora.rank=8", "train.lora.target_modules=[\"q_proj\", \"v_proj\"]", "--dry-run"])
    assert result.exit_code == 0, result.output
    folder = tmp_path / "qwen3_5_moe"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(moe / name, folder / name)
    text = json.loads((moe / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3_5_moe", "text_config": text}))
    result = invoke([path, f"model.path={folder}", *shipped_data(ROOT / path), "--dry-run"])
    assert result.exit_code == 2
    assert "model_type='qwen3_5_moe': Qwen3.5-MoE (Gated DeltaNet layers and a vision tower) is not supported yet" \
        in result.stderr


def test_the_moe_demo_config_dry_runs_on_what_its_prepare_script_writes(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """``make demo-moe``'s two steps, the second as a dry run: a 4-layer Qwen3-MoE, routing replayed."""
    monkeypatch.chdir(tmp_path)
    prep = subprocess.run([sys.executable, str(ROOT / "examples" / "demo_prepare.py"), "--moe", "--warmup-rows", "64",
                           "--train-rows", "64"], capture_output=True, text=True, timeout=300)
    assert prep.returncode == 0, prep.stderr[-2000:]
    config = json.loads((tmp_path / "models" / "demo-moe-tiny" / "config.json").read_text())
    assert (config["model_type"], config["num_hidden_layers"], config["num_local_experts"]) == ("qwen3_moe", 4, 8)
    result = invoke([str(ROOT / "examples" / "demo_moe_cpu.toml"), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "MoE routing replayed in every training forward (4 layers x top-2 of 8, 8 B/token)" in result.stdout


QWEN3_30B_A3B_CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "decoder_sparse_step": 1, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 6144, "max_position_embeddings": 40960,
    "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768, "norm_topk_prob": True,
    "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
    "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "use_sliding_window": False, "vocab_size": 151936}


def test_the_moe_recipe_plans_qwen3_30b_a3b_with_expert_parallelism_on_one_node(
        tiny: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Qwen3-30B-A3B's real config.json on the MoE recipe's node of 8 H200s: colocated engines (2 x TP 4)
    and a Megatron trainer of EP 8 x DP 8; each trainer rank holds 16 of each layer's 128 experts and a
    replica of the rest (9.6 GiB of bf16 weights), the routing channel of a 32k micro-batch is 12 MiB,
    and the peak fits. On 80 GB GPUs it does not, and the refusal points at more expert-parallel ranks."""
    import shutil

    folder = tmp_path / "qwen3-30b-a3b"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(tiny) / name, folder / name)
    (folder / "config.json").write_text(json.dumps(QWEN3_30B_A3B_CONFIG))
    monkeypatch.chdir(ROOT)
    path = "examples/moe_qwen3_30b_a3b_8gpu.toml"
    base = [path, f"model.path={folder}", *shipped_data(ROOT / path)]
    result = invoke([*base, "--dry-run"])
    assert result.exit_code == 0, result.output
    lines = dict(re.split(r" {2,}", line, maxsplit=1) for line in result.stdout.splitlines()
                 if line and not line.startswith(("missing on this machine", "dry run", " ")))
    assert lines["placement"] == "colocated, gpu x8: 2 engine(s) x 4 (tp=4 dp=1), trainer x 8; mode sync"
    assert lines["trainer"] == "megatron, dp=8 tp=1 pp=1 ep=8, bfloat16"
    assert "MoE routing replayed in every training forward (48 layers x top-8 of 128, 384 B/token)" in result.stdout
    assert lines["model"].startswith(f"{folder} (qwen3_moe, 48 layers")
    assert "node 0 GPU 7: engine 1 (tp 3), trainer rank 7" in result.stdout
    table = _memory_lines(result.stdout)
    print("\n".join(table))
    assert table[1].startswith("trainer rank (megatron, bfloat16 + float32 master weights, distributed optimizer over "
                               "8, experts over 8): weights 9.6 GiB, gradients 19.2, master weights 14.2, optimizer "
                               "state 28.4")
    assert "routing 12.0 MiB" in table[2] and "checkpointing full" in table[2]
    assert "dispatched expert activations" in table[3]
    peak = float(re.search(r"peak ~([\d.]+) GiB of 141.0 GiB", table[3]).group(1))  # type: ignore[union-attr]
    assert 60 < peak < 141 * 0.92
    small = invoke([*base, "cluster.accelerator_memory_gib=80", "--dry-run"])
    assert small.exit_code == 2
    assert "the largest term is optimizer state" in small.stderr
    assert "train.expert_parallel_size (the experts are split over EP ranks" in small.stderr
    torch_ep = invoke([*base, "train.backend=torch", "--dry-run"])
    assert torch_ep.exit_code == 2
    assert "expert_parallel_size=8 with backend='torch': expert parallelism is the megatron backend's" \
        in torch_ep.stderr
