"""Measure the two-scheduler layout on PostgreSQL under a long cycle (not a test; run by hand):

    uv run python -m tests.faults.ha_bench --gangs 3000 --seconds 60

Creates a throw-away database on the test PostgreSQL (GPUFLEET_TEST_PG, default 127.0.0.1:5432)
and its own nats-server, queues `--gangs` gangs on a small fleet (so most stay queued and every
cycle reads them all), times one cycle, then runs two `gpufleet server scheduler` processes with a lease
TTL shorter than that cycle (`--ttl`, default half of it) and samples the lease. Before leases
were renewed while worked, the two deposed each other every cycle; now the epoch should stay put
and no cycle should be thrown away ("is no longer current")."""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from adapters.nats.server import NatsServerProcess, free_port
from adapters.sql.migrate import upgrade_to_head
from controlplane.api.app import create_app
from controlplane.api.context import ApiContext
from controlplane.bootstrap import Wiring, utc_now
from controlplane.cli import seed
from controlplane.config import Settings
from controlplane.core.snapshot import Policy
from controlplane.service.scheduling import acquire_leadership, release_leadership, run_cycle
from tests.integration.fleet import admin_headers, h100_cluster

PG_ADMIN_URL = os.environ.get("GPUFLEET_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gangs", type=int, default=3000)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--ttl", type=float, default=0.0, help="lease TTL (default: half a measured cycle)")
    args = parser.parse_args()

    name = f"gpufleet_habench_{secrets.token_hex(4)}"
    admin_engine = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin_engine.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    work = Path(tempfile.mkdtemp(prefix="gpufleet-habench-"))
    nats = NatsServerProcess(free_port(), work / "nats")
    processes: list[subprocess.Popen[bytes]] = []
    try:
        nats.start()
        upgrade_to_head(url)
        settings = Settings(database_url=url, nats_url=nats.url, state_dir=work / "state")
        wiring = Wiring(settings)
        seed.seed_defaults(wiring)
        client = TestClient(create_app(ApiContext(uow_factory=wiring.uow, subject_prefix="habench")))
        admin = admin_headers(wiring)
        assert client.post("/v1/clusters", json=h100_cluster(nodes=2), headers=admin).status_code == 201
        assert client.post("/v1/teams", json={"name": "llm"}, headers=admin).status_code == 201
        assert client.post("/v1/queues", json={"name": "train", "team": "llm"}, headers=admin).status_code == 201
        token = client.post("/v1/tokens", json={"name": "t", "team": "llm"}, headers=admin).json()["token"]
        team = {"Authorization": f"Bearer {token}"}
        started = time.monotonic()
        for i in range(args.gangs):
            body = {"name": f"g{i}", "queue": "train", "pod_sets": [{"name": "w", "replicas": 2, "gpus": 8}]}
            assert client.post("/v1/workloads", json=body, headers=team).status_code == 201
        print(f"queued {args.gangs} gangs in {time.monotonic() - started:.1f} s")

        # One cycle, timed (it admits the few gangs that fit; the rest stay queued).
        epoch = acquire_leadership(wiring.uow, "probe", utc_now(), 600)
        assert epoch is not None
        started = time.monotonic()
        run_cycle(wiring.uow, "probe", epoch, Policy(), "habench", utc_now(), 600)
        cycle = time.monotonic() - started
        release_leadership(wiring.uow, "probe", epoch)
        ttl = args.ttl or round(cycle / 2, 2)
        print(f"one cycle: {cycle:.2f} s; lease TTL for the run: {ttl} s (renewed every {ttl / 3:.2f} s)")

        env = {
            **os.environ,
            "GPUFLEET_DATABASE_URL": url,
            "GPUFLEET_NATS_URL": nats.url,
            "GPUFLEET_SUBJECT_PREFIX": "habench",
            "GPUFLEET_STATE_DIR": str(work / "state"),
            "GPUFLEET_LEASE_TTL": str(ttl),
            "GPUFLEET_SCHEDULER_INTERVAL": "0.2",
        }
        logs = [work / f"scheduler-{n}.log" for n in "ab"]
        for log in logs:
            processes.append(
                subprocess.Popen(
                    [sys.executable, "-m", "controlplane.cli.main", "server", "scheduler"],
                    env=env,
                    stdout=log.open("ab"),
                    stderr=subprocess.STDOUT,
                )
            )
        epochs: list[int] = []
        deadline = time.monotonic() + args.seconds
        with wiring.engine.connect() as conn:
            while time.monotonic() < deadline:
                row = conn.execute(text("SELECT epoch FROM leader_leases WHERE name = 'scheduler'")).first()
                conn.commit()
                if row is not None and (not epochs or epochs[-1] != row[0]):
                    epochs.append(int(row[0]))
                time.sleep(0.25)
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            process.wait(30)
        text_logs = "".join(log.read_text(errors="replace") for log in logs)
        print(f"epochs seen in {args.seconds:.0f} s: {epochs}")
        print(f"terms started: {text_logs.count('leads scheduler with epoch')}")
        print(f"cycles thrown away (deposed): {text_logs.count('is no longer current')}")
        print(f"leases lost while renewing: {text_logs.count('lost its scheduler lease')}")
        print(f"failed cycles: {text_logs.count('scheduler cycle failed')}")
        wiring.close()
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
        nats.stop()
        with admin_engine.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin_engine.dispose()


if __name__ == "__main__":
    main()
