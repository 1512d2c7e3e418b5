"""More than one machine, on a three-server JetStream cluster: gpufleet's streams and consumers
replicated three times (`GPUFLEET_NATS_REPLICAS=3`), two control-plane processes each running
`gpufleet run ingest relay` (two ingest workers sharing the one durable consumer, two auth-callout
responders in one queue group, two relays of which one holds the lease) against all three servers,
with gpufleet's NATS authentication. A team submits over NATS steadily, each submission retried
with its id until JetStream acknowledges it; mid-run the server leading the inbound stream is
SIGKILLed. Then: every acknowledged submission is in SQL exactly once, the inbound consumer has
nothing left, every outbox event is in the replicated events stream exactly once, and the server
started again on its store catches up."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from adapters.nats import secrets as nats_secrets
from adapters.nats.topology import EVENTS_STREAM, INBOUND_STREAM, INGEST_CONSUMER
from controlplane.bootstrap import Wiring
from controlplane.cli import seed
from controlplane.config import Settings
from tests.faults.harness import Figures, Load, eventually, read_events, workload_states
from tests.faults.nats_cluster import NatsCluster
from tests.integration.fleet import Tenant

REPLICAS = 3
LEASE_TTL = 3.0


@pytest.fixture
def database_url(empty_postgresql: str) -> str:
    """PostgreSQL only: the layout with several control-plane processes."""
    return empty_postgresql


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    auth = nats_secrets.load_or_create(tmp_path / "nats-secrets.json").server_auth()
    nats_cluster = NatsCluster(tmp_path / "nats", auth=auth)
    try:
        nats_cluster.start()
        yield nats_cluster
    finally:
        nats_cluster.stop()


class Processes:
    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env, self.logs = env, logs
        self.running: dict[str, subprocess.Popen[bytes]] = {}

    def run(self, name: str, *args: str) -> None:
        log = (self.logs / f"{name}.log").open("ab")
        self.running[name] = subprocess.Popen(
            [sys.executable, "-m", "controlplane.cli.main", *args], env=self.env, stdout=log, stderr=subprocess.STDOUT
        )

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def serving(self, name: str) -> bool:
        """Past start-up: the topology is declared, the callout answers and the relay took or
        waits for its lease."""
        assert self.running[name].poll() is None, f"{name} exited:\n{self.log(name)[-3000:]}"
        log = self.log(name)
        return "another holder has the relay lease" in log or "leads relay with epoch" in log

    def stop(self) -> None:
        for process in self.running.values():
            if process.poll() is None:
                process.terminate()
        for process in self.running.values():
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()


async def _jetstream(cluster: NatsCluster, what: str) -> Any:
    nc = await nats.connect(cluster.live_url().split(","), connect_timeout=2, **cluster.credentials())
    try:
        js = nc.jetstream()
        if what == "inbound leader":
            return (await js.stream_info(INBOUND_STREAM)).cluster
        if what == "ingest consumer":
            return await js.consumer_info(INBOUND_STREAM, INGEST_CONSUMER)
        streams = [await js.stream_info(name) for name in (INBOUND_STREAM, EVENTS_STREAM)]
        return [(s.config.name, s.config.num_replicas, s.cluster) for s in streams]
    finally:
        await nc.close()


def _outbox(url: str) -> list[tuple[str, dict[str, Any], bool]]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT id, payload, published_at FROM outbox ORDER BY seq")).all()
    finally:
        engine.dispose()
    return [(str(r.id), json.loads(r.payload), r.published_at is not None) for r in rows]


@pytest.mark.timeout(240)
def test_a_three_server_jetstream_cluster_loses_a_server_and_nothing_acknowledged(
    cluster: NatsCluster, settings: Settings, wiring: Wiring, client: TestClient, tenant: Tenant, tmp_path: Path
) -> None:
    seed.seed_defaults(wiring)
    secrets_file = tmp_path / "nats-secrets.json"
    prefix = settings.subject_prefix
    env = {
        **os.environ,
        "GPUFLEET_DATABASE_URL": settings.database_url,
        "GPUFLEET_NATS_URL": cluster.url,
        "GPUFLEET_NATS_REPLICAS": str(REPLICAS),
        "GPUFLEET_NATS_SECRETS_FILE": str(secrets_file),
        "GPUFLEET_SUBJECT_PREFIX": prefix,
        "GPUFLEET_STATE_DIR": str(tmp_path / "state"),
        "GPUFLEET_LEASE_TTL": str(LEASE_TTL),
        "GPUFLEET_RELAY_INTERVAL": "0.1",
    }
    processes = Processes(env, tmp_path)
    figures = Figures()
    load: Load | None = None
    try:
        processes.run("a", "run", "ingest", "relay")
        processes.run("b", "run", "ingest", "relay")
        # Slow on a busy 2-core machine: each process imports the Kubernetes and cloud SDKs.
        eventually(lambda: processes.serving("a") and processes.serving("b"), 150, "both processes serving")
        for name, replicas, info in asyncio.run(_jetstream(cluster, "streams")):
            assert replicas == REPLICAS, name
            assert info is not None, name
            assert 1 + len(info.replicas or []) == REPLICAS, (name, info)

        load = Load(lambda: "", tenant.token, tenant.queue, cluster.url, prefix, figures, None, 0.1, tenant.team)
        load.start()
        eventually(lambda: load is not None and len(load.acked) >= 15, 60, "15 acknowledged submissions")

        # SIGKILL the server leading the inbound stream (and so its ingest consumer's leader, usually).
        leader = asyncio.run(_jetstream(cluster, "inbound leader")).leader
        cluster.kill(leader)
        before_kill = len(load.acked)
        eventually(
            lambda: asyncio.run(_jetstream(cluster, "inbound leader")).leader not in (None, leader),
            30,
            "a new leader of the inbound stream",
        )
        eventually(lambda: load is not None and len(load.acked) >= before_kill + 15, 60, "15 more acknowledgements")
        load.stop()
        acked = dict(load.acked)

        # Every acknowledged submission is in SQL exactly once.
        db = settings.database_url
        eventually(lambda: set(acked) <= set(workload_states(db)), 60, "every acknowledged submission in SQL")
        states = workload_states(db)
        doubled = {name: rows for name, rows in states.items() if len(rows) > 1}
        assert not doubled, f"one submission became several workloads: {doubled}"
        unexpected = set(states) - set(acked)
        assert len(unexpected) <= 1, f"workloads nobody submitted: {unexpected}"  # at most the one in flight at stop

        def consumed() -> bool:
            info = asyncio.run(_jetstream(cluster, "ingest consumer"))
            return bool(info.num_pending == 0 and info.num_ack_pending == 0)

        eventually(consumed, 30, "the ingest consumer has nothing left")

        # Every outbox event is published, and in the replicated events stream exactly once.
        eventually(lambda: all(published for _, _, published in _outbox(db)), 30, "relay idle")
        events = asyncio.run(read_events(cluster.live_url(), prefix, secrets_file))
        counts = Counter(e["id"] for e in events)
        assert not [i for i, c in counts.items() if c > 1], "events published more than once"
        wanted = {event_id for event_id, payload, _ in _outbox(db) if payload["type"].startswith("workload.")}
        assert wanted, "no workload events"
        assert wanted == set(counts), f"outbox events missing from the stream: {sorted(wanted - set(counts))[:5]}"

        # The killed server, started again on its store, catches up with the two that kept going.
        cluster.servers[leader].start()

        def caught_up() -> bool:
            return all(
                info is not None and all(peer.current and not peer.offline for peer in info.replicas or [])
                for _, _, info in asyncio.run(_jetstream(cluster, "streams"))
            )

        eventually(caught_up, 60, f"{leader} current again")
        print(
            f"\n3-server JetStream cluster, {leader} killed: {len(acked)} acknowledged submissions "
            f"({before_kill} before the kill), {len(wanted)} events\n" + figures.render()
        )
    finally:
        if load is not None:
            load.stop()
        processes.stop()
