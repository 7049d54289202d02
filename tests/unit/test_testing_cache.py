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
