"""Wrong model folders fail up front in one line; EngineConfig refuses bad values at construction."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from agentrl.rollout import (
    EngineConfig,
    ModelFolderError,
    RouterConfig,
    SGLangEngine,
    check_model_folder,
    model_vocab_size,
)
from agentrl.testing import build_tiny_model, build_tokenizer


def _folder(tmp_path: Path, *files: str) -> Path:
    folder = tmp_path / "model"
    folder.mkdir(parents=True)
    for name in files:
        (folder / name).write_text("{}")
    return folder


def test_the_folder_check_names_the_path_and_everything_missing(tmp_path: Path) -> None:
    with pytest.raises(ModelFolderError, match=r"^model_path: '.*nope' does not exist \(expected a local model folder"):
        check_model_folder(tmp_path / "nope")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ModelFolderError, match=r"'.*file' is a file; expected a model folder"):
        check_model_folder(str(tmp_path / "file"))
    empty = _folder(tmp_path)
    with pytest.raises(ModelFolderError) as info:
        check_model_folder(empty, what="EngineConfig.model_path")
    message = str(info.value)
    assert "\n" not in message and message.startswith("EngineConfig.model_path: ")
    assert message.endswith("is not a model folder: it lacks config.json; weights (*.safetensors or *.bin); "
                            "tokenizer files (tokenizer.json or tokenizer_config.json)")
    assert check_model_folder(build_tiny_model()) == build_tiny_model()
    assert check_model_folder(_folder(tmp_path / "x", "config.json", "model.safetensors"),
                              needs=("config", "weights")).name == "model"
    with pytest.raises(ValueError, match="needs="):
        check_model_folder(empty, needs=("vocab",))  # type: ignore[arg-type]


def test_model_vocab_size_is_the_padded_embedding(tmp_path: Path) -> None:
    assert model_vocab_size(build_tiny_model()) == 1792 > len(build_tokenizer())
    nested = _folder(tmp_path)
    (nested / "config.json").write_text(json.dumps({"text_config": {"vocab_size": 151936}}))
    assert model_vocab_size(nested) == 151936
    (nested / "config.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(ModelFolderError, match="no positive integer vocab_size"):
        model_vocab_size(nested)


async def test_launch_checks_the_folder_before_starting_anything(tmp_path: Path) -> None:
    weights_only = _folder(tmp_path, "config.json", "model.safetensors")
    start = time.monotonic()
    with pytest.raises(ModelFolderError, match=r"EngineConfig.model_path: '.*no-such' does not exist"):
        await SGLangEngine.launch(EngineConfig(model_path=tmp_path / "no-such", device="cpu", log_dir=str(tmp_path)))
    with pytest.raises(ModelFolderError, match=r"it lacks tokenizer files \(tokenizer.json"):
        await SGLangEngine.launch(EngineConfig(model_path=weights_only, device="cpu"))
    assert time.monotonic() - start < 5
    assert list(tmp_path.glob("sglang-*.log")) == []  # no process was started
    # another tokenizer named on the command line: the folder needs no tokenizer of its own
    assert EngineConfig(model_path=weights_only, extra_args=("--tokenizer-path", "t")).folder_needs == ("config",
                                                                                                         "weights")


def test_engine_config_accepts_paths_and_refuses_bad_values(tmp_path: Path) -> None:
    config = EngineConfig(model_path=tmp_path, log_dir=str(tmp_path / "logs"), shim_dir=str(tmp_path))
    assert config.model_path == str(tmp_path) and config.log_dir == tmp_path / "logs" and config.shim_dir == tmp_path
    assert config.expected_server_info()["model_path"] == str(tmp_path)
    bad: list[tuple[dict[str, object], str]] = [
        ({"port": 99999}, r"port=99999: expected None \(a free port\) or an int in \[1, 65535\]"),
        ({"port": 0}, r"port=0"),
        ({"device": "gpu"}, r"device='gpu': expected one of 'auto', 'cpu', 'cuda'"),
        ({"dtype": "bf16"}, r"dtype='bf16': expected one of 'auto', 'half', 'float16', 'bfloat16'"),
        ({"log_level": "loud"}, r"log_level='loud': expected one of 'debug'"),
        ({"tp_size": 0}, r"tp_size=0: expected an int >= 1"),
        ({"max_total_tokens": -1}, r"max_total_tokens=-1"),
        ({"mem_fraction_static": 1.5}, r"mem_fraction_static=1.5: expected a value in \(0, 1\]"),
        ({"startup_timeout_s": 0}, r"startup_timeout_s=0: expected a number > 0"),
        ({"extra_args": "--foo --bar"}, r"extra_args='--foo --bar': expected a tuple of strings"),
        ({"log_dir": 3}, r"log_dir=3: expected a folder"),
        ({"model_path": ""}, r"model_path='': expected a model folder"),
    ]
    for changes, message in bad:
        kwargs: dict[str, object] = {"model_path": "m", **changes}
        with pytest.raises(ValueError, match=f"EngineConfig.{message}"):
            EngineConfig(**kwargs)  # type: ignore[arg-type]


def test_router_config_refuses_bad_ports_and_takes_path_strings(tmp_path: Path) -> None:
    assert RouterConfig(log_dir=str(tmp_path)).log_dir == tmp_path
    with pytest.raises(ValueError, match=r"RouterConfig.port=70000: expected None \(a free port\) or an int"):
        RouterConfig(port=70000)
    with pytest.raises(ValueError, match=r"RouterConfig.prometheus_port=0"):
        RouterConfig(prometheus_port=0)
