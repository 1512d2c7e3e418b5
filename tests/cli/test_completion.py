"""Shell completion: the script `gpufleet completion` prints is click's for the shell, and the
completions it asks for name the real commands, verbs and options (the lazy ones included)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from controlplane.cli.main import main


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_the_script_hooks_gpufleet_into_the_shell(shell: str) -> None:
    result = CliRunner().invoke(main, ["completion", shell])
    assert result.exit_code == 0, result.output
    assert "_GPUFLEET_COMPLETE" in result.output
    assert "gpufleet" in result.output


def _complete(*words: str) -> list[str]:
    env = {
        **os.environ,
        "_GPUFLEET_COMPLETE": "bash_complete",
        "COMP_WORDS": " ".join(words),
        "COMP_CWORD": str(len(words) - 1),
    }
    done = subprocess.run(
        # The console script's name, which names the variable the shell sets.
        [sys.executable, "-c", "from controlplane.cli.main import main; main(prog_name='gpufleet')"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # bash_complete answers "type,value" lines
    return [line.split(",", 1)[1] for line in done.stdout.splitlines() if "," in line]


def test_commands_verbs_and_options_complete() -> None:
    assert {"team", "token"} <= set(_complete("gpufleet", "t"))
    assert set(_complete("gpufleet", "queue", "")) >= {"create", "list", "show", "update", "delete"}
    assert "--limit" in _complete("gpufleet", "queue", "create", "--l")


def test_the_new_groups_complete_and_the_deprecated_names_are_not_offered() -> None:
    assert {"workload", "server", "dev"} <= set(_complete("gpufleet", ""))
    assert set(_complete("gpufleet", "workload", "")) == {"submit", "list", "show", "cancel", "watch"}
    assert {"serve", "scheduler", "init", "up"} <= set(_complete("gpufleet", "server", ""))
    assert set(_complete("gpufleet", "dev", "")) == {"bench", "sim", "scenario"}
    assert "--output" in _complete("gpufleet", "workload", "list", "--o")
    assert set(_complete("gpufleet", "workload", "list", "-o", "")) == {"table", "json", "yaml"}
    # Old flat names still run, but the shell does not suggest them.
    assert not {"list", "submit", "serve", "bench", "queues", "clusters"} & set(_complete("gpufleet", ""))
