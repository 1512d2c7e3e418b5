"""`gpufleet` starts without importing the daemons' and agent's libraries, and its help is grouped.

Import checks, never timings: a command that imports SQLAlchemy, nats-py or the Kubernetes client
costs seconds on every call, and only the modules it loaded say so reliably on a shared machine.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import click
import pytest
from click.testing import CliRunner

from controlplane.cli.main import SECTIONS, main

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
    "list", "submit", "show", "cancel", "queues", "clusters", "report", "audit", "job", "status", "watch",
    "login", "context", "completion", "cohort", "team", "queue", "priority-class", "token", "cluster",
)  # fmt: skip

ALL_COMMANDS = {
    "up", "init", "migrate", "serve", "run", "scheduler", "dispatcher", "ingest", "relay",
    "create-admin-token", "nats-topology", "nats-auth-config",
    "job", "login", "context", "completion", "status", "submit", "list", "show", "cancel", "watch", "queues",
    "clusters", "report", "audit",
    "cohort", "team", "queue", "priority-class", "token", "cluster",
    "agent", "bench", "sim", "scenario",
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


@pytest.mark.parametrize("command", CLIENT_COMMANDS)
def test_client_command_help_imports_no_heavy_library(command: str) -> None:
    loaded, out = loaded_heavy(command, "--help")
    assert f"Usage: gpufleet {command}" in out
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
    loaded, out = loaded_heavy("list", "--api", empty_api, "--token", "t")
    assert "no workloads match" in out
    assert loaded == []


def test_heavy_commands_still_load_their_modules() -> None:
    # The probe can see an import: `bench --help` loads the benchmark, which needs SQLAlchemy.
    loaded, out = loaded_heavy("bench", "--help")
    assert "Usage: gpufleet bench" in out
    assert "sqlalchemy" in loaded


def test_help_groups_every_command_once_under_its_section() -> None:
    result = CliRunner().invoke(main, ["--help"], terminal_width=100)
    assert result.exit_code == 0, result.output
    titles = re.findall(r"^(\S[^:\n]*):$", result.output, flags=re.MULTILINE)
    assert titles == [
        "Options",
        "Run the control plane",
        "Use it",
        "Manage the fleet",
        "Clusters and agents",
        "Developer tools",
    ]
    listed = re.findall(r"^  ([a-z][a-z-]*)  ", result.output, flags=re.MULTILINE)
    assert sorted(listed) == sorted(ALL_COMMANDS)
    assert len(listed) == len(set(listed))
    # Each command sits under its own heading.
    headings = r"^(?:Run the control plane|Use it|Manage the fleet|Clusters and agents|Developer tools):$"
    sections = re.split(headings, result.output, flags=re.MULTILINE)
    assert "  up " in sections[1]
    assert "  list " in sections[2]
    assert "  team " in sections[3]
    assert "  agent " in sections[4]
    assert "  bench " in sections[5]


def test_every_listed_command_loads_under_its_name() -> None:
    ctx = click.Context(main)
    assert set(main.list_commands(ctx)) == ALL_COMMANDS
    for entries in SECTIONS.values():
        for name in entries:
            command = main.get_command(ctx, name)
            assert command is not None
            assert command.name == name
    sim = main.get_command(ctx, "sim")
    assert isinstance(sim, click.Group)
    assert {"placement", "run", "generate", "study"} <= set(sim.commands)
    bench = main.get_command(ctx, "bench")
    assert isinstance(bench, click.Group)
    assert {"schedule", "ingest", "submit"} <= set(bench.commands)


def test_unknown_command_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["lsit"])
    assert result.exit_code == 2
    assert "No such command 'lsit'" in result.output
