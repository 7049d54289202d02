"""A distillation teacher that does not share the student's tokenizer or chat template is refused before
anything starts, in one line naming the difference (``agentrl train``'s pre-flight and ``agentrl.run``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.environments import make_arithmetic_rows
from agentrl.runner import RunConfig
from agentrl.runner.teacher_check import TeacherMismatch, folder_difference, teacher_problem
from agentrl.testing import build_tiny_model


def _copy(tmp_path: Path, name: str) -> Path:
    return Path(shutil.copytree(build_tiny_model(seed=1), tmp_path / name))


def _edit_json(path: Path, edit: object) -> None:
    data = json.loads(path.read_text())
    edit(data)  # type: ignore[operator]
    path.write_text(json.dumps(data))


def _swap_two_tokens(data: dict) -> None:  # type: ignore[type-arg]
    vocab = data["model"]["vocab"]
    a, b = "the", "of"
    vocab[a], vocab[b] = vocab[b], vocab[a]


def test_the_same_tokenizer_and_template_pass(tmp_path: Path) -> None:
    assert folder_difference(build_tiny_model(), build_tiny_model(seed=1)) is None


def test_another_vocabulary_is_named_by_its_first_differing_id(tmp_path: Path) -> None:
    teacher = _copy(tmp_path, "teacher")
    _edit_json(teacher / "tokenizer.json", _swap_two_tokens)
    why = folder_difference(build_tiny_model(), teacher)
    assert why is not None and why.startswith("its tokenizer differs from the student's: token id ")
    assert "'the'" in why and "'of'" in why


def test_another_added_token_and_merges_are_named(tmp_path: Path) -> None:
    teacher = _copy(tmp_path, "teacher")
    _edit_json(teacher / "tokenizer.json", lambda d: d["added_tokens"][3].update(special=True))
    assert "is special for the teacher and not special for the student" in (folder_difference(build_tiny_model(),
                                                                                               teacher) or "")
    teacher2 = _copy(tmp_path, "teacher2")
    _edit_json(teacher2 / "tokenizer.json", lambda d: d["model"]["merges"].reverse())
    assert "other BPE merges" in (folder_difference(build_tiny_model(), teacher2) or "")


def test_another_chat_template_is_named_where_it_differs(tmp_path: Path) -> None:
    student, teacher = _copy(tmp_path, "student"), _copy(tmp_path, "teacher")
    _edit_json(student / "tokenizer_config.json", lambda d: d.update(chat_template="{% for m in messages %}<|im_start|>"
                                                                                   "{{ m.role }}{% endfor %}"))
    _edit_json(teacher / "tokenizer_config.json", lambda d: d.update(chat_template="{% for m in messages %}[INST]"
                                                                                   "{{ m.role }}{% endfor %}"))
    why = folder_difference(student, teacher)
    assert why is not None and why.startswith("its chat template differs from the student's at character 23: '[INST]")


def _config(tmp_path: Path, teacher: Path) -> Path:
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in make_arithmetic_rows(8, seed=0)))
    path = tmp_path / "run.toml"
    path.write_text(f"""
[model]
path = "{build_tiny_model()}"
dtype = "float32"
[data.train]
path = "{data}"
[environment]
name = "toy_arithmetic"
[train]
steps = 2
[teacher]
kind = "model"
path = "{teacher}"
[logging]
run_dir = "{tmp_path / 'run'}"
""")
    return path


def test_agentrl_train_refuses_another_tokenizer_in_one_line_before_starting(tmp_path: Path) -> None:
    teacher = _copy(tmp_path, "teacher")
    _edit_json(teacher / "tokenizer.json", _swap_two_tokens)
    config = _config(tmp_path, teacher)
    result = CliRunner().invoke(app, ["train", str(config), "--dry-run"], env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    text = result.stderr.strip() if result.stderr_bytes is not None else result.output.strip()
    assert text.startswith("error: teacher.path=") and len(text.splitlines()) == 1, text
    assert "tokenizer differs from the student's: token id" in text
    assert not (tmp_path / "run").exists()
    ok = _config(tmp_path, build_tiny_model(seed=1))
    result = CliRunner().invoke(app, ["train", str(ok), "--dry-run"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "teacher       model: " in result.output and "1 x (log p_teacher - log p_student)" in result.output


def test_the_python_api_refuses_it_too(tmp_path: Path) -> None:
    import agentrl

    teacher = _copy(tmp_path, "teacher")
    _edit_json(teacher / "tokenizer.json", _swap_two_tokens)
    from agentrl.cli.config_files import load_config_file

    config = RunConfig.from_dict(load_config_file(_config(tmp_path, teacher)))
    assert teacher_problem(config) is not None
    with pytest.raises(TeacherMismatch, match=r"teacher.path=.*token id"):
        agentrl.run(config, use_ray=False)
    assert not (tmp_path / "run").exists()
