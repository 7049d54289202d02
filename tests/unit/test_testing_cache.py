"""The cached test tokenizer: built once, rebuilt when incomplete, never leaving build folders behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.testing import build_tokenizer
from agentrl.testing._cache import build_folder


def test_a_folder_without_tokenizer_json_is_rebuilt(tmp_path: Path) -> None:
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "notes.txt").write_text("the caller's own file")
    tok = build_tokenizer(folder)
    assert tok.convert_tokens_to_ids("<|im_end|>") is not None
    assert (folder / "tokenizer.json").exists()
    assert (folder / "notes.txt").read_text() == "the caller's own file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tok"]  # no .tmp<pid> folder left


def test_the_cache_lives_under_agentrl_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))
    build_tokenizer()
    (built,) = (tmp_path / "tokenizers").iterdir()
    assert built.name.startswith("qwen-tiny-") and (built / "tokenizer.json").exists()


def test_a_failed_build_leaves_nothing_that_looks_complete(tmp_path: Path) -> None:
    def write(out: Path) -> None:
        out.mkdir()
        (out / "part.bin").write_text("half")
        raise RuntimeError("interrupted")

    folder = tmp_path / "model"
    with pytest.raises(RuntimeError, match="interrupted"):
        build_folder(folder, ("done.json",), write)
    assert list(tmp_path.iterdir()) == []
    calls: list[Path] = []

    def write_ok(out: Path) -> None:
        calls.append(out)
        out.mkdir()
        (out / "part.bin").write_text("whole")
        (out / "done.json").write_text("{}")

    assert build_folder(folder, ("done.json",), write_ok) == folder
    assert build_folder(folder, ("done.json",), write_ok) == folder
    assert len(calls) == 1 and (folder / "part.bin").read_text() == "whole"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_a_named_model_folder_holding_another_seed_is_rebuilt(tmp_path: Path) -> None:
    """`demo_prepare.py --seed 1` into the folder an earlier seed-0 run filled gets seed 1's weights
    (it used to keep seed 0's and say seed 1)."""
    from safetensors.torch import load_file

    from agentrl.testing import build_tiny_model

    def weights(folder: Path) -> dict[str, object]:
        return load_file(folder / "model.safetensors")

    named = tmp_path / "demo-tiny"
    seed0 = weights(build_tiny_model(named, seed=0))
    (named / "notes.txt").write_text("the caller's own file")
    seed1 = weights(build_tiny_model(named, seed=1))
    fresh1 = weights(build_tiny_model(tmp_path / "fresh", seed=1))
    assert any(not seed0[k].equal(seed1[k]) for k in seed0)  # type: ignore[attr-defined]
    assert all(seed1[k].equal(fresh1[k]) for k in seed1)  # type: ignore[attr-defined]
    assert (named / "notes.txt").read_text() == "the caller's own file"
    stamp = (named / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_model(named, seed=1) == named and (named / "model.safetensors").stat().st_mtime_ns == stamp
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo-tiny", "fresh"]  # no .tmp<pid> folder left
