"""More than one machine, on a three-server JetStream cluster: gpufleet's streams and consumers
replicated three times (`GPUFLEET_NATS_REPLICAS=3`), two control-plane processes each running
`gpufleet server run api ingest relay` against all three servers with gpufleet's NATS authentication: two
API replicas behind one PostgreSQL, two ingest and two telemetry workers sharing the durable
consumers, two auth-callout responders in one queue group, two relays of which one holds the
lease. A team submits steadily over NATS and over REST (each attempt to the other API replica),
and a cluster agent publishes DCGM batches, each retried with its id until acknowledged; mid-run
the server leading the inbound stream is SIGKILLed, and later the process holding the relay lease
(with its API, ingest and telemetry workers). Then: every acknowledged submission is in SQL
exactly once, every acknowledged telemetry batch folded exactly once, the consumers have nothing
left, every outbox event is in the replicated events stream exactly once, and the server started
again on its store catches up; the surviving relay took the lease with the next epoch."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import nats
import nats.errors
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from adapters.nats import secrets as nats_secrets
from adapters.nats.server import free_port
from adapters.nats.topology import (
    EVENTS_STREAM,
    INBOUND_STREAM,
    SUBMIT_CONSUMER,
    TELEMETRY_CONSUMER,
    TELEMETRY_STREAM,
    ensure_topology,
    topology,
)
from controlplane.bootstrap import Wiring, utc_now
from controlplane.cli import seed
from controlplane.config import Settings
from controlplane.service import nats_identity
from tests.faults.harness import Figures, Load, TelemetryLoad, eventually, read_events, workload_states
from tests.faults.nats_cluster import NatsCluster
from tests.integration.fleet import Tenant

REPLICAS = 3
LEASE_TTL = 3.0
STREAMS = [str(s.name) for s in topology().streams]


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

    def run(self, name: str, *args: str, **env: str) -> None:
        log = (self.logs / f"{name}.log").open("ab")
        self.running[name] = subprocess.Popen(
            [sys.executable, "-m", "controlplane.cli.main", *args],
            env={**self.env, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def serving(self, name: str) -> bool:
        """Past start-up: the topology is declared, the callout answers and the relay took or
        waits for its lease."""
        assert self.running[name].poll() is None, f"{name} exited:\n{self.log(name)[-3000:]}"
        log = self.log(name)
        return "another holder has the relay lease" in log or "leads relay with epoch" in log

    def by_pid(self, pid: int) -> str:
        [name] = [n for n, p in self.running.items() if p.pid == pid]
        return name

    def kill(self, name: str) -> None:
        self.running[name].kill()
        self.running[name].wait(10)

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
        js = nc.jetstream(timeout=1.0)  # short: the leader is polled for while an election runs
        if what == "inbound leader":
            return (await js.stream_info(INBOUND_STREAM)).cluster
        if what == "ingest consumer":
            return await js.consumer_info(INBOUND_STREAM, SUBMIT_CONSUMER)
        if what == "telemetry consumer":
            return await js.consumer_info(TELEMETRY_STREAM, TELEMETRY_CONSUMER)
        streams = [await js.stream_info(name) for name in (INBOUND_STREAM, EVENTS_STREAM)]
        return [(s.config.name, s.config.num_replicas, s.cluster) for s in streams]
    finally:
        await nc.close()


def _telemetry(url: str, cluster: str) -> tuple[set[str], int]:
    """(ids of the cluster's batches in the telemetry inbox, samples folded into its windows)."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            ids = conn.execute(
                text("SELECT msg_id FROM inbox WHERE consumer = :c AND msg_id LIKE :p"),
                {"c": "telemetry", "p": f"cluster:{cluster}/%"},
            ).scalars()
            inbox = {str(i).removeprefix(f"cluster:{cluster}/") for i in ids}
            samples = conn.execute(
                text("SELECT coalesce(sum(samples), 0) FROM telemetry_windows WHERE cluster = :c"), {"c": cluster}
            ).scalar_one()
    finally:
        engine.dispose()
    return inbox, int(samples)


def _sql(url: str, query: str) -> list[tuple[Any, ...]]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.execute(text(query)).all()]
    finally:
        engine.dispose()


def _outbox(url: str) -> list[tuple[str, dict[str, Any], bool]]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT id, payload, published_at FROM outbox ORDER BY seq")).all()
    finally:
        engine.dispose()
    return [(str(r.id), json.loads(r.payload), r.published_at is not None) for r in rows]


@pytest.mark.timeout(300)
def test_a_three_server_jetstream_cluster_loses_a_server_and_nothing_acknowledged(
    cluster: NatsCluster, settings: Settings, wiring: Wiring, client: TestClient, tenant: Tenant, tmp_path: Path
) -> None:
    seed.seed_defaults(wiring)
    [agent_cluster] = [c["name"] for c in client.get("/v1/clusters", headers=tenant.headers).json()]
    _, credential = nats_identity.rotate_cluster_credential(wiring.uow(), agent_cluster, "test", utc_now())
    secrets_file = tmp_path / "nats-secrets.json"
    prefix = settings.subject_prefix
    db = settings.database_url
    env = {
        **os.environ,
        "GPUFLEET_DATABASE_URL": db,
        "GPUFLEET_NATS_URL": cluster.url,
        "GPUFLEET_NATS_REPLICAS": str(REPLICAS),
        "GPUFLEET_NATS_SECRETS_FILE": str(secrets_file),
        "GPUFLEET_SUBJECT_PREFIX": prefix,
        "GPUFLEET_STATE_DIR": str(tmp_path / "state"),
        "GPUFLEET_LEASE_TTL": str(LEASE_TTL),
        "GPUFLEET_RELAY_INTERVAL": "0.1",
    }
    processes = Processes(env, tmp_path)
    apis = {name: free_port() for name in ("a", "b")}
    figures = Figures()
    load: Load | None = None
    agent: TelemetryLoad | None = None
    try:
        for name, port in apis.items():
            processes.run(name, "server", "run", "api", "ingest", "relay", GPUFLEET_API_PORT=str(port))
        # Slow on a busy 2-core machine: each process imports the Kubernetes and cloud SDKs.
        eventually(lambda: processes.serving("a") and processes.serving("b"), 150, "both processes serving")
        for port in apis.values():
            eventually(lambda port=port: httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200, 60, "API")
        for name, replicas, info in asyncio.run(_jetstream(cluster, "streams")):
            assert replicas == REPLICAS, name
            assert info is not None, name
            assert 1 + len(info.replicas or []) == REPLICAS, (name, info)
        for what in ("ingest consumer", "telemetry consumer"):  # replicated with their streams
            info = asyncio.run(_jetstream(cluster, what)).cluster
            assert 1 + len(info.replicas or []) == REPLICAS, (what, info)

        # Each REST attempt goes to the other API replica, so a retry of a key meets the replica
        # that did not see the first attempt.
        bases = itertools.cycle(f"http://127.0.0.1:{port}" for port in apis.values())
        load = Load(
            lambda: next(bases), tenant.token, tenant.queue, cluster.url, prefix, figures, 0.2, 0.1, tenant.team
        )
        agent = TelemetryLoad(cluster.url, prefix, agent_cluster, credential, figures)
        load.start()
        agent.start()
        eventually(lambda: load is not None and len(load.acked) >= 15, 60, "15 acknowledged submissions")

        # SIGKILL the server leading the inbound stream (and so its ingest consumer's leader, usually).
        leader = asyncio.run(_jetstream(cluster, "inbound leader")).leader
        killed_at = time.monotonic()
        cluster.kill(leader)
        before_kill = len(load.acked)
        nats_acks = figures.nats["acked"]
        figures.recovery["kill to a new inbound stream leader"] = eventually(
            lambda: asyncio.run(_jetstream(cluster, "inbound leader")).leader not in (None, leader),
            30,
            "a new leader of the inbound stream",
        )
        # REST submits never stopped (they need only PostgreSQL); NATS ones wait for the election.
        eventually(lambda: figures.nats["acked"] > nats_acks, 30, "a NATS acknowledgement after the kill")
        figures.recovery["kill to the next JetStream-acknowledged submit"] = time.monotonic() - killed_at
        eventually(lambda: load is not None and len(load.acked) >= before_kill + 15, 60, "15 more acknowledgements")

        # Then the control-plane process that holds the relay lease, SIGKILLed with whatever it held:
        # the other's API takes every REST retry, its ingest and telemetry workers get the dead
        # one's unacknowledged messages back, and its relay takes the lease when it runs out.
        [(holder, relay_epoch)] = _sql(db, "SELECT holder, epoch FROM leader_leases WHERE name = 'relay'")
        relay_leader = processes.by_pid(int(str(holder).split(":")[1]))  # holder: relay@host:pid:nonce
        processes.kill(relay_leader)
        figures.recovery["kill of the relay leader's process to the standby's lease"] = eventually(
            lambda: _sql(db, "SELECT holder FROM leader_leases WHERE name = 'relay'")[0][0] != holder,
            40,
            "the standby relay leads",
        )
        before_process_kill = len(load.acked)
        eventually(
            lambda: load is not None and len(load.acked) >= before_process_kill + 10, 60, "10 acknowledgements more"
        )
        load.stop()
        agent.stop()
        acked = dict(load.acked)
        batches = set(agent.acked)
        assert set(acked.values()) == {"rest", "nats"}
        assert batches

        # Every acknowledged submission is in SQL exactly once.
        eventually(lambda: set(acked) <= set(workload_states(db)), 60, "every acknowledged submission in SQL")
        states = workload_states(db)
        doubled = {name: rows for name, rows in states.items() if len(rows) > 1}
        assert not doubled, f"one submission became several workloads: {doubled}"
        unexpected = set(states) - set(acked)
        assert len(unexpected) <= 2, f"workloads nobody submitted: {unexpected}"  # at most one in flight per path

        # Every acknowledged telemetry batch is folded exactly once: its inbox row, and no sample twice.
        eventually(lambda: batches <= _telemetry(db, agent_cluster)[0], 60, "every acknowledged batch folded")
        inbox, samples = _telemetry(db, agent_cluster)
        assert len(inbox - batches) <= 1, f"batches nobody acknowledged: {inbox - batches}"  # one in flight at stop
        assert samples == TelemetryLoad.SAMPLES * len(inbox), f"{samples} samples from {len(inbox)} batches"

        def consumed(what: str) -> bool:
            info = asyncio.run(_jetstream(cluster, what))
            return bool(info.num_pending == 0 and info.num_ack_pending == 0)

        def left(what: str) -> str:
            info = asyncio.run(_jetstream(cluster, what))
            return f"pending {info.num_pending}, ack pending {info.num_ack_pending}, redelivered {info.num_redelivered}"

        # An ack sent to a consumer leader that died before replicating it is lost: the message
        # comes back after the consumer's ack_wait (30 s ingest, 60 s telemetry) and its inbox row
        # makes the second delivery a no-op. So "nothing left" may take up to ack_wait.
        for what in ("ingest consumer", "telemetry consumer"):
            eventually(
                lambda what=what: consumed(what), 90, f"the {what} has nothing left", lambda what=what: left(what)
            )
        inbox_after, samples_after = _telemetry(db, agent_cluster)
        assert samples_after == TelemetryLoad.SAMPLES * len(inbox_after), "a redelivered batch was folded twice"

        # Every outbox event is published, and in the replicated events stream exactly once.
        eventually(lambda: all(published for _, _, published in _outbox(db)), 60, "relay idle")
        [(new_holder, new_epoch)] = _sql(db, "SELECT holder, epoch FROM leader_leases WHERE name = 'relay'")
        assert new_holder != holder
        assert int(str(new_epoch)) > int(str(relay_epoch))
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

        figures.recovery["restart of the killed server to all replicas current"] = eventually(
            caught_up, 60, f"{leader} current again"
        )
        print(
            f"\n3-server JetStream cluster, {leader} killed: {len(acked)} acknowledged submissions "
            f"({before_kill} before the kill; {Counter(acked.values())}), {len(batches)} telemetry batches, "
            f"{len(wanted)} events\n" + figures.render()
        )
    finally:
        if load is not None:
            load.stop()
        if agent is not None:
            agent.stop()
        processes.stop()


def test_declaring_the_streams_waits_for_a_cluster_that_is_still_forming(tmp_path: Path) -> None:
    """A process that starts before its JetStream cluster has a quorum (one server of three up:
    every JetStream API request times out) does not fail: it declares the replicated streams once
    the other servers join."""
    forming = NatsCluster(tmp_path / "nats")
    first, *others = forming.servers.values()

    async def declare() -> tuple[float, list[int]]:
        nc = await nats.connect(first.url, connect_timeout=2)
        try:
            js = nc.jetstream()
            declaring = asyncio.create_task(ensure_topology(js, "forming", REPLICAS, patience=90))
            await asyncio.sleep(3.0)
            assert not declaring.done(), "declared without a quorum"
            started = time.monotonic()
            for server in others:
                await asyncio.to_thread(server.start)
            await declaring
            waited = time.monotonic() - started
            return waited, [(await js.stream_info(name)).config.num_replicas or 0 for name in STREAMS]
        finally:
            await nc.close()

    try:
        first.start()
        waited, replicas = asyncio.run(declare())
    finally:
        forming.stop()
    assert replicas == [REPLICAS] * len(STREAMS)
    print(f"\nstreams declared {waited:.1f} s after the cluster got its other two servers")
