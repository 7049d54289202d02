"""GGUF import on tiny files the tests write (:mod:`agentrl.testing.gguf`): the folder scores as the
source model (F32 exactly; Q8_0 as gguf's own dequantisation), tokenises as the source tokenizer,
carries the chat template and an import record; a file of another architecture, a file that is not
GGUF, an occupied folder and a bad dtype fail in one line with nothing written; the SmolLM-style
pre-split is set where transformers has none."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentrl.model_folder import check_model_folder
from agentrl.models import (
    GgufImportError,
    file_sha256,
    import_gguf,
    imported_from,
    read_gguf_info,
    readable_architectures,
)
from agentrl.testing.gguf import write_tiny_gguf

TEXTS = ["<|im_start|>user\nWhat is 487 * 925?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n"
         '{"name": "calculator", "arguments": {"expression": "487 * 925"}}\n</tool_call><|im_end|>',
         "hello  world\n\n\n12345 and 6.5", "<think>\n\n</think>\n\n\\boxed{450475}"]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    root = tmp_path_factory.mktemp("gguf")
    return {q: write_tiny_gguf(root / f"tiny-{q}.gguf", quant=q) for q in ("F32", "Q8_0")}  # type: ignore[arg-type]


def _logits(folder: Path, ids: list[int]) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def test_f32_import_scores_and_tokenises_as_the_source(files: dict[str, tuple[Path, Path]], tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    gguf_path, reference = files["F32"]
    lines: list[str] = []
    report = import_gguf(gguf_path, tmp_path / "out", progress=lines.append)
    folder = check_model_folder(tmp_path / "out")  # config, weights and tokenizer are all there
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert config["tie_word_embeddings"] is True and config["torch_dtype" if "torch_dtype" in config else "dtype"] == "float32"
    src, out = AutoTokenizer.from_pretrained(str(reference)), AutoTokenizer.from_pretrained(str(folder))
    for text in TEXTS:
        assert out(text)["input_ids"] == src(text)["input_ids"], text
    assert out.chat_template == src.chat_template and out.eos_token == "<|im_end|>"
    ids = src(TEXTS[0])["input_ids"]
    assert float((_logits(folder, ids) - _logits(reference, ids)).abs().max()) <= 1e-5
    record = imported_from(folder)
    assert record is not None and record["sha256"] == file_sha256(gguf_path) == report.sha256
    assert record["architecture"] == "llama" and record["dtype"] == "float32" and record["tokenizer_fix"] is None
    assert record["parameters"] == report.parameters > 0
    assert lines[0].startswith(f"importing {gguf_path.name}") and "architecture llama" in lines[0]
    assert [line.split()[0] for line in lines[1:]] == ["tokenizer", "weights", "saved"]


def test_q8_0_weights_are_dequantised_as_gguf_does(files: dict[str, tuple[Path, Path]], tmp_path: Path) -> None:
    import numpy as np
    from gguf import GGUFReader, dequantize
    from safetensors.numpy import load_file

    gguf_path, reference = files["Q8_0"]
    folder = import_gguf(gguf_path, tmp_path / "q8").folder
    info = read_gguf_info(gguf_path)
    assert info.tensor_types["Q8_0"] > 0 and info.tensor_types["F32"] > 0
    tensor = next(t for t in GGUFReader(str(gguf_path)).tensors if t.name == "blk.1.ffn_down.weight")
    expected = dequantize(tensor.data, tensor.tensor_type).reshape(np.flip(tensor.shape))
    weights = load_file(str(folder / "model.safetensors"))
    assert np.array_equal(weights["model.layers.1.mlp.down_proj.weight"], expected)
    ids = list(range(3, 40))
    diff = float((_logits(folder, ids) - _logits(reference, ids)).abs().max())
    assert 0 < diff < 0.2  # quantised: close to the float model, not equal to it


def test_an_architecture_transformers_cannot_read_fails_before_anything_is_written(tmp_path: Path) -> None:
    gguf_path, _ = write_tiny_gguf(tmp_path / "odd.gguf", architecture="rwkv7")
    with pytest.raises(GgufImportError) as err:
        import_gguf(gguf_path, tmp_path / "out")
    message = str(err.value)
    assert str(gguf_path) in message and "general.architecture='rwkv7'" in message
    assert "llama" in message and "qwen3" in message  # what it reads instead
    assert "rwkv7" not in readable_architectures() and "qwen3moe" in readable_architectures()
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.tmp")]


def test_bad_inputs_name_the_value_and_what_was_expected(files: dict[str, tuple[Path, Path]], tmp_path: Path) -> None:
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 a zip, not a gguf")
    with pytest.raises(GgufImportError, match=r"not a GGUF file \(it starts with b'PK\\x03\\x04', expected b'GGUF'\)"):
        import_gguf(not_gguf, tmp_path / "a")
    with pytest.raises(GgufImportError, match="no such file"):
        import_gguf(tmp_path / "missing.gguf", tmp_path / "a")
    with pytest.raises(GgufImportError, match=r"dtype='fp8': expected one of float32, bfloat16, float16"):
        import_gguf(files["F32"][0], tmp_path / "a", dtype="fp8")
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "keep.txt").write_text("mine")
    with pytest.raises(GgufImportError, match="exists and is not an empty folder"):
        import_gguf(files["F32"][0], occupied)
    assert (occupied / "keep.txt").read_text() == "mine" and not (tmp_path / "a").exists()
    import_gguf(files["F32"][0], occupied, overwrite=True, dtype="bfloat16")
    assert not (occupied / "keep.txt").exists()
    assert json.loads((occupied / "config.json").read_text())["dtype"] == "bfloat16"


def test_smollm_pre_split_puts_each_digit_alone(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    gguf_path, _ = write_tiny_gguf(tmp_path / "smol.gguf", pre_tokenizer="smollm")
    report = import_gguf(gguf_path, tmp_path / "out")
    assert report.tokenizer_fix is not None and "'smollm'" in report.tokenizer_fix
    split = AutoTokenizer.from_pretrained(str(tmp_path / "out")).backend_tokenizer.pre_tokenizer
    assert [p for p, _ in split.pre_tokenize_str("x  12 ab")] == ["x", "ĠĠ", "1", "2", "Ġab"]
    # what transformers alone makes of that file: GPT-2's split, digits in one piece
    plain = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=gguf_path.name).backend_tokenizer.pre_tokenizer
    assert [p for p, _ in plain.pre_tokenize_str("x  12 ab")] == ["x", "Ġ", "Ġ12", "Ġab"]
