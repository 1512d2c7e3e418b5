"""The parts run as separate processes against PostgreSQL and an external nats-server, as in
production: two schedulers elect one leader, and when it is killed the other takes over with a
higher epoch while gangs keep flowing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text

from adapters.nats.server import NatsServerProcess, free_port
from tests.integration.fleet import gang, h100_cluster


class Plane:
    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env = env
        self.logs = logs
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def run(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = (self.logs / f"{name}.log").open("ab")
        process = subprocess.Popen(
            [sys.executable, "-m", "controlplane.cli.main", *args], env=self.env, stdout=log, stderr=subprocess.STDOUT
        )
        self.processes[name] = process
        return process

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()


@pytest.fixture
def plane(empty_postgresql: str, running_nats: NatsServerProcess, tmp_path: Path) -> Iterator[Plane]:
    env = {
        **os.environ,
        "GPUFLEET_DATABASE_URL": empty_postgresql,
        "GPUFLEET_NATS_URL": running_nats.url,
        "GPUFLEET_SUBJECT_PREFIX": f"mp{os.getpid()}",
        "GPUFLEET_STATE_DIR": str(tmp_path / "state"),
        "GPUFLEET_API_PORT": str(free_port()),
        "GPUFLEET_SCHEDULER_INTERVAL": "0.2",
        # Short enough for a quick failover, long enough that a busy 2-core machine does not
        # lose a lease between renewals.
        "GPUFLEET_LEASE_TTL": "6",
        "GPUFLEET_DISPATCHER_INTERVAL": "0.1",
        "GPUFLEET_SIM_START_DELAY": "0.2",
        "GPUFLEET_CHECK_INVARIANTS": "true",
    }
    p = Plane(env, tmp_path)
    yield p
    p.stop()


def _eventually(check: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise AssertionError("condition not reached in time")


@pytest.mark.timeout(240)
def test_separate_processes_with_scheduler_failover(plane: Plane, empty_postgresql: str, tmp_path: Path) -> None:
    token_file = tmp_path / "admin.token"
    init = plane.run("init", "server", "init", "--admin-token-file", str(token_file))
    assert init.wait(60) == 0
    for name in ("serve", "scheduler-a", "scheduler-b", "dispatcher", "ingest", "relay"):
        plane.run(name, "server", name.split("-")[0])
    base = f"http://127.0.0.1:{plane.env['GPUFLEET_API_PORT']}"

    def ready() -> bool:
        try:
            return httpx.get(f"{base}/readyz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    # Six Python processes importing every cloud SDK at once: on 2 busy cores that alone took over 60 s.
    _eventually(ready, 120)
    admin = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
    assert httpx.post(f"{base}/v1/clusters", json=h100_cluster(nodes=4), headers=admin).status_code == 201
    assert httpx.post(f"{base}/v1/teams", json={"name": "llm"}, headers=admin).status_code == 201
    assert httpx.post(f"{base}/v1/queues", json={"name": "train", "team": "llm"}, headers=admin).status_code == 201
    team = {
        "Authorization": "Bearer "
        + httpx.post(f"{base}/v1/tokens", json={"name": "t", "team": "llm"}, headers=admin).json()["token"]
    }

    def submit(name: str) -> str:
        r = httpx.post(f"{base}/v1/workloads", json=gang(name, "train", replicas=2, duration_seconds=1), headers=team)
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    def succeeded(ids: list[str]) -> bool:
        return all(httpx.get(f"{base}/v1/workloads/{i}", headers=team).json()["state"] == "succeeded" for i in ids)

    first = [submit(f"a{i}") for i in range(3)]
    _eventually(lambda: succeeded(first), 90)

    engine = create_engine(empty_postgresql)
    with engine.connect() as conn:
        holder, epoch = conn.execute(text("SELECT holder, epoch FROM leader_leases WHERE name = 'scheduler'")).one()
        epochs = {row[0] for row in conn.execute(text("SELECT DISTINCT epoch FROM runs"))}
    assert epoch == 1
    assert epochs == {1}
    leader_pid = int(holder.split(":")[1])
    leader = next(n for n, p in plane.processes.items() if p.pid == leader_pid)
    assert leader in ("scheduler-a", "scheduler-b")
    plane.processes[leader].send_signal(signal.SIGKILL)

    second = [submit(f"b{i}") for i in range(2)]
    _eventually(lambda: succeeded(second), 90)
    with engine.connect() as conn:
        new_holder, new_epoch = conn.execute(
            text("SELECT holder, epoch FROM leader_leases WHERE name = 'scheduler'")
        ).one()
        later = {
            row[0]
            for row in conn.execute(
                text(
                    "SELECT DISTINCT r.epoch FROM runs r JOIN workloads w ON "
                    "w.id = r.workload_id WHERE w.name LIKE 'b%'"
                )
            )
        }
    engine.dispose()
    assert new_epoch == 2
    assert new_holder != holder
    assert later == {2}
