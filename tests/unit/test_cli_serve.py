"""``agentrl serve``: the engine it would start (template file, tool-call parser, CPU recipe), its
lifecycle with a stand-in for the launch (URLs printed, the engine stopped on SIGTERM, a dead engine
reported), and every bad argument with its one-line message. No SGLang starts here."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.cli import serve as serve_module
from agentrl.cli.serve import CPU_MAX_TOTAL_TOKENS, ServeError, plan_serve
from agentrl.rollout.engine import EngineError

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"


def _model(folder: Path, model_type: str = "qwen3", chat_template: str | None = None) -> Path:
    """A folder that passes the model-folder check (nothing loads it here)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
    (folder / "model.safetensors").write_bytes(b"")
    tokenizer: dict[str, Any] = {} if chat_template is None else {"chat_template": chat_template}
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    return folder


def _flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_cpu_plan_serves_the_qwen3_template_with_the_qwen25_parser(tmp_path: Path) -> None:
    plan = plan_serve(_model(tmp_path / "m"), device="cpu", port=30123)
    cmd = plan.config.command(30123, "cpu")
    assert Path(_flag(cmd, "--chat-template")) == TEMPLATES / "qwen3.jinja"
    assert _flag(cmd, "--tool-call-parser") == "qwen25"
    assert (_flag(cmd, "--dtype"), _flag(cmd, "--max-total-tokens")) == ("float32", str(CPU_MAX_TOTAL_TOKENS))
    assert (_flag(cmd, "--host"), _flag(cmd, "--port"), _flag(cmd, "--device")) == ("127.0.0.1", "30123", "cpu")
    assert "--context-length" not in cmd  # the model's own
    cores = len(os.sched_getaffinity(0))
    assert plan.config.env["OMP_NUM_THREADS"] == str(cores)  # a server alone gets every core
    assert plan.config.model_path == str((tmp_path / "m").resolve())


def test_gpu_plan_and_explicit_options(tmp_path: Path) -> None:
    plan = plan_serve(_model(tmp_path / "m"), device="cuda", host="0.0.0.0", dtype="float16", context_length=2048,
                      template="qwen3_coder")
    cmd = plan.config.command(1, "cuda")
    assert Path(_flag(cmd, "--chat-template")) == TEMPLATES / "qwen3_coder.jinja"
    assert _flag(cmd, "--tool-call-parser") == "qwen3_coder"
    assert (_flag(cmd, "--dtype"), _flag(cmd, "--context-length"), _flag(cmd, "--host")) == ("float16", "2048",
                                                                                              "0.0.0.0")
    assert "--max-total-tokens" not in cmd and plan.config.env == {}  # SGLang sizes its cache on a GPU


@pytest.mark.parametrize(("model_type", "own", "template", "parser"), [
    ("qwen3_5", None, "qwen3_5", "qwen3_coder"),
    ("qwen3_moe", "{{ '<function=' + name + '>' }}", "qwen3_coder", "qwen3_coder"),  # Qwen3-Coder's own template
    ("qwen3_moe", "{{ '<tool_call>' }}", "qwen3", "qwen25"),
    ("llama", None, "qwen3", "qwen25"),
], ids=["qwen3_5-type", "xml-calls", "json-calls", "default"])
def test_the_template_is_chosen_from_the_model_folder(tmp_path: Path, model_type: str, own: str | None, template: str,
                                                      parser: str) -> None:
    plan = plan_serve(_model(tmp_path / "m", model_type, own), device="cpu")
    assert (plan.template, plan.parser, plan.template_file.name) == (template, parser, f"{template}.jinja")


def test_a_template_file_gets_the_parser_of_its_call_format(tmp_path: Path) -> None:
    xml = tmp_path / "mine.jinja"
    xml.write_text((TEMPLATES / "qwen3_5.jinja").read_text())
    plan = plan_serve(_model(tmp_path / "m"), device="cpu", template=str(xml))
    assert (plan.template_file, plan.parser) == (xml.resolve(), "qwen3_coder")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"template": "qwen4"}, "--template 'qwen4': not a template name; expected one of 'qwen3', 'qwen3_5', "
                            "'qwen3_coder' or the path of a .jinja file"),
    ({"template": "gone.jinja"}, "--template 'gone.jinja': no such .jinja file"),
    ({"dtype": "fp8"}, "--dtype 'fp8': expected one of 'auto', 'half'"),
    ({"device": "tpu"}, "--device 'tpu': expected one of auto, cpu, cuda, npu"),
    ({"port": 70000}, "--port 70000: expected None (a free port) or an int in [1, 65535]"),
])
def test_bad_arguments_name_the_option(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ServeError) as info:
        plan_serve(_model(tmp_path / "m"), **{"device": "cpu", **kwargs})
    assert message in str(info.value)


def test_missing_or_incomplete_model_folder(tmp_path: Path) -> None:
    with pytest.raises(ServeError, match=r"MODEL: '.*nope' does not exist \(expected a local model folder"):
        plan_serve(tmp_path / "nope", device="cpu")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ServeError, match=r"is not a model folder: it lacks config\.json"):
        plan_serve(tmp_path / "empty", device="cpu")


# -- the command: lifecycle with a stand-in launch -------------------------------------------------
class _Process:
    log_path = Path("/tmp/agentrl-logs/sglang-30123.log")

    def returncode(self) -> int:
        return -9


class _Engine:
    """Stands in for a launched SGLangEngine; ``on_alive`` runs each time the command checks it."""

    url = "http://127.0.0.1:30123"

    def __init__(self, on_alive: Any) -> None:
        self.on_alive, self.stopped, self.process = on_alive, 0, _Process()

    def alive(self) -> bool:
        return bool(self.on_alive())

    def stop(self) -> None:
        self.stopped += 1


class _NotStopped(Exception):
    pass


class _Launches:
    """What the stand-in launch returns (an engine, or an exception to raise) and the configs it got."""

    def __init__(self) -> None:
        self.results: list[Any] = []
        self.configs: list[Any] = []

    async def __call__(self, config: Any) -> Any:
        self.configs.append(config)
        result = self.results.pop(0)
        if isinstance(result, Exception):
            raise result
        return result


@pytest.fixture
def launched(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Launches]:
    launches = _Launches()
    monkeypatch.setattr(serve_module, "_launch", launches)
    monkeypatch.setattr(serve_module, "_POLL_S", 0.01)

    def fallback(signum: int, frame: Any) -> None:
        raise _NotStopped  # the command did not install its own handler: fail the test, not the process
    previous = signal.signal(signal.SIGTERM, fallback)
    yield launches
    signal.signal(signal.SIGTERM, previous)


def _invoke(model: Path, *args: str) -> Any:
    return CliRunner().invoke(app, ["serve", str(model), "--device", "cpu", *args], env={"COLUMNS": "200"})


def _adapter(folder: Path, **config: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    data = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["v_proj", "q_proj"], **config}
    (folder / "adapter_config.json").write_text(json.dumps(data))
    (folder / "adapter_model.safetensors").write_bytes(b"")
    return folder


def test_an_adapter_enables_lora_serving_with_its_rank_and_modules_and_loads_it_by_name(tmp_path: Path) -> None:
    plan = plan_serve(_model(tmp_path / "m"), device="cpu", adapter=_adapter(tmp_path / "my-lora"))
    cmd = plan.config.command(1, "cpu")
    assert "--enable-lora" in cmd and _flag(cmd, "--max-lora-rank") == "8"
    i = cmd.index("--lora-target-modules")
    assert cmd[i + 1:i + 3] == ["q_proj", "v_proj"]
    assert _flag(cmd, "--lora-backend") == "torch_native"  # the kernels that run without an accelerator
    assert _flag(cmd, "--lora-paths") == f"my-lora={(tmp_path / 'my-lora').resolve()}"
    assert plan.adapter == "my-lora" and plan.adapter_model == f"{(tmp_path / 'm').resolve()}:my-lora"
    gpu = plan_serve(_model(tmp_path / "m"), device="cuda", adapter=tmp_path / "my-lora", adapter_name="v3")
    assert "--lora-backend" not in gpu.config.command(1, "cuda") and gpu.adapter == "v3"


@pytest.mark.parametrize(("make", "kwargs", "message"), [
    (lambda p: p / "none", {}, "no such folder; expected a LoRA adapter folder"),
    (lambda p: _model(p / "a"), {}, "adapter_config.json and adapter_model.safetensors missing"),
    (lambda p: _adapter(p / "a", r=0), {}, "r=0, target_modules=['v_proj', 'q_proj']; expected a LORA adapter"),
    (lambda p: _adapter(p / "a", peft_type="IA3"), {}, "peft_type='IA3'"),
    (lambda p: _adapter(p / "a"), {"adapter_name": "a:b"}, "--adapter-name 'a:b': expected a name without"),
])
def test_a_bad_adapter_names_the_option(tmp_path: Path, make: Any, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ServeError, match="--adapter") as err:
        plan_serve(_model(tmp_path / "m"), device="cpu", adapter=make(tmp_path), **kwargs)
    assert message in str(err.value)


def test_serve_prints_the_urls_and_stops_the_engine_on_sigterm(tmp_path: Path, launched: _Launches) -> None:
    def sigterm() -> bool:
        os.kill(os.getpid(), signal.SIGTERM)
        return True
    engine = _Engine(sigterm)
    launched.results.append(engine)
    result = _invoke(_model(tmp_path / "m"), "--port", "30123", "--template", "qwen3_5")
    assert result.exit_code == 0, result.output
    assert engine.stopped == 1
    config = launched.configs[0]
    assert config.port == 30123 and config.extra_args[-1] == "qwen3_coder"
    assert "engine     http://127.0.0.1:30123" in result.output
    assert "openai     http://127.0.0.1:30123/v1" in result.output and "--endpoint http://127.0.0.1:30123/v1" in \
        result.output
    assert "template qwen3_5 (--template), tool-call parser qwen3_coder" in result.output
    assert "stopping the engine" in result.output
    assert "adapter " not in result.output
    assert signal.getsignal(signal.SIGTERM) is not serve_module._raise_interrupt  # the previous handler is back


def test_serve_reports_an_engine_that_dies(tmp_path: Path, launched: _Launches) -> None:
    checks = iter([True, False])
    engine = _Engine(lambda: next(checks))
    launched.results.append(engine)
    result = _invoke(_model(tmp_path / "m"))
    assert result.exit_code == 1 and engine.stopped == 1
    assert "error: the engine at http://127.0.0.1:30123 exited (status -9); its log: " \
           "/tmp/agentrl-logs/sglang-30123.log" in result.output


def test_serve_reports_an_engine_that_does_not_start(tmp_path: Path, launched: _Launches) -> None:
    launched.results.append(EngineError("SGLang server http://127.0.0.1:1 exited with status 1; log tail: boom"))
    result = _invoke(_model(tmp_path / "m"))
    assert result.exit_code == 1
    assert "error: the engine did not start: SGLang server http://127.0.0.1:1 exited with status 1" in result.output


def test_serve_bad_arguments_exit_2_before_anything_starts(tmp_path: Path, launched: _Launches) -> None:
    for args, message in [((str(tmp_path / "nope"),), "does not exist"),
                          ((str(_model(tmp_path / "m")), "--template", "qwen4"), "--template 'qwen4': not a template")]:
        result = CliRunner().invoke(app, ["serve", *args, "--device", "cpu"], env={"COLUMNS": "200"})
        assert result.exit_code == 2 and result.output.startswith("error: ") and message in result.output
    assert launched.configs == []
