"""The registry of environment, reward and group-filter names (``agentrl.environments.registry``),
and an environment package built here, installed with ``pip`` and trained with by name."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agentrl.environments import RetoolMathEnv, ToyArithmeticEnv
from agentrl.environments.registry import ENTRY_POINT_GROUPS, RegistryError, available, resolve
from agentrl.rewards.filters import drop_uniform_rewards


def test_builtins_by_short_name() -> None:
    assert resolve("environment", "toy_arithmetic") is ToyArithmeticEnv
    assert resolve("environment", "retool_math") is RetoolMathEnv
    assert resolve("group_filter", "drop_uniform_rewards") is drop_uniform_rewards
    assert available("environment")["toy_arithmetic"] == "built-in"


def test_unknown_names_list_the_valid_ones() -> None:
    with pytest.raises(RegistryError) as info:
        resolve("environment", "retool")
    text = str(info.value)
    assert text.startswith("unknown environment 'retool'")
    assert "retool_math (built-in), toy_arithmetic (built-in)" in text
    assert "'agentrl.environments'" in text
    with pytest.raises(RegistryError, match=r"unknown group_filter 'uniform'.*drop_uniform_rewards \(built-in\)"):
        resolve("group_filter", "uniform")


def test_module_attr_only_where_allowed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_rewards.py").write_text("def half(trajectory, task):\n    return 0.5\nNOT_CALLABLE = 3\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RegistryError, match="'module:attr' names are taken on the command line only"):
        resolve("reward", "my_rewards:half")
    fn = resolve("reward", "my_rewards:half", allow_import=True)
    assert fn(None, None) == 0.5
    with pytest.raises(RegistryError, match="module 'my_rewards' has no attribute 'nope'"):
        resolve("reward", "my_rewards:nope", allow_import=True)
    with pytest.raises(RegistryError, match="expected a callable, got 3"):
        resolve("reward", "my_rewards:NOT_CALLABLE", allow_import=True)


def test_environment_factory_resolves_by_name() -> None:
    from agentrl.runner import RunConfig
    from agentrl.runner.envs import environment_factory

    config = RunConfig.from_dict({"model": {"path": "m"}, "data": {"train": {"path": "t"}},
                                  "environment": {"name": "toy_arithmetic", "options": {"system_prompt": None}},
                                  "train": {"steps": 1}})
    factory = environment_factory(config)
    assert factory.cls is ToyArithmeticEnv and factory.options == {"system_prompt": None}
    bad = RunConfig.from_dict({**config.to_dict(), "environment": {"name": "nope"}})
    with pytest.raises(ValueError, match=r"environment\.name: unknown environment 'nope'.*pass your environment"):
        environment_factory(bad)


PACKAGE = {
    "pyproject.toml": """
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "tiny-env-pkg"
        version = "0.1.0"

        [project.entry-points."agentrl.environments"]
        tiny-env = "tiny_env_pkg:MarkedArithmeticEnv"

        [tool.setuptools]
        packages = ["tiny_env_pkg"]
    """,
    "tiny_env_pkg/__init__.py": """
        import os

        from agentrl.environments import ToyArithmeticEnv


        class MarkedArithmeticEnv(ToyArithmeticEnv):
            '''Toy arithmetic that leaves a line in $TINY_ENV_MARKER per environment built.'''

            def __init__(self, task, **kwargs):
                super().__init__(task, **kwargs)
                with open(os.environ["TINY_ENV_MARKER"], "a") as f:
                    f.write("built\\n")
    """,
}

TRAIN_SCRIPT = """
import asyncio, sys
from pathlib import Path
from agentrl.runner import RunConfig
from agentrl.runner.envs import environment_factory
from agentrl.testing.runner import build_fake_runner, fake_run_config

root = Path(sys.argv[1])
base = fake_run_config(root, steps=1, checkpoint_every=None)
config = RunConfig.from_dict({**base.to_dict(), "environment": {"name": "tiny-env"}})
cls = environment_factory(config).cls          # resolved by name, through the entry point
print("resolved", cls.__module__, cls.__name__)
runner, _ = build_fake_runner(config, environment=cls)
summary = asyncio.run(runner.run())
print("steps", summary.steps)
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_an_installed_environment_package_is_nameable_and_trains(tmp_path: Path) -> None:
    """``pip install`` a package built here (into a ``--target`` folder on ``PYTHONPATH``), then: the
    registry lists it, ``agentrl train --dry-run`` resolves it by name, and a one-step run on the fake
    engine (real torch trainer on the tiny model) builds its environments."""
    src = tmp_path / "src"
    for name, text in PACKAGE.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(textwrap.dedent(text))
    target = tmp_path / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
                          "--no-index", "--quiet", "--target", str(target), str(src)],
                         capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stderr
    marker = tmp_path / "marker.txt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")]),
           "TINY_ENV_MARKER": str(marker)}

    listed = subprocess.run([sys.executable, "-c", "from agentrl.environments.registry import available; "
                             "print(available('environment'))"], capture_output=True, text=True, env=env, timeout=120)
    assert "'tiny-env': 'package tiny-env-pkg'" in listed.stdout, listed.stderr
    assert ENTRY_POINT_GROUPS["environment"] == "agentrl.environments"

    train = subprocess.run([sys.executable, "-c", TRAIN_SCRIPT, str(tmp_path / "run")], capture_output=True, text=True,
                           env=env, timeout=480)
    assert train.returncode == 0, train.stderr[-3000:]
    assert "resolved tiny_env_pkg MarkedArithmeticEnv" in train.stdout
    assert "steps 1" in train.stdout
    built = marker.read_text().splitlines()
    assert len(built) >= 4, built  # one step: 2 groups x 2 members
    run = tmp_path / "run" / "run"
    assert (run / "metrics.jsonl").read_text().count("\n") == 1
    assert (run / "trajectories" / "step_000001.jsonl.gz").is_file()

    exe = Path(sys.executable).with_name("agentrl")
    config = tmp_path / "run.toml"
    config.write_text(f'[model]\npath = "{_tiny()}"\n[data.train]\npath = "{tmp_path / "run" / "train.jsonl"}"\n'
                      '[environment]\nname = "tiny-env"\n[train]\nsteps = 1\n')
    dry = subprocess.run([str(exe), "train", str(config), "--dry-run"], capture_output=True, text=True, env=env,
                         timeout=300)
    assert dry.returncode == 0, dry.stderr
    assert "environment   tiny-env -> MarkedArithmeticEnv" in dry.stdout


def _tiny() -> str:
    from agentrl.testing import build_tiny_model

    return str(build_tiny_model())
