"""Small, fast pieces of the fault story: a success seen without a running report still passes
through `running`; a lease renewed while its holder works is never taken by a standby; readiness
names a missing scheduler or dispatcher; `gpufleet up` does not call a TIME-WAIT port "in use"."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import select

from adapters.sim.cluster import SimCluster
from adapters.sql.tables import OutboxRow
from controlplane.bootstrap import Wiring, utc_now
from controlplane.cli.server_commands import _port_free
from controlplane.core.snapshot import Policy
from controlplane.service.dispatch import dispatch_once
from controlplane.service.ingest import InboundMessage, Outcome, handle
from controlplane.service.ports import ClusterDriver, RunOrder
from controlplane.service.scheduling import (
    acquire_leadership,
    lease_gap,
    release_leadership,
    renew_leadership,
    run_cycle,
)
from controlplane.workers.dispatch_loop import dispatcher_loop
from controlplane.workers.lease_term import LeaseTerm
from tests.integration.fleet import Tenant, gang


class _Recorder:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, object], str]] = []

    async def publish(self, subject: str, payload: bytes, msg_id: str) -> None:
        self.sent.append((subject, json.loads(payload), msg_id))


async def test_success_seen_before_running_emits_running_first_and_sets_started_at(
    wiring: Wiring, client: TestClient, tenant: Tenant, tmp_path: Path
) -> None:
    prefix = wiring.settings.subject_prefix
    body = gang("quick", tenant.queue, replicas=2, duration_seconds=1)
    wid = client.post("/v1/workloads", json=body, headers=tenant.headers).json()["id"]
    epoch = acquire_leadership(wiring.uow, "s", utc_now(), 15)
    assert epoch is not None
    run_cycle(wiring.uow, "s", epoch, Policy(), prefix, utc_now(), 15, True)
    clock = [1_000.0]
    recorder = _Recorder()
    state = tmp_path / "sim.json"
    sim = SimCluster("sim-h100", recorder.publish, prefix, state, start_delay=0.5, clock=lambda: clock[0])
    await dispatch_once(wiring.uow, {"sim-h100": sim}, prefix, utc_now)
    clock[0] = 1_005.0  # the first report after the apply already says Succeeded (e.g. NATS was down)
    await sim.tick()
    _, report, msg_id = recorder.sent[-1]
    pods = report["pods"]
    assert isinstance(pods, list)
    assert {p["phase"] for p in pods} == {"Succeeded"}
    message = InboundMessage(f"{prefix}.cluster.sim-h100.pods", json.dumps(report).encode(), {}, msg_id)
    assert handle(wiring.uow(), message, prefix, utc_now()).outcome is Outcome.APPLIED
    view = client.get(f"/v1/workloads/{wid}", headers=tenant.headers).json()
    assert view["state"] == "succeeded"
    assert view["runs"][0]["started_at"] is not None
    with wiring.engine.connect() as conn:
        payloads = [json.loads(p) for p in conn.scalars(select(OutboxRow.payload).order_by(OutboxRow.seq))]
    mine = [p for p in payloads if p["data"].get("workload_id") == wid]
    assert [p["type"] for p in mine] == [
        "workload.queued",
        "workload.admitted",
        "workload.dispatching",
        "workload.running",
        "workload.succeeded",
    ]
    versions = [p["data"]["version"] for p in mine]
    assert versions == sorted(set(versions))


async def test_a_lease_renewed_while_worked_is_not_taken_by_a_standby(wiring: Wiring) -> None:
    ttl = 1.2
    term = LeaseTerm(wiring.uow, "scheduler", "leader", utc_now, ttl)
    epoch = await term.ensure()
    assert epoch is not None
    # A "cycle" three TTLs long: the standby tries all along and never gets the lease.
    deadline = asyncio.get_running_loop().time() + 3 * ttl
    while asyncio.get_running_loop().time() < deadline:
        assert await asyncio.to_thread(acquire_leadership, wiring.uow, "standby", utc_now(), ttl) is None
        await asyncio.sleep(0.05)
    assert await term.ensure() == epoch
    # Once the holder stops renewing (dead), the standby takes over with the next epoch...
    term.lose()
    await asyncio.sleep(ttl + 0.1)
    assert acquire_leadership(wiring.uow, "standby", utc_now(), ttl) == epoch + 1
    # ...and the old holder's renewer, were it still running, would find itself deposed.
    revived = LeaseTerm(wiring.uow, "scheduler", "leader", utc_now, ttl)
    assert await revived.ensure() is None


def test_readiness_names_a_missing_leader(wiring: Wiring) -> None:
    now = utc_now()
    assert lease_gap(wiring.uow, "dispatcher", now) == "no dispatcher has taken its lease yet"
    epoch = acquire_leadership(wiring.uow, "d", now, 5, "dispatcher")
    assert epoch is not None
    assert lease_gap(wiring.uow, "dispatcher", now) is None
    gap = lease_gap(wiring.uow, "dispatcher", now + timedelta(seconds=8))
    assert gap == "no live dispatcher: its lease expired 3.0 s ago"
    release_leadership(wiring.uow, "d", epoch, "dispatcher")
    assert lease_gap(wiring.uow, "dispatcher", now) == "no live dispatcher: the last one stopped"


def test_a_port_in_time_wait_is_free_and_a_listening_one_is_not() -> None:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = listener.accept()
    assert not _port_free(port)
    # The server side closes first (as a killed server does): its end of the connection
    # stays in TIME-WAIT on the listening port.
    accepted.close()
    listener.close()
    client.recv(1)
    client.close()
    assert _time_wait_on(port)
    assert _port_free(port)


def _time_wait_on(port: int) -> bool:
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port and fields[3] == "06":  # 06: TIME_WAIT
            return True
    return False


def test_a_late_renewal_never_moves_the_expiry_back(wiring: Wiring) -> None:
    """A cycle renews with the time its decision was taken, older than the background renewal."""
    now = utc_now()
    epoch = acquire_leadership(wiring.uow, "s", now, 10)
    assert epoch is not None
    assert renew_leadership(wiring.uow, "s", epoch, now - timedelta(seconds=5), 1)
    assert lease_gap(wiring.uow, "scheduler", now + timedelta(seconds=9)) is None
    assert not renew_leadership(wiring.uow, "s", epoch + 1, now, 10)


class _CountingCluster:
    """A cluster that records which dispatcher applied what (as a real API server would see it)."""

    def __init__(self, applied: list[str]) -> None:
        self.applied = applied

    async def apply(self, order: RunOrder) -> bool:
        self.applied.append(order.run_id)
        return True

    async def delete(self, run_id: str) -> bool:
        return True

    async def list_owned(self) -> set[str]:
        return set()


async def test_two_dispatchers_one_works_the_other_stands_by(
    wiring: Wiring, client: TestClient, tenant: Tenant
) -> None:
    prefix = wiring.settings.subject_prefix
    for i in range(2):
        body = gang(f"d{i}", tenant.queue, replicas=1)
        assert client.post("/v1/workloads", json=body, headers=tenant.headers).status_code == 201
    epoch = acquire_leadership(wiring.uow, "s", utc_now(), 15)
    assert epoch is not None
    run_cycle(wiring.uow, "s", epoch, Policy(), prefix, utc_now(), 15, True)
    applied: dict[str, list[str]] = {"a": [], "b": []}
    leading: dict[str, list[bool]] = {"a": [], "b": []}
    clusters: dict[str, Mapping[str, ClusterDriver]] = {
        name: {"sim-h100": _CountingCluster(applied[name])} for name in applied
    }
    stop = asyncio.Event()

    def drivers_of(name: str) -> Callable[[], Mapping[str, ClusterDriver]]:
        return lambda: clusters[name]

    tasks = [
        asyncio.create_task(
            dispatcher_loop(wiring.uow, drivers_of(n), prefix, utc_now, stop, 0.05, 60.0, 15.0, leading[n].append)
        )
        for n in applied
    ]
    for _ in range(100):
        if sum(len(v) for v in applied.values()) >= 2:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)  # the standby keeps trying meanwhile
    stop.set()
    await asyncio.gather(*tasks)
    assert sorted(len(v) for v in applied.values()) == [0, 2]
    assert sorted(leading.values()) == [[], [True]]
