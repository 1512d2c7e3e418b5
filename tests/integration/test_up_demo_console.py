"""`gpufleet up --demo` tells its story on the console: the banner (naming the log file), then
time-stamped story lines with their topic (the fleet's progress, the demo's steps, the idle policy's
findings), warnings if any, and no INFO line; the components' INFO lines go to the log file.
Before, the story lines were buried under every component's INFO lines, and Ctrl-C printed a
warning per NATS connection closed."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from adapters.nats.server import free_port
from controlplane import logs
from controlplane.cli import demo

STORY = re.compile(rf"^\d\d:\d\d:\d\d  +({'|'.join(map(re.escape, demo.STORY_STYLES))}) \| \S")
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")


@pytest.fixture
def root_logging() -> Iterator[None]:
    """configure() replaces the root logger's handlers: put pytest's back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


def test_with_a_log_file_the_console_gets_warnings_only(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], root_logging: None
) -> None:
    log_file = tmp_path / "gpufleet.log"
    logs.configure("text", verbose=False, log_file=log_file)
    log = logging.getLogger("gpufleet.scheduler")
    log.info("cycle 1 admitted 3 gangs")
    log.warning("could not renew its scheduler lease: timeout")
    console = capfd.readouterr().err
    assert "cycle 1 admitted" not in console
    assert "WARNING gpufleet.scheduler: could not renew its scheduler lease" in console
    written = log_file.read_text()
    assert "INFO gpufleet.scheduler: cycle 1 admitted 3 gangs" in written
    assert "WARNING gpufleet.scheduler: could not renew" in written

    # -v: everything on the console as well; json: the file's lines are JSON too
    logs.configure("json", verbose=True, log_file=log_file)
    log.debug("considered 12 gangs")
    assert '"message": "considered 12 gangs"' in capfd.readouterr().err
    assert '"message": "considered 12 gangs"' in log_file.read_text()


def test_story_lines_carry_time_and_topic_and_stand_out_on_a_terminal() -> None:
    line = demo.story_line("anti-hoarding", "idle.notify demo-hoarder", datetime(2026, 1, 2, 3, 4, 5))
    assert line == "03:04:05  anti-hoarding | idle.notify demo-hoarder"
    assert STORY.match(demo.story_line("fleet", "workloads: running 1"))
    with pytest.raises(ValueError, match="unknown story topic"):
        demo.story_line("gossip", "x")

    @click.command()
    def tell() -> None:
        demo.story("demo", "submitted demo-hoarder")

    coloured = CliRunner().invoke(tell, color=True).output
    assert coloured.startswith("\x1b[")  # in colour
    assert "\x1b[1m" in coloured  # bold
    assert "demo | submitted demo-hoarder" in coloured
    plain = CliRunner().invoke(tell, color=False).output  # not a terminal: no escape codes
    assert "\x1b" not in plain
    assert STORY.match(plain)


@pytest.mark.timeout(120)
def test_up_demo_console_shows_the_story_and_the_log_file_the_rest(tmp_path: Path) -> None:
    state, home = tmp_path / "state", tmp_path / "home"
    port, nats_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    env.update(HOME=str(home), PYTHONUNBUFFERED="1")
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        up = subprocess.Popen(
            [sys.executable, "-m", "controlplane.cli.main", "up", "--demo", "--state-dir", str(state),
             "--port", str(port), "--nats-port", str(nats_port)],
            stdout=stdout, stderr=stderr, env=env,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while "submitted demo-hoarder" not in out.read_text(errors="replace"):
            assert up.poll() is None, out.read_text() + err.read_text()
            assert time.monotonic() < deadline, out.read_text() + err.read_text()
            time.sleep(0.2)
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(30)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait(10)
    console = out.read_text()
    banner, _, after = console.partition(
        "Ctrl-C stops everything; running `gpufleet up` again resumes where it stopped.\n"
    )
    assert f"  logs        {state / 'gpufleet.log'}" in banner
    told = [line for line in after.splitlines() if line and line != "gpufleet stopped"]
    assert told, console
    assert all(STORY.match(line) for line in told), told
    assert any(
        line.endswith("| submitted demo-hoarder (team demo, 32 A100-40GB GPUs, goes idle after 45 s)") for line in told
    )
    # Ctrl-C is not a fault: no connection of ours is reported lost when we close it, and no team
    # connects while the control plane stops (the demo used to submit its second gang on the way out).
    errors = err.read_text()
    assert ": disconnected" not in errors, errors
    assert "Authorization Violation" not in errors, errors
    # No INFO line on the console, on either stream; the components' lines are in the log file.
    for stream in (console, errors):
        assert not [line for line in stream.splitlines() if " INFO " in line], stream
    written = (state / "gpufleet.log").read_text()
    assert re.search(r"^\S+ \S+ INFO alembic\.runtime\.migration: Running upgrade", written, re.M), written[:2000]
    assert all(LOG_LINE.match(line) for line in written.splitlines() if line and not line.startswith((" ", "\t")))
