"""`gpufleet up` on a non-default port and state dir prints the export line, and a client shell that
runs it finds the API and its admin token (before, `gpufleet workload list` went to :8080 without a token)."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adapters.nats.server import free_port


def _banner(log: Path, up: subprocess.Popen[bytes], timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        if "Ctrl-C stops everything" in text:
            return text
        assert up.poll() is None, text
        time.sleep(0.2)
    raise AssertionError(f"no banner from gpufleet up:\n{log.read_text(errors='replace')}")


@pytest.mark.timeout(180)
def test_banner_export_line_lets_the_client_find_the_api(tmp_path: Path) -> None:
    state, home = tmp_path / "state", tmp_path / "home"
    port, nats_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    env.update(HOME=str(home), PYTHONUNBUFFERED="1")
    log = tmp_path / "up.log"
    with log.open("wb") as out:
        up = subprocess.Popen(
            [sys.executable, "-m", "controlplane.cli.main", "up", "--state-dir", str(state), "--port", str(port),
             "--nats-port", str(nats_port)],
            stdout=out, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    try:
        banner = _banner(log, up)
        lines = [line.strip() for line in banner.splitlines() if line.strip().startswith("export ")]
        assert lines == [f"export GPUFLEET_API=http://127.0.0.1:{port} GPUFLEET_STATE_DIR={state}"], banner
        client_env = {**env, **dict(word.split("=", 1) for word in shlex.split(lines[0])[1:])}
        listed = subprocess.run(
            [sys.executable, "-m", "controlplane.cli.main", "workload", "list"],
            env=client_env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert listed.returncode == 0, listed.stderr
        assert "no workloads match" in listed.stdout or "ID" in listed.stdout
        # The login line it prints saves a context (in this HOME): then no exports are needed.
        [login] = [line.strip() for line in banner.splitlines() if line.strip().startswith("gpufleet login ")]
        words = shlex.split(login)
        logged = subprocess.run(
            [sys.executable, "-m", "controlplane.cli.main", *words[1:]],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert logged.returncode == 0, logged.stderr
        listed = subprocess.run(
            [sys.executable, "-m", "controlplane.cli.main", "workload", "list"],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert listed.returncode == 0, listed.stderr
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(30)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait(10)
