"""Node inventory reports on `<prefix>.cluster.<cluster>.inventory` for simulated clusters: cordons,
ordering, unknown nodes, DLQ (real clusters: test_node_inventory.py)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import nats
import pytest
from fastapi.testclient import TestClient
from nats.aio.client import Client
from nats.js import JetStreamContext

from adapters.kubernetes.nodes import observe_node
from adapters.nats.inbound import JetStreamInbound
from adapters.nats.server import NatsServerProcess
from adapters.nats.topology import CLUSTER_CONSUMER, DLQ_STREAM, ensure_topology
from adapters.sim.cluster import SimCluster
from controlplane.bootstrap import Wiring, utc_now
from controlplane.core.snapshot import Policy
from controlplane.service.ingest import InboundMessage, Outcome, handle
from controlplane.service.inventory import INVENTORY_MARK, inventory_msg_id
from controlplane.service.ports import PodOrder, RunOrder
from controlplane.service.scheduling import acquire_leadership, run_cycle
from controlplane.workers.ingest_loop import handle_delivery
from tests.gateway import inbound_gateway
from tests.integration.fleet import Tenant, gang
from tests.kubernetes.nodes import presets as real

CLUSTER = "sim-h100"


def _nodes(wiring: Wiring) -> dict[str, bool]:
    with wiring.uow() as uow:
        view = uow.admin.get_cluster(CLUSTER)
        assert view is not None
        return {n.name: n.schedulable for p in view.pools for n in p.nodes}


def _report(at: datetime, **nodes: dict[str, Any]) -> bytes:
    body = [{"name": name, "schedulable": True, "ready": True, **fields} for name, fields in nodes.items()]
    return json.dumps({"observed_at": at.isoformat(), "nodes": body}).encode()


def _send(wiring: Wiring, data: bytes, msg_id: str, cluster: str = CLUSTER) -> tuple[Outcome, str]:
    prefix = wiring.settings.subject_prefix
    message = InboundMessage(f"{prefix}.cluster.{cluster}.inventory", data, {}, msg_id)
    result = handle(wiring.uow(), message, prefix, utc_now())
    return result.outcome, result.detail


def _admit(wiring: Wiring) -> None:
    epoch = acquire_leadership(wiring.uow, "s", utc_now(), 15)
    assert epoch is not None
    run_cycle(wiring.uow, "s", epoch, Policy(), wiring.settings.subject_prefix, utc_now(), 15, True)


async def test_cordoned_node_becomes_unschedulable_and_gets_no_new_work(
    wiring: Wiring, client: TestClient, tenant: Tenant
) -> None:
    names = sorted(_nodes(wiring))
    cordoned, not_ready = names[0], names[1]
    at = utc_now()
    data = _report(at, **{cordoned: {"schedulable": False}, not_ready: {"ready": False}, names[2]: {}})
    outcome, detail = _send(wiring, data, inventory_msg_id(CLUSTER, at))
    assert (outcome, detail) == (Outcome.APPLIED, "2 nodes changed")
    assert _nodes(wiring) == {n: n not in (cordoned, not_ready) for n in names}
    # Two nodes are left: a 2-node gang fits on them, a 3-node gang does not fit anywhere.
    two = client.post("/v1/workloads", json=gang("two", tenant.queue, replicas=2), headers=tenant.headers).json()
    three = client.post("/v1/workloads", json=gang("three", tenant.queue, replicas=3), headers=tenant.headers).json()
    _admit(wiring)
    placed = client.get(f"/v1/workloads/{two['id']}", headers=tenant.headers).json()
    assert placed["state"] == "admitted"
    assert sorted(placed["nodes"]) == names[2:]
    assert client.get(f"/v1/workloads/{three['id']}", headers=tenant.headers).json()["state"] == "queued"
    # The same message again is a no-op (inbox), and with the nodes back everything is schedulable.
    assert _send(wiring, data, inventory_msg_id(CLUSTER, at))[0] is Outcome.DUPLICATE
    later = at + timedelta(seconds=30)
    outcome, _ = _send(wiring, _report(later, **{n: {} for n in names}), inventory_msg_id(CLUSTER, later))
    assert outcome is Outcome.APPLIED
    assert all(_nodes(wiring).values())


async def test_older_report_is_ignored(wiring: Wiring, tenant: Tenant) -> None:
    node = sorted(_nodes(wiring))[0]
    newer = utc_now()
    older = newer - timedelta(seconds=10)
    assert _send(wiring, _report(newer, **{node: {"schedulable": False}}), "new")[1] == "1 nodes changed"
    outcome, detail = _send(wiring, _report(older, **{node: {}}), "old")
    assert outcome is Outcome.APPLIED
    assert detail.startswith("stale report")
    assert _nodes(wiring)[node] is False
    with wiring.uow() as uow:
        view = uow.admin.get_cluster(CLUSTER)
        assert view is not None
        assert datetime.fromisoformat(view.kubernetes[INVENTORY_MARK]) == newer
    future = utc_now() + timedelta(hours=1)
    assert _send(wiring, _report(future, **{node: {}}), "future")[1] == "report from the future ignored"
    assert _nodes(wiring)[node] is False


async def test_simulated_cluster_reports_unknown_nodes_and_creates_none(wiring: Wiring, tenant: Tenant) -> None:
    before = _nodes(wiring)
    known = sorted(before)[0]
    outcome, detail = _send(wiring, _report(utc_now(), **{known: {}, "ghost-1": {"schedulable": False}}), "m")
    assert outcome is Outcome.APPLIED
    assert detail == "0 nodes changed; unknown nodes: ghost-1"
    assert _nodes(wiring) == before
    # A cluster gpufleet does not know: dead-lettered, nothing stored.
    assert _send(wiring, _report(utc_now(), ghost={}), "m2", cluster="nowhere") == (
        Outcome.UNKNOWN,
        "inventory for unknown cluster 'nowhere'",
    )


async def test_simulated_cluster_reports_the_nodes_it_knows(wiring: Wiring, tenant: Tenant, tmp_path: Path) -> None:
    sent: list[tuple[str, bytes, str]] = []

    async def publish(subject: str, payload: bytes, msg_id: str) -> None:
        sent.append((subject, payload, msg_id))

    now = [1_000.0]
    sim = SimCluster(CLUSTER, publish, wiring.settings.subject_prefix, tmp_path / "s.json", clock=lambda: now[0])
    assert await sim.emit_inventory() is False  # knows no node yet
    node = sorted(_nodes(wiring))[0]
    pod = PodOrder("workers", 0, node, "h100", {"nvidia.com/gpu": 8})
    await sim.apply(RunOrder("run-1", "w", "w", "t", "q", CLUSTER, 1, 1, "default", 1, (pod,), None))
    assert await sim.emit_inventory() is True
    assert await sim.emit_inventory() is False  # not due before the next resync
    [(subject, payload, msg_id)] = sent
    assert subject == f"{wiring.settings.subject_prefix}.cluster.{CLUSTER}.inventory"
    assert msg_id == f"inventory:{CLUSTER}:1000000"
    assert _send(wiring, _report(utc_now(), **{node: {"schedulable": False}}), "cordon")[0] is Outcome.APPLIED
    assert _nodes(wiring)[node] is False
    # The simulated report is older than the cordon (its clock says 1970): ignored.
    outcome, detail = _send(wiring, payload, msg_id)
    assert (outcome, detail.startswith("stale")) == (Outcome.APPLIED, True)


def test_kubernetes_node_becomes_an_inventory_entry() -> None:
    node = observe_node(real.eks_p5("n1", unschedulable=True))
    assert (node.name, node.pool, node.schedulable, node.ready, node.gpu_count) == ("n1", "p5-reserved", False, True, 8)
    assert node.allocatable["cpu"] == 191450
    assert node.allocatable["memory"] == 2145881088 * 1024  # 2048 GiB less the EKS reservation and eviction
    assert node.allocatable["nvidia.com/gpu"] == 8


@pytest.fixture
async def js(running_nats: NatsServerProcess, wiring: Wiring) -> AsyncIterator[JetStreamContext]:
    nc: Client = await nats.connect(running_nats.url)
    context = nc.jetstream()
    for name in ("GPUFLEET_IN", "GPUFLEET_EVENTS", "GPUFLEET_DLQ"):
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await context.delete_stream(name)
    await ensure_topology(context, wiring.settings.subject_prefix)
    async with inbound_gateway(nc, wiring.settings.subject_prefix):  # senders' messages reach the stream through it
        yield context
    await nc.close()


async def test_malformed_inventory_goes_to_dead_letter_and_ingest_continues(
    js: JetStreamContext, wiring: Wiring, tenant: Tenant
) -> None:
    prefix = wiring.settings.subject_prefix
    node = sorted(_nodes(wiring))[0]
    subject = f"{prefix}.cluster.{CLUSTER}.inventory"
    bad = json.dumps({"observed_at": utc_now().isoformat(), "nodes": [{"name": node, "schedulable": "maybe"}]})
    await js.publish(subject, bad.encode(), headers={"Nats-Msg-Id": "inv-bad"})
    good = _report(utc_now(), **{node: {"ready": False}})
    await js.publish(subject, good, headers={"Nats-Msg-Id": "inv-good"})
    inbound = JetStreamInbound(js, prefix, CLUSTER_CONSUMER)
    outcomes: list[Outcome | None] = []
    for _ in range(50):
        for delivery in await inbound.fetch(timeout=0.2):
            outcomes.append(await handle_delivery(inbound, delivery, wiring.uow, prefix, utc_now))
        if len(outcomes) >= 2:
            break
    assert outcomes == [Outcome.MALFORMED, Outcome.APPLIED]
    dlq = await js.pull_subscribe(f"{prefix}.dlq.>", durable="dlq-inventory", stream=DLQ_STREAM)
    [dead] = await dlq.fetch(1, timeout=2)
    assert dead.subject == f"{prefix}.dlq.cluster.{CLUSTER}.inventory"
    assert dead.headers is not None
    reason = dead.headers["Gpufleet-Dlq-Reason"]
    assert "schedulable" in reason
    assert "ready" in reason
    assert _nodes(wiring)[node] is False
