"""Fault injection on the production layout: the parts as separate processes on a private
PostgreSQL and an external nats-server, two schedulers and two dispatchers. While gangs arrive
steadily by REST and by NATS, SIGKILL in turn the scheduler leader, the dispatcher leader
mid-dispatch, nats-server and PostgreSQL; then, after the drain, prove that no acknowledged
submission was lost, no run was dispatched twice, and every workload's events are in the stream
exactly once each, complete and in order; and that `/readyz` said 503 while NATS or the
database was down. End to end and worth its ~60-90 s: it is the only test that kills real
processes of every kind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text

from adapters.nats.server import NatsServerProcess, free_port
from tests.faults.harness import Figures, Load, ReadyzProbe, count, drain_and_verify, eventually, start_load
from tests.faults.private_pg import PrivatePostgres, available
from tests.integration.fleet import h100_cluster

pytestmark = pytest.mark.skipif(not available(), reason="PostgreSQL server binaries are not installed")

LEASE_TTL = 3.0
OUTAGE_SECONDS = 3.0


class Plane:
    """gpufleet processes: `front` runs the API, ingest and relay; `node-a` and `node-b` each run a
    scheduler and a dispatcher (one leads each by lease, the other stands by). A killed node is
    started again at once, as a process supervisor would."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env, self.logs = env, logs
        self.processes: dict[str, tuple[subprocess.Popen[bytes], tuple[str, ...]]] = {}

    def run(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = (self.logs / f"{name}.log").open("ab")
        process = subprocess.Popen(
            [sys.executable, "-m", "controlplane.cli.main", *args], env=self.env, stdout=log, stderr=subprocess.STDOUT
        )
        self.processes[name] = (process, args)
        return process

    def log_size(self, name: str) -> int:
        return (self.logs / f"{name}.log").stat().st_size

    def started(self, name: str, since: int) -> bool:
        """Whether the node's scheduler and dispatcher have each taken a lease or stood by."""
        with (self.logs / f"{name}.log").open("rb") as f:
            f.seek(since)
            text = f.read().decode(errors="replace")
        return all(
            f"stands by: another holder has the {lease} lease" in text or f"leads {lease} with epoch" in text
            for lease in ("scheduler", "dispatcher")
        )

    def kill_and_restart(self, holder: str) -> tuple[str, int]:
        """SIGKILL the process whose pid is in a lease holder id (`component@host:pid:nonce`) and
        start it again; returns its name and where its log continues."""
        pid = int(holder.split(":")[1])
        name = next(n for n, (p, _) in self.processes.items() if p.pid == pid)
        process, args = self.processes[name]
        process.send_signal(signal.SIGKILL)
        process.wait(10)
        since = self.log_size(name)
        self.run(name, *args)
        return name, since

    def stop(self) -> None:
        for process, _ in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process, _ in self.processes.values():
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()


@pytest.fixture
def private_pg() -> Iterator[PrivatePostgres]:
    pg = PrivatePostgres()
    pg.start()
    yield pg
    pg.stop()


@pytest.fixture
def own_nats(tmp_path: Path) -> Iterator[NatsServerProcess]:
    server = NatsServerProcess(free_port(), tmp_path / "nats", log_file=tmp_path / "nats-server.log")
    server.start()
    yield server
    server.stop(kill=True)


def _sql(url: str, query: str) -> list[tuple[object, ...]]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text(query)).all()]
    finally:
        engine.dispose()


def _lease(url: str, name: str) -> tuple[str, int]:
    [(holder, epoch)] = _sql(url, f"SELECT holder, epoch FROM leader_leases WHERE name = '{name}'")
    return str(holder), int(epoch)  # type: ignore[call-overload]


@pytest.mark.timeout(600)
def test_kill_leader_dispatcher_nats_and_postgresql_under_load(
    private_pg: PrivatePostgres, own_nats: NatsServerProcess, tmp_path: Path
) -> None:
    db = private_pg.url
    state = tmp_path / "state"
    env = {
        **os.environ,
        "GPUFLEET_DATABASE_URL": db,
        "GPUFLEET_NATS_URL": own_nats.url,
        "GPUFLEET_SUBJECT_PREFIX": "faults",
        "GPUFLEET_STATE_DIR": str(state),
        "GPUFLEET_API_PORT": str(free_port()),
        "GPUFLEET_SCHEDULER_INTERVAL": "0.2",
        "GPUFLEET_LEASE_TTL": str(LEASE_TTL),
        "GPUFLEET_DISPATCHER_INTERVAL": "0.1",
        "GPUFLEET_RELAY_INTERVAL": "0.1",
        "GPUFLEET_SIM_START_DELAY": "0.2",
        # The product's own rescues of a gang whose start, dispatch or objects were lost around a fault,
        # made short so the drain below sees them (the defaults, 600 s, 300 s and 60 s + 30 s, outlast it).
        "GPUFLEET_GANG_START_TIMEOUT": "30",
        "GPUFLEET_DISPATCH_TIMEOUT": "30",
        "GPUFLEET_ORPHAN_GC_INTERVAL": "5",
        "GPUFLEET_VANISHED_RUN_GRACE": "20",
    }
    plane = Plane(env, tmp_path)
    figures = Figures()
    base = f"http://127.0.0.1:{env['GPUFLEET_API_PORT']}"
    probe = ReadyzProbe(lambda: base)
    load: Load | None = None
    try:
        token_file = tmp_path / "admin.token"
        assert plane.run("init", "server", "init", "--admin-token-file", str(token_file)).wait(60) == 0
        plane.run("front", "server", "run", "api", "ingest", "relay")
        plane.run("node-a", "server", "run", "scheduler", "dispatcher")
        plane.run("node-b", "server", "run", "scheduler", "dispatcher")
        # Slow on a busy 2-core machine: each process imports the Kubernetes and cloud SDKs.
        eventually(lambda: httpx.get(f"{base}/readyz", timeout=2).status_code == 200, 150, "plane ready")
        eventually(lambda: plane.started("node-a", 0) and plane.started("node-b", 0), 150, "both nodes")
        admin = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
        assert httpx.post(f"{base}/v1/clusters", json=h100_cluster(nodes=4), headers=admin).status_code == 201
        load = start_load(base, admin, db, own_nats.url, "faults", figures, probe)

        # 1. The scheduler leader: the standby takes over once the lease runs out.
        holder, epoch = _lease(db, "scheduler")
        killed_at = time.monotonic()
        node, since = plane.kill_and_restart(holder)
        figures.recovery["scheduler leader (kill to first admission by the standby)"] = eventually(
            lambda: count(db, f"SELECT count(*) FROM runs WHERE epoch > {epoch}") > 0, 30, "standby admits"
        )
        figures.readyz["scheduler leader kill"] = probe.between(killed_at, time.monotonic())
        assert _lease(db, "scheduler")[1] == epoch + 1
        eventually(lambda: plane.started(node, since), 150, f"{node} restarted")

        # 2. The dispatcher leader, mid-dispatch (while runs wait to be applied, when there are).
        eventually(
            lambda: count(db, "SELECT count(*) FROM runs WHERE dispatch_state = 'pending'") > 0, 10, "pending run"
        )
        holder, dispatcher_epoch = _lease(db, "dispatcher")
        killed_wall = datetime.now(UTC).isoformat()
        killed_at = time.monotonic()
        plane.kill_and_restart(holder)
        figures.recovery["dispatcher (kill to first dispatch by the standby)"] = eventually(
            lambda: count(db, f"SELECT count(*) FROM runs WHERE dispatched_at > '{killed_wall}'") > 0,
            30,
            "standby dispatches",
        )
        figures.readyz["dispatcher kill"] = probe.between(killed_at, time.monotonic())
        assert _lease(db, "dispatcher")[1] == dispatcher_epoch + 1
        # The restarted node comes back as a standby while the next faults play (not awaited).

        # 3. nats-server, killed and restarted on its own store after a few seconds.
        own_nats.stop(kill=True)
        assert own_nats.process is not None
        own_nats.process.wait(10)
        killed_at = time.monotonic()
        time.sleep(OUTAGE_SECONDS)
        figures.readyz["nats-server down"] = during = probe.between(killed_at + 1.0, time.monotonic())
        own_nats.start()
        restarted_wall = datetime.now(UTC).isoformat()
        assert set(during) == {"503"}, during
        figures.recovery["nats-server (restart to first gang started from a pod report)"] = eventually(
            lambda: count(db, f"SELECT count(*) FROM runs WHERE started_at > '{restarted_wall}'") > 0,
            60,
            "pod reports flow again",
        )

        # 4. PostgreSQL (all its processes at once), restarted after a few seconds.
        private_pg.kill()
        killed_at = time.monotonic()
        time.sleep(OUTAGE_SECONDS)
        figures.readyz["postgresql down"] = during = probe.between(killed_at + 1.0, time.monotonic())
        private_pg.start()
        restarted_at = time.monotonic()
        restarted_wall = datetime.now(UTC).isoformat()
        assert set(during) == {"503"}, during
        eventually(lambda: load is not None and load.first_rest_ack_after(restarted_at) is not None, 60, "REST again")
        figures.recovery["postgresql (restart to first REST 201)"] = load.first_rest_ack_after(restarted_at) or 0.0
        eventually(
            lambda: count(db, f"SELECT count(*) FROM runs WHERE created_at > '{restarted_wall}'") > 0,
            60,
            "admissions again",
        )
        figures.recovery["postgresql (restart to first admission)"] = time.monotonic() - restarted_at

        acked = drain_and_verify(load, db, own_nats.url, "faults", state / "sim", drain_timeout=150)
        print(f"\nfault suite on PostgreSQL: {acked} acknowledged gangs\n" + figures.render())
    finally:
        if load is not None:
            load.stop()
        probe.stop()
        plane.stop()
