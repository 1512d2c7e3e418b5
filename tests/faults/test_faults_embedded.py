"""Fault injection on the embedded layout (`gpufleet up`: SQLite, its own nats-server, every part
in one process). While gangs arrive steadily by REST and by NATS, SIGKILL the embedded
nats-server (up starts it again), then the whole `gpufleet up`, which is started again at once on
the same ports (TIME-WAIT connections must not make them "in use") and takes over its crashed
leases immediately; after the drain, the same proofs as on PostgreSQL. End to end, worth its time:
the only test of a crash of the whole embedded product under load."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from adapters.nats.server import free_port
from tests.faults.harness import Figures, Load, ReadyzProbe, count, drain_and_verify, eventually, start_load

ENV = {
    "GPUFLEET_SCHEDULER_INTERVAL": "0.2",
    "GPUFLEET_DISPATCHER_INTERVAL": "0.1",
    "GPUFLEET_RELAY_INTERVAL": "0.1",
    "GPUFLEET_SIM_START_DELAY": "0.2",
}


def _start(state: Path, port: int, nats_port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **ENV}
    env.pop("GPUFLEET_DATABASE_URL", None)
    args = ["up", "--state-dir", str(state), "--port", str(port), "--nats-port", str(nats_port)]
    return subprocess.Popen(
        [sys.executable, "-m", "controlplane.cli.main", *args],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        env=env,
    )


def _nats_pids(up: subprocess.Popen[bytes]) -> list[int]:
    """The nats-server children of this `gpufleet up` (however it is configured)."""
    command = ["pgrep", "-P", str(up.pid), "-f", "nats-server"]
    found = subprocess.run(command, capture_output=True, text=True, check=False)
    return [int(p) for p in found.stdout.split()]


def _alive(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def _since(moment: datetime) -> str:
    return moment.replace(tzinfo=None).isoformat(sep=" ")  # SQLite keeps naive UTC text


@pytest.mark.timeout(600)
def test_kill_embedded_nats_and_the_whole_up_under_load(tmp_path: Path) -> None:
    state = tmp_path / "state"
    port, nats_port = free_port(), free_port()
    base = f"http://127.0.0.1:{port}"
    db = f"sqlite:///{state / 'gpufleet.db'}"
    nats_url = f"nats://127.0.0.1:{nats_port}"
    log = tmp_path / "up.log"
    figures = Figures()
    probe = ReadyzProbe(lambda: base)
    load: Load | None = None
    up = _start(state, port, nats_port, log)
    try:
        eventually(lambda: httpx.get(f"{base}/readyz", timeout=2).status_code == 200, 150, "up ready")
        admin = {"Authorization": f"Bearer {(state / 'admin.token').read_text().strip()}"}
        load = start_load(base, admin, db, nats_url, "gpufleet", figures, probe)

        # 1. The embedded nats-server: `up` starts it again on its store; everyone reconnects.
        [nats_pid] = _nats_pids(up)
        killed_at, killed_wall = time.monotonic(), datetime.now(UTC)
        os.kill(nats_pid, signal.SIGKILL)
        eventually(lambda: bool(set(_nats_pids(up)) - {nats_pid}), 30, "nats-server started again by up")
        figures.recovery["embedded nats-server (kill to first gang started from a pod report)"] = eventually(
            lambda: count(db, f"SELECT count(*) FROM runs WHERE started_at > '{_since(killed_wall)}'") > 0,
            60,
            "pod reports flow again",
        )
        figures.readyz["embedded nats-server kill"] = probe.between(killed_at, time.monotonic())
        assert "503" in figures.readyz["embedded nats-server kill"]

        # 2. The whole of `gpufleet up`, started again at once on the same ports.
        children = _nats_pids(up)
        up.send_signal(signal.SIGKILL)
        up.wait(10)
        killed_at = time.monotonic()
        eventually(lambda: not any(_alive(p) for p in children), 10, "nats-server died with up")
        up = _start(state, port, nats_port, log)
        figures.recovery["gpufleet up (kill to /readyz 200 after an immediate restart)"] = eventually(
            lambda: httpx.get(f"{base}/readyz", timeout=2).status_code == 200, 150, "up ready again"
        )
        assert up.poll() is None, "the restart was refused"
        restarted_wall = datetime.now(UTC)
        eventually(lambda: load is not None and load.first_rest_ack_after(killed_at) is not None, 60, "REST again")
        figures.recovery["gpufleet up (kill to first REST 201)"] = load.first_rest_ack_after(killed_at) or 0.0
        figures.recovery["gpufleet up (ready to first admission)"] = eventually(
            lambda: count(db, f"SELECT count(*) FROM runs WHERE created_at > '{_since(restarted_wall)}'") > 0,
            60,
            "admissions again",
        )
        figures.readyz["gpufleet up kill"] = probe.between(killed_at, time.monotonic())

        acked = drain_and_verify(
            load, db, nats_url, "gpufleet", state / "sim", drain_timeout=90, secrets_file=state / "nats-secrets.json"
        )
        print(f"\nfault suite on SQLite (gpufleet up): {acked} acknowledged gangs\n" + figures.render())
    finally:
        if load is not None:
            load.stop()
        probe.stop()
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(30)
        except subprocess.TimeoutExpired:
            up.kill()
