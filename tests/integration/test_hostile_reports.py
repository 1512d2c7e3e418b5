"""Reports about clusters or runs gpufleet does not know are refused and not stored; a cluster that
is gone or failing holds up nobody else; runs seen succeeded get a start; runs that never reach
their cluster time out (issue 11, "Smaller" and deliverable 5)."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from adapters.sql.tables import InboxRow, RunRow, TelemetryWindowRow
from controlplane.bootstrap import Wiring, utc_now
from controlplane.core.snapshot import Policy
from controlplane.domain.limits import MAX_MESSAGE_BYTES, MAX_PODS_PER_GANG
from controlplane.service import telemetry
from controlplane.service.cluster_objects import reconcile_cluster_objects
from controlplane.service.cluster_status import PodReport, PodStatus
from controlplane.service.dispatch import dispatch_once
from controlplane.service.gang_timeout import requeue_undispatched
from controlplane.service.ingest import InboundMessage, Outcome, handle
from controlplane.service.ports import RunOrder
from controlplane.service.scheduling import acquire_leadership, run_cycle
from controlplane.service.telemetry import BatchMessage
from controlplane.service.telemetry_wire import GpuSample, encode_batch, telemetry_subject
from tests.integration.fleet import Tenant, gang


def _count(wiring: Wiring, row: type[Any]) -> int:
    with wiring.uow() as uow:
        return int(uow.session.query(row).count())  # type: ignore[attr-defined]


def _admit(wiring: Wiring) -> None:
    epoch = acquire_leadership(wiring.uow, "s", utc_now(), 15)
    assert epoch is not None
    run_cycle(wiring.uow, "s", epoch, Policy(), wiring.settings.subject_prefix, utc_now(), 15, True)


def _run_of(client: TestClient, tenant: Tenant, wid: str) -> dict[str, Any]:
    view = client.get(f"/v1/workloads/{wid}", headers=tenant.headers).json()
    run: dict[str, Any] = view["runs"][-1]
    return run


def _send(wiring: Wiring, subject: str, body: dict[str, Any], msg_id: str) -> tuple[Outcome, str]:
    prefix = wiring.settings.subject_prefix
    message = InboundMessage(f"{prefix}.{subject}", json.dumps(body).encode(), {}, msg_id)
    result = handle(wiring.uow(), message, prefix, utc_now())
    return result.outcome, result.detail


def test_pod_reports_and_inventory_for_unknown_clusters_or_runs_are_dead_lettered_and_not_stored(
    wiring: Wiring, client: TestClient, tenant: Tenant
) -> None:
    wid = client.post("/v1/workloads", json=gang("g", tenant.queue), headers=tenant.headers).json()["id"]
    _admit(wiring)
    run_id = _run_of(client, tenant, wid)["id"]
    pods = [{"pod_set": "workers", "index": i, "phase": "Failed", "message": "forged"} for i in range(4)]
    outcome, detail = _send(wiring, "cluster.ghost.pods", {"run_id": run_id, "epoch": 1, "pods": pods}, "m1")
    assert (outcome, outcome.dead_letter) == (Outcome.UNKNOWN, True)
    assert "unknown cluster 'ghost'" in detail
    outcome, detail = _send(wiring, "cluster.sim-h100.pods", {"run_id": "r-nope", "epoch": 1, "pods": pods}, "m2")
    assert outcome is Outcome.UNKNOWN
    assert "unknown run 'r-nope'" in detail
    inventory = {"observed_at": utc_now().isoformat(), "nodes": [{"name": "n", "schedulable": False, "ready": True}]}
    outcome, detail = _send(wiring, "cluster.ghost.inventory", inventory, "m3")
    assert outcome is Outcome.UNKNOWN
    assert "unknown cluster" in detail
    # Nothing stored: no inbox row, and the run was not failed by the forged reports.
    assert _count(wiring, InboxRow) == 0
    assert _run_of(client, tenant, wid)["state"] == "admitted"


def test_telemetry_of_unknown_clusters_and_of_other_clusters_runs_is_refused(
    wiring: Wiring, client: TestClient, tenant: Tenant
) -> None:
    wid = client.post("/v1/workloads", json=gang("g", tenant.queue), headers=tenant.headers).json()["id"]
    _admit(wiring)
    run_id = _run_of(client, tenant, wid)["id"]
    prefix = wiring.settings.subject_prefix
    now = utc_now()

    def batch(cluster: str, run: str | None, msg_id: str) -> BatchMessage:
        sample = GpuSample(cluster, "n1", "GPU-0", 0, now.timestamp() - 10, {"sm_active": 0.0}, run_id=run)
        return BatchMessage(telemetry_subject(prefix, cluster), encode_batch(cluster, [sample]), msg_id)

    messages = [
        batch("ghost", run_id, "t1"),  # no such cluster
        batch("sim-h100", "r-unknown", "t2"),  # no such run
        batch("sim-h100", run_id, "t3"),  # its own run: kept
        batch("sim-h100", None, "t4"),  # an unattributed GPU of a known cluster: kept
    ]
    result = telemetry.handle_batch(wiring.uow(), messages, prefix, now)
    outcomes = [o for o, _ in result.outcomes]
    assert outcomes == [Outcome.UNKNOWN, Outcome.UNKNOWN, Outcome.APPLIED, Outcome.APPLIED]  # type: ignore[comparison-overlap]
    assert all(o.dead_letter for o in outcomes[:2])
    assert "unknown cluster 'ghost'" in result.outcomes[0][1]
    assert "r-unknown" in result.outcomes[1][1]
    with wiring.uow() as uow:
        runs = {w.run_id for w in uow.session.query(TelemetryWindowRow)}  # type: ignore[attr-defined]
    assert runs == {run_id, ""}  # "" is how a window of an unattributed GPU is stored


class Unreachable:
    """A driver whose cluster cannot be reached (deleted, network down)."""

    async def list_owned(self) -> set[str]:
        raise ConnectionError("cluster unreachable")

    async def apply(self, order: RunOrder) -> bool:
        raise ConnectionError("cluster unreachable")

    async def delete(self, run_id: str) -> bool:
        raise ConnectionError("cluster unreachable")


class Holding:
    """A reachable cluster that holds objects of a run gpufleet no longer has."""

    def __init__(self) -> None:
        self.owned = {"r-orphan"}
        self.listings = 0

    async def list_owned(self) -> set[str]:
        self.listings += 1
        return set(self.owned)

    async def apply(self, order: RunOrder) -> bool:
        return True

    async def delete(self, run_id: str) -> bool:
        self.owned.discard(run_id)
        return True


async def test_an_unreachable_cluster_does_not_stop_orphan_collection_for_the_others(wiring: Wiring) -> None:
    healthy = Holding()
    # The unreachable cluster comes first: it used to end the pass for every cluster after it.
    drivers = {"aaa-gone": Unreachable(), "sim-h100": healthy}
    done = await reconcile_cluster_objects(wiring.uow, drivers, wiring.settings.subject_prefix, utc_now)  # type: ignore[arg-type]
    assert len(done.deleted) == 1
    assert healthy.owned == set()
    assert healthy.listings == 1  # orphans and vanished runs are judged on one listing


async def test_runs_of_a_cluster_without_driver_do_not_hold_up_dispatch_and_time_out(
    wiring: Wiring, client: TestClient, tenant: Tenant, tmp_path: Path
) -> None:
    prefix = wiring.settings.subject_prefix
    wid = client.post("/v1/workloads", json=gang("g", tenant.queue), headers=tenant.headers).json()["id"]
    _admit(wiring)
    # No driver for sim-h100 (its dispatcher was never configured): nothing is dispatched.
    stats = await dispatch_once(wiring.uow, {"other": Unreachable()}, prefix, utc_now)  # type: ignore[dict-item]
    assert stats.errors == []  # runs of driverless clusters are not even loaded
    assert requeue_undispatched(wiring.uow, prefix, utc_now, 300.0) == []  # not yet
    later = utc_now() + timedelta(seconds=301)
    ended = requeue_undispatched(wiring.uow, prefix, lambda: later, 300.0)
    assert len(ended) == 1
    view = client.get(f"/v1/workloads/{wid}", headers=tenant.headers).json()
    assert view["state"] == "queued"
    assert view["reason"].startswith("dispatch-timeout: cluster sim-h100 did not take the run")
    assert view["runs"][0]["state"] == "preempted"


def test_a_run_seen_succeeded_without_a_running_report_gets_started_at(
    wiring: Wiring, client: TestClient, tenant: Tenant
) -> None:
    wid = client.post("/v1/workloads", json=gang("g", tenant.queue), headers=tenant.headers).json()["id"]
    _admit(wiring)
    run = _run_of(client, tenant, wid)
    pods = [{"pod_set": "workers", "index": i, "phase": "Succeeded"} for i in range(4)]
    outcome, _ = _send(wiring, "cluster.sim-h100.pods", {"run_id": run["id"], "epoch": 1, "pods": pods}, "s1")
    assert outcome is Outcome.APPLIED
    run = _run_of(client, tenant, wid)
    assert run["state"] == "succeeded"
    assert run["started_at"] is not None
    with wiring.uow() as uow:
        row = uow.session.get(RunRow, run["id"])  # type: ignore[attr-defined]
        assert row.started_at is not None
        assert row.started_at <= row.finished_at


def test_a_pod_report_for_the_largest_gang_fits_one_nats_message() -> None:
    # Worst case: the longest pod-set name, and the longest messages in 4-byte characters.
    pods = [
        PodStatus(pod_set="p" * 63, index=i, phase="Failed" if i % 7 == 0 else "Running", message="\U0001f525" * 500)
        for i in range(MAX_PODS_PER_GANG)
    ]
    report = PodReport(run_id="r" * 40, epoch=2**62, pods=pods)
    data = report.encode()
    assert len(data) <= MAX_MESSAGE_BYTES
    back = PodReport.model_validate_json(data)
    assert [(p.pod_set, p.index, p.phase) for p in back.pods] == [(p.pod_set, p.index, p.phase) for p in pods]
    assert back.pods[0].message  # a failed pod keeps (part of) why it failed
    small = PodReport(run_id="r", epoch=1, pods=pods[:3])
    assert small.encode() == small.model_dump_json().encode()


def test_an_elastic_gang_succeeds_only_when_every_admitted_pod_has(
    wiring: Wiring, client: TestClient, tenant: Tenant
) -> None:
    """Admitted with 4 pods but startable with 2: two pods done and two still working is a running
    run, not a succeeded one (its capacity was given back while pods still ran)."""
    body = gang("g", tenant.queue, min_available=2)
    wid = client.post("/v1/workloads", json=body, headers=tenant.headers).json()["id"]
    _admit(wiring)
    run = _run_of(client, tenant, wid)
    assert run["placement"] == [{"pod_set": "workers", "pool": "h100", "pods": 4, "nodes": 4}]
    pods = [{"pod_set": "workers", "index": i, "phase": "Succeeded" if i < 2 else "Running"} for i in range(4)]
    _send(wiring, "cluster.sim-h100.pods", {"run_id": run["id"], "epoch": 1, "pods": pods}, "e1")
    assert _run_of(client, tenant, wid)["state"] == "running"
    _send(wiring, "cluster.sim-h100.pods", {"run_id": run["id"], "epoch": 1, "pods": pods[:2]}, "e2")
    assert _run_of(client, tenant, wid)["state"] == "running"  # two of four reported: not all done
    pods = [{"pod_set": "workers", "index": i, "phase": "Succeeded"} for i in range(4)]
    _send(wiring, "cluster.sim-h100.pods", {"run_id": run["id"], "epoch": 1, "pods": pods}, "e3")
    assert _run_of(client, tenant, wid)["state"] == "succeeded"
