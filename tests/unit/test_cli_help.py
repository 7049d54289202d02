"""Every command's ``--help`` ends in an Examples block that shows that very command being run."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from agentrl.cli import app

COMMANDS = [[], ["render"], ["inspect"], ["env"], ["env", "check"], ["sft"], ["train"], ["eval"], ["doctor"], ["serve"]]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "agentrl")
def test_help_shows_examples_of_the_command(command: list[str]) -> None:
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "80", "TERMINAL_WIDTH": "80"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "Examples:" in [line.strip() for line in lines], result.output
    after = lines[[line.strip() for line in lines].index("Examples:") + 1:]
    prefix = " ".join(["agentrl", *command]) + " "
    shown = [line.strip() for line in after if line.strip().startswith(prefix)]
    if not command:  # the root shows subcommands being run
        shown = [s for s in shown if s.split()[1] in {"train", "eval", "doctor", "inspect", "sft", "render", "env", "serve"}]
    assert shown, f"no example of {prefix.strip()!r} after 'Examples:' in:\n{result.output}"
    for line in lines:
        assert len(line) <= 80, (command, line)
