"""The pre-flight checks the engines a run asks for: the packages that start them (looked up with
``find_spec``, never imported) and engines given by URL, which must answer ``GET /server_info``."""

from __future__ import annotations

import importlib.util
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.cli.plan import URL_TIMEOUT_S, preflight
from agentrl.environments import make_arithmetic_rows
from agentrl.runner import RunConfig
from agentrl.testing import build_tiny_model


def _config(tmp_path: Path, **sections: Any) -> RunConfig:
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in make_arithmetic_rows(8, seed=0)))
    base: dict[str, Any] = {"model": {"path": str(build_tiny_model()), "dtype": "float32"},
                            "data": {"train": {"path": str(data)}}, "environment": {"name": "toy_arithmetic"},
                            "logging": {"run_dir": str(tmp_path / "run")}}
    for key, value in sections.items():
        base[key] = {**base.get(key, {}), **value}
    return RunConfig.from_dict(base)


def _without(monkeypatch: pytest.MonkeyPatch, *missing: str) -> list[str]:
    """Makes ``find_spec`` report ``missing`` as not installed; returns the names looked up."""
    real, asked = importlib.util.find_spec, []

    def find_spec(name: str, package: str | None = None) -> Any:
        asked.append(name)
        return None if name in missing else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    return asked


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def engine_url() -> Iterator[str]:
    """A stand-in engine on 127.0.0.1 that answers /server_info with a JSON object (404 elsewhere)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"model_path": "tiny"}).encode() if self.path == "/server_info" else b""
            self.send_response(200 if body else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def test_the_packages_asked_for_are_installed_here(tmp_path: Path) -> None:
    if importlib.util.find_spec("sglang") is None or importlib.util.find_spec("sglang_router") is None:
        pytest.skip("SGLang is not installed here (scripts/setup.sh, stage extra-sglang)")
    plan = preflight(_config(tmp_path))
    assert plan.problems == [] and plan.machine == []


def test_missing_sglang_is_reported_for_launched_engines_only(tmp_path: Path, engine_url: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _without(monkeypatch, "sglang")
    plan = preflight(_config(tmp_path))
    assert plan.problems == []
    assert plan.machine == ["rollout.engines.count=1: the run starts its SGLang engines (python -m "
                            "sglang.launch_server), but the sglang package is not installed here (no module "
                            "'sglang'); expected it installed (scripts/setup.sh installs it; `agentrl doctor` "
                            "checks it)"]
    assert "sglang" in asked
    # engines given by URL are not started: SGLang need not be installed here
    plan = preflight(_config(tmp_path, rollout={"engines": {"urls": [engine_url]}}))
    assert plan.problems == [] and plan.machine == []


def test_missing_router_is_reported_even_over_engine_urls(tmp_path: Path, engine_url: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    _without(monkeypatch, "sglang_router")
    plan = preflight(_config(tmp_path, rollout={"engines": {"urls": [engine_url]}}))
    assert plan.problems == []
    assert len(plan.machine) == 1 and plan.machine[0].startswith(
        "the run starts sglang-router in front of its engines, but the sglang-router package is not installed "
        "here (no module 'sglang_router')")


def test_missing_megatron_core_is_reported_for_the_megatron_backend(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _without(monkeypatch, "megatron.core")
    assert preflight(_config(tmp_path)).machine == []  # the torch backend needs no megatron-core
    assert "megatron.core" not in asked
    plan = preflight(_config(tmp_path, train={"backend": "megatron"}))
    assert [m for m in plan.machine if "megatron" in m] == [
        "train.backend='megatron' trains with megatron-core, but the megatron-core package is not installed "
        "here (no module 'megatron.core'); expected it installed (scripts/setup.sh installs it; `agentrl doctor` "
        "checks it)"]


def test_an_engine_url_that_nothing_listens_on_is_a_problem(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    plan = preflight(_config(tmp_path, rollout={"engines": {"urls": [url]}}))
    assert len(plan.problems) == 1, plan.problems
    assert plan.problems[0].startswith(f"rollout.engines.urls[0]={url!r}: no SGLang engine answers there: "
                                       f"GET {url}/server_info failed (ConnectionRefusedError")
    assert plan.problems[0].endswith("expected a running engine (python -m sglang.launch_server) at that URL")


def test_an_engine_url_that_never_answers_times_out(tmp_path: Path, engine_url: str) -> None:
    """A socket that accepts connections (the kernel's backlog) but never replies; the good URL passes."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/"
        plan = preflight(_config(tmp_path, rollout={"engines": {"count": 2, "urls": [engine_url, url]}}))
    assert plan.problems == [f"rollout.engines.urls[1]={url!r}: no SGLang engine answers there: GET "
                             f"{url.rstrip('/')}/server_info: no answer within {URL_TIMEOUT_S:g} s; expected a "
                             "running engine (python -m sglang.launch_server) at that URL"]


def test_an_engine_url_that_is_not_an_engine_is_a_problem(tmp_path: Path, engine_url: str) -> None:
    plan = preflight(_config(tmp_path, rollout={"engines": {"urls": [engine_url + "/v1"]}}))
    assert len(plan.problems) == 1 and f"GET {engine_url}/v1/server_info -> HTTP 404" in plan.problems[0]


def test_the_command_line_reports_missing_packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--dry-run`` lists what this machine lacks and passes; a real run refuses before starting anything."""
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in make_arithmetic_rows(8, seed=0)))
    config = tmp_path / "run.toml"
    config.write_text(f'[model]\npath = "{build_tiny_model()}"\ndtype = "float32"\n[data.train]\npath = "{data}"\n'
                      f'[environment]\nname = "toy_arithmetic"\n[logging]\nrun_dir = "{tmp_path / "run"}"\n')
    _without(monkeypatch, "sglang")
    runner = CliRunner()
    result = runner.invoke(app, ["train", str(config), "--dry-run"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "missing on this machine: rollout.engines.count=1: the run starts its SGLang engines" in result.stdout
    result = runner.invoke(app, ["train", str(config)], env={"COLUMNS": "200"})
    assert result.exit_code == 2
    assert result.stderr.startswith("error: rollout.engines.count=1: the run starts its SGLang engines")
    assert not (tmp_path / "run").exists()
