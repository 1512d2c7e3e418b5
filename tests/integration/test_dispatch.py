"""Dispatch to simulated clusters: idempotent across restarts, teardown on cancel, orphan GC."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

from fastapi.testclient import TestClient

from adapters.sim.cluster import SimCluster
from controlplane.bootstrap import Wiring, utc_now
from controlplane.core.snapshot import Policy
from controlplane.service.cluster_objects import reconcile_cluster_objects
from controlplane.service.cluster_status import PodReport
from controlplane.service.dispatch import dispatch_once
from controlplane.service.ingest import InboundMessage, Outcome, handle
from controlplane.service.ports import PodOrder, RunOrder
from controlplane.service.scheduling import acquire_leadership, run_cycle
from tests.integration.fleet import Tenant, gang


class Recorder:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, object], str]] = []

    async def publish(self, subject: str, payload: bytes, msg_id: str) -> None:
        self.sent.append((subject, json.loads(payload), msg_id))


class Clock:
    def __init__(self) -> None:
        self.t = 1_000.0

    def __call__(self) -> float:
        return self.t


def _admit(wiring: Wiring) -> None:
    epoch = acquire_leadership(wiring.uow, "s", utc_now(), 15)
    assert epoch is not None
    run_cycle(wiring.uow, "s", epoch, Policy(), wiring.settings.subject_prefix, utc_now(), 15, True)


def _sim(tmp_path: Path, recorder: Recorder, clock: Clock) -> SimCluster:
    return SimCluster("sim-h100", recorder.publish, "p", tmp_path / "sim.json", start_delay=1.0, clock=clock)


async def test_dispatch_is_idempotent_across_a_dispatcher_restart(
    wiring: Wiring, client: TestClient, tenant: Tenant, tmp_path: Path
) -> None:
    wid = client.post("/v1/workloads", json=gang("g", tenant.queue, duration_seconds=5), headers=tenant.headers).json()[
        "id"
    ]
    _admit(wiring)
    recorder, clock = Recorder(), Clock()
    sim = _sim(tmp_path, recorder, clock)
    prefix = wiring.settings.subject_prefix
    # The dispatcher dies after the cluster accepted the run but before it recorded that.
    with wiring.uow() as uow:
        [order] = uow.runs.to_dispatch(10)
    assert await sim.apply(order) is True
    restarted = _sim(tmp_path, recorder, clock)
    stats = await dispatch_once(wiring.uow, {"sim-h100": restarted}, prefix, utc_now)
    assert (stats.applied, stats.already_present) == (0, 1)
    assert restarted.created == 1
    again = await dispatch_once(wiring.uow, {"sim-h100": restarted}, prefix, utc_now)
    assert (again.applied, again.already_present) == (0, 0)
    view = client.get(f"/v1/workloads/{wid}", headers=tenant.headers).json()
    assert view["state"] == "dispatching"
    assert view["runs"][0]["dispatched_at"] is not None
    assert sorted(p[2] for p in restarted.runs[order.run_id].pods) == view["nodes"]


async def test_pod_reports_drive_the_workload_to_succeeded_and_free_capacity(
    wiring: Wiring, client: TestClient, tenant: Tenant, tmp_path: Path
) -> None:
    prefix = wiring.settings.subject_prefix
    wid = client.post("/v1/workloads", json=gang("g", tenant.queue, duration_seconds=5), headers=tenant.headers).json()[
        "id"
    ]
    _admit(wiring)
    recorder, clock = Recorder(), Clock()
    sim = _sim(tmp_path, recorder, clock)
    await dispatch_once(wiring.uow, {"sim-h100": sim}, prefix, utc_now)
    phases = []
    for t in (1_000.5, 1_001.5, 1_007.0):
        clock.t = t
        await sim.tick()
        subject, body, msg_id = recorder.sent[-1]
        phases.append(body["pods"][0]["phase"])  # type: ignore[index]
        result = handle(
            wiring.uow(),
            InboundMessage(f"{prefix}.cluster.sim-h100.pods", json.dumps(body).encode(), {}, msg_id),
            prefix,
            utc_now(),
        )
        assert result.outcome is Outcome.APPLIED
    assert phases == ["Pending", "Running", "Succeeded"]
    assert subject == "p.cluster.sim-h100.pods"
    view = client.get(f"/v1/workloads/{wid}", headers=tenant.headers).json()
    assert view["state"] == "succeeded"
    assert view["runs"][0]["state"] == "succeeded"
    assert view["runs"][0]["started_at"] is not None
    stats = await dispatch_once(wiring.uow, {"sim-h100": sim}, prefix, utc_now)
    assert stats.torn_down == 1
    assert sim.runs == {}
    second = client.post("/v1/workloads", json=gang("g2", tenant.queue), headers=tenant.headers).json()["id"]
    _admit(wiring)
    assert client.get(f"/v1/workloads/{second}", headers=tenant.headers).json()["state"] == "admitted"


async def test_failed_pod_fails_the_gang(wiring: Wiring, client: TestClient, tenant: Tenant, tmp_path: Path) -> None:
    prefix = wiring.settings.subject_prefix
    body = gang("g", tenant.queue, duration_seconds=5, container={"sim": {"fail": True}})
    wid = client.post("/v1/workloads", json=body, headers=tenant.headers).json()["id"]
    _admit(wiring)
    recorder, clock = Recorder(), Clock()
    sim = _sim(tmp_path, recorder, clock)
    await dispatch_once(wiring.uow, {"sim-h100": sim}, prefix, utc_now)
    clock.t = 1_010.0
    await sim.tick()
    _, report, msg_id = recorder.sent[-1]
    PodReport.model_validate(report)
    handle(
        wiring.uow(),
        InboundMessage(f"{prefix}.cluster.sim-h100.pods", json.dumps(report).encode(), {}, msg_id),
        prefix,
        utc_now(),
    )
    view = client.get(f"/v1/workloads/{wid}", headers=tenant.headers).json()
    assert view["state"] == "failed"
    assert "simulated failure" in view["reason"]


async def test_cancel_tears_down_and_orphans_are_collected(
    wiring: Wiring, client: TestClient, tenant: Tenant, tmp_path: Path
) -> None:
    prefix = wiring.settings.subject_prefix
    wid = client.post("/v1/workloads", json=gang("g", tenant.queue), headers=tenant.headers).json()["id"]
    _admit(wiring)
    recorder, clock = Recorder(), Clock()
    sim = _sim(tmp_path, recorder, clock)
    await dispatch_once(wiring.uow, {"sim-h100": sim}, prefix, utc_now)
    stray = RunOrder(
        "run-stray-1",
        "wl-stray",
        "stray",
        "t",
        "q",
        "sim-h100",
        1,
        1,
        "batch",
        1,
        (PodOrder("w", 0, "sim-h100-h100-0", "h100", {"gpu": 1}),),
        None,
    )
    await sim.apply(stray)
    assert await sim.list_owned() == {"run-stray-1", f"run-{wid[3:]}-1"}
    assert client.post(f"/v1/workloads/{wid}/cancel", headers=tenant.headers).json()["state"] == "cancelled"
    stats = await dispatch_once(wiring.uow, {"sim-h100": sim}, prefix, utc_now)
    assert stats.torn_down == 1
    assert await sim.list_owned() == {"run-stray-1"}
    assert (await reconcile_cluster_objects(wiring.uow, {"sim-h100": sim}, prefix, utc_now)).deleted == ["run-stray-1"]
    assert await sim.list_owned() == set()


class _Unlistable:
    async def list_owned(self) -> set[str]:
        raise ConnectionError("cluster API unreachable")


async def test_a_run_whose_objects_vanished_is_requeued_after_the_grace(
    wiring: Wiring, client: TestClient, tenant: Tenant, tmp_path: Path
) -> None:
    """Objects deleted behind gpufleet's back: no pod report will ever end the run, so the dispatcher's
    reconciliation ends it and requeues the workload; never within the grace, never for a cluster it
    cannot list, and never twice."""
    prefix = wiring.settings.subject_prefix
    wid = client.post("/v1/workloads", json=gang("g", tenant.queue), headers=tenant.headers).json()["id"]
    _admit(wiring)
    recorder, clock = Recorder(), Clock()
    sim = _sim(tmp_path, recorder, clock)
    await dispatch_once(wiring.uow, {"sim-h100": sim}, prefix, utc_now)
    clock.t += 2
    await sim.tick()
    _, report, msg_id = recorder.sent[-1]
    handle(
        wiring.uow(),
        InboundMessage(f"{prefix}.cluster.sim-h100.pods", json.dumps(report).encode(), {}, msg_id),
        prefix,
        utc_now(),
    )
    assert client.get(f"/v1/workloads/{wid}", headers=tenant.headers).json()["state"] == "running"
    [run_id] = await sim.list_owned()
    assert await sim.delete(run_id)  # e.g. `kubectl delete job` by someone else

    later = lambda: utc_now() + timedelta(seconds=120)  # noqa: E731
    unlistable = {"sim-h100": _Unlistable()}
    assert (await reconcile_cluster_objects(wiring.uow, {"sim-h100": sim}, prefix, utc_now, 60)).requeued == []
    assert (await reconcile_cluster_objects(wiring.uow, unlistable, prefix, later, 60)).requeued == []  # type: ignore[arg-type]
    assert (await reconcile_cluster_objects(wiring.uow, {"sim-h100": sim}, prefix, later, 60)).requeued == [run_id]
    assert (await reconcile_cluster_objects(wiring.uow, {"sim-h100": sim}, prefix, later, 60)).requeued == []

    view = client.get(f"/v1/workloads/{wid}", headers=tenant.headers).json()
    assert view["state"] == "queued"
    assert view["reason"].startswith("objects-lost:")
    assert "sim-h100" in view["reason"]
    assert view["runs"][0]["state"] == "preempted"
    with wiring.uow() as uow:
        events = [json.loads(payload) for _, _, payload in uow.outbox.unpublished(1000)]
    requeued = [e["data"] for e in events if e["type"] == "workload.requeued"]
    assert len(requeued) == 1, events
    assert requeued[0]["reason"] == view["reason"]
    assert requeued[0]["cluster"] == "sim-h100"
    # The workload goes back through the scheduler as a new attempt.
    _admit(wiring)
    assert client.get(f"/v1/workloads/{wid}", headers=tenant.headers).json()["state"] == "admitted"


async def test_two_processes_driving_one_simulated_cluster_share_its_state(tmp_path: Path) -> None:
    """A deposed dispatcher that has not yet noticed and its successor drive the same simulated cluster
    for a moment; neither may forget a run the other created, or report one twice under new ids."""
    recorder, clock = Recorder(), Clock()
    deposed, successor = _sim(tmp_path, recorder, clock), _sim(tmp_path, recorder, clock)
    order = RunOrder(
        "run-a-1", "wl-a", "a", "t", "q", "sim-h100", 1, 1, "batch", 1,
        (PodOrder("w", 0, "sim-h100-h100-0", "h100", {"gpu": 1}),), 30,
    )  # fmt: skip
    assert await successor.apply(order) is True
    assert await deposed.apply(order) is False  # AlreadyExists, as the API server would answer
    clock.t += 2
    assert await deposed.tick() == 1  # the deposed one reports the run its successor created
    assert await successor.tick() == 0  # already reported: no second report under a new id
    assert [msg_id for _, _, msg_id in recorder.sent] == ["sim-h100:run-a-1:Running:0"]
    assert await deposed.delete("run-a-1") is True
    assert await successor.list_owned() == set()
    assert successor.created == 1
