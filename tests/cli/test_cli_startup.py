"""`gpufleet` starts without importing the daemons' and agent's libraries, its help is grouped, and the
flat names of the previous release are deprecated aliases (they work, say the new name, stay hidden).

Import checks, never timings: a command that imports SQLAlchemy, nats-py or the Kubernetes client
costs seconds on every call, and only the modules it loaded say so reliably on a shared machine.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import click
import pytest
from click.testing import CliRunner

from controlplane.cli.groups import DEV_COMMANDS, SERVER_COMMANDS, dev, server
from controlplane.cli.main import DEPRECATED_ALIASES, SECTIONS, main

HEAVY = ("kubernetes", "sqlalchemy", "alembic", "nats", "fastapi", "boto3", "azure", "google.cloud", "oci")

# Runs the real entry point in a fresh interpreter and prints which heavy packages it loaded.
PROBE = """
import json, sys
from controlplane.cli.main import main
try:
    main(sys.argv[1:], prog_name="gpufleet")
except SystemExit:
    pass
heavy = json.loads({heavy!r})
loaded = sorted(h for h in heavy if any(m == h or m.startswith(h + ".") for m in sys.modules))
sys.stderr.write("LOADED=" + json.dumps(loaded) + "\\n")
"""

CLIENT_COMMANDS = (
    ("workload",), ("workload", "list"), ("workload", "submit"), ("workload", "watch"), ("report",), ("audit",),
    ("job",), ("status",), ("login",), ("context",), ("completion",), ("cohort",), ("team",), ("queue",),
    ("queue", "list"), ("priority-class",), ("token",), ("cluster",), ("server",), ("dev",),
    ("list",), ("queues",), ("clusters",),  # deprecated aliases: still light
)  # fmt: skip

ALL_COMMANDS = {
    "up", "server", "agent",
    "status", "workload", "job", "report", "audit", "login", "context", "completion",
    "team", "queue", "cohort", "priority-class", "token", "cluster",
    "dev",
}  # fmt: skip


def loaded_heavy(*args: str, env: dict[str, str] | None = None) -> tuple[list[str], str]:
    probe = PROBE.format(heavy=json.dumps(HEAVY))
    done = subprocess.run(
        [sys.executable, "-c", probe, *args], capture_output=True, text=True, timeout=120, check=False, env=env
    )
    line = next(line for line in done.stderr.splitlines() if line.startswith("LOADED="))
    return json.loads(line.removeprefix("LOADED=")), done.stdout


def test_top_level_help_imports_no_command_module() -> None:
    loaded, out = loaded_heavy("--help")
    assert "Use it:" in out
    assert loaded == []


@pytest.mark.parametrize("words", CLIENT_COMMANDS, ids=" ".join)
def test_client_command_help_imports_no_heavy_library(words: tuple[str, ...]) -> None:
    loaded, out = loaded_heavy(*words, "--help")
    assert f"Usage: gpufleet {' '.join(words)}" in out
    assert loaded == []


@pytest.fixture
def empty_api() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"items": [], "next": None}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_list_against_an_api_imports_no_heavy_library(empty_api: str) -> None:
    loaded, out = loaded_heavy("workload", "list", "--api", empty_api, "--token", "t")
    assert "no workloads match" in out
    assert loaded == []


@pytest.mark.parametrize(
    ("words", "offered"), [("gpufleet ", "up"), ("gpufleet server ", "serve"), ("gpufleet dev ", "bench")]
)
def test_completing_command_names_imports_no_command(words: str, offered: str) -> None:
    # The shell asks on every <TAB>: the names and summaries come from the tables, not the modules.
    env = {
        **os.environ,
        "_GPUFLEET_COMPLETE": "bash_complete",
        "COMP_WORDS": words,
        "COMP_CWORD": str(len(words.split())),
    }
    loaded, out = loaded_heavy(env=env)
    assert loaded == []
    assert f"plain,{offered}" in out.splitlines()


def test_heavy_commands_still_load_their_modules() -> None:
    # The probe can see an import: `dev bench --help` loads the benchmark, which needs SQLAlchemy.
    loaded, out = loaded_heavy("dev", "bench", "--help")
    assert "Usage: gpufleet dev bench" in out
    assert "sqlalchemy" in loaded


def test_help_groups_every_command_once_under_its_section() -> None:
    result = CliRunner().invoke(main, ["--help"], terminal_width=100)
    assert result.exit_code == 0, result.output
    titles = re.findall(r"^(\S[^:\n]*):$", result.output, flags=re.MULTILINE)
    assert titles == ["Options", "Run the control plane", "Use it", "Manage the fleet", "Developer tools"]
    listed = re.findall(r"^  ([a-z][a-z-]*)  ", result.output, flags=re.MULTILINE)
    assert sorted(listed) == sorted(ALL_COMMANDS)
    assert len(listed) == len(set(listed))
    # Each command sits under its own heading.
    headings = r"^(?:Run the control plane|Use it|Manage the fleet|Developer tools):$"
    sections = re.split(headings, result.output, flags=re.MULTILINE)
    assert "  up " in sections[1]
    assert "  server " in sections[1]
    assert "  workload " in sections[2]
    assert "  team " in sections[3]
    assert "  dev " in sections[4]
    # No deprecated alias is listed; one sentence says they still work.
    assert not {"list", "submit", "serve", "bench", "queues", "clusters"} & set(listed)
    assert "still work" in result.output


def test_every_listed_command_loads_under_its_name() -> None:
    ctx = click.Context(main)
    assert set(main.list_commands(ctx)) == ALL_COMMANDS
    for entries in SECTIONS.values():
        for name in entries:
            command = main.get_command(ctx, name)
            assert command is not None
            assert command.name == name
    for group, sections in ((server, SERVER_COMMANDS), (dev, DEV_COMMANDS)):
        assert set(group.list_commands(ctx)) == {name for section in sections.values() for name in section}
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            assert command is not None
            assert command.name == name
    sim = dev.get_command(ctx, "sim")
    assert isinstance(sim, click.Group)
    assert {"placement", "run", "generate", "study"} <= set(sim.commands)
    bench = dev.get_command(ctx, "bench")
    assert isinstance(bench, click.Group)
    assert {"schedule", "ingest", "submit"} <= set(bench.commands)
    workload = main.get_command(ctx, "workload")
    assert isinstance(workload, click.Group)
    assert set(workload.commands) == {"submit", "list", "show", "cancel", "watch"}


def test_unknown_command_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["lsit"])
    assert result.exit_code == 2
    assert "No such command 'lsit'" in result.output


# --- deprecated aliases -------------------------------------------------------------------------


@pytest.mark.parametrize(("old", "new"), sorted(DEPRECATED_ALIASES.items()))
def test_every_old_name_runs_the_command_that_replaced_it(old: str, new: tuple[str, ...]) -> None:
    ctx = click.Context(main)
    alias = main.get_command(ctx, old)
    replacement: click.Command | None = main
    for word in new:
        assert isinstance(replacement, click.Group)
        replacement = replacement.get_command(ctx, word)
    assert alias is not None
    assert replacement is not None
    assert alias.hidden
    assert alias.callback is replacement.callback
    assert [p.name for p in alias.params] == [p.name for p in replacement.params]


def test_up_and_the_client_basics_stay_top_level_and_are_not_deprecated() -> None:
    # `up` is the README's first command; status, login, context and completion are top level by design.
    kept = {"up", "status", "login", "context", "completion", "agent"}
    assert not kept & set(DEPRECATED_ALIASES)
    ctx = click.Context(main)
    for name in kept:
        command = main.get_command(ctx, name)
        assert command is not None
        assert not command.hidden
    result = CliRunner().invoke(main, ["up", "--help"])
    assert result.exit_code == 0, result.output
    assert result.stderr == ""


def test_an_old_name_says_the_new_one_on_stderr_and_still_works() -> None:
    result = CliRunner().invoke(main, ["nats-topology", "--prefix", "acme"])
    assert result.exit_code == 0, result.output
    assert result.stderr.strip() == (
        "`gpufleet nats-topology` is deprecated and goes away in the next release: use `gpufleet server nats-topology`"
    )
    assert "acme" in result.stdout
    # The grouped name says nothing on stderr and prints the same.
    grouped = CliRunner().invoke(main, ["server", "nats-topology", "--prefix", "acme"])
    assert grouped.exit_code == 0, grouped.output
    assert grouped.stderr == ""
    assert grouped.stdout == result.stdout


def test_an_old_group_name_keeps_its_verbs_and_its_help_names_the_new_command() -> None:
    result = CliRunner().invoke(main, ["sim", "--help"])
    assert result.exit_code == 0, result.output
    assert "use `gpufleet dev sim`" in result.stderr
    assert "placement" in result.stdout


def test_old_list_names_are_aliases_of_the_object_groups_list_verbs() -> None:
    result = CliRunner().invoke(main, ["queues", "--help"])
    assert "use `gpufleet queue list`" in result.stderr
    assert "--json" in result.stdout
    assert "-o, --output" in result.stdout
