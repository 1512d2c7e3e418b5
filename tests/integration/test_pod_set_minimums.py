"""Per-pod-set minimums (issue 12, rule 7) through the REST API and the database, on SQLite and
PostgreSQL: the submit edge refuses bad minimums with a clear 422, a minimum survives the round
trip through SQL (API view, scheduler snapshot), and a gang admitted partially dispatches exactly
its admitted pods, which a simulated cluster runs to success."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from adapters.sim.cluster import SimCluster
from controlplane.bootstrap import Wiring, utc_now
from controlplane.core.snapshot import Policy
from controlplane.service.dispatch import dispatch_once
from controlplane.service.ingest import InboundMessage, Outcome, handle
from controlplane.service.scheduling import acquire_leadership, run_cycle
from tests.integration.fleet import Tenant, gang
from tests.integration.test_dispatch import Clock, Recorder


def _mpi(name: str, queue: str, workers: int = 4, least: int | None = 2, **extra: Any) -> dict[str, Any]:
    worker_set: dict[str, Any] = {"name": "workers", "replicas": workers, "gpus": 8}
    if least is not None:
        worker_set["min_replicas"] = least
    body: dict[str, Any] = {
        "name": name,
        "queue": queue,
        "pod_sets": [{"name": "launcher", "replicas": 1, "cpu_millis": 2000}, worker_set],
    }
    body.update(extra)
    return body


@pytest.mark.parametrize(
    ("least", "extra", "sentence"),
    [
        (5, {}, "pod set workers: min_replicas 5 is more than its 4 replicas"),
        (0, {}, "min_replicas"),
        (2, {"min_available": 4}, "min_available 4 disagrees with the pod sets' min_replicas"),
    ],
)
def test_bad_minimums_are_a_clear_422(
    client: TestClient, tenant: Tenant, least: int, extra: dict[str, Any], sentence: str
) -> None:
    r = client.post("/v1/workloads", json=_mpi("bad", tenant.queue, least=least, **extra), headers=tenant.headers)
    assert r.status_code == 422, r.text
    assert sentence in r.json()["detail"]


def test_minimums_round_trip_through_sql(wiring: Wiring, client: TestClient, tenant: Tenant) -> None:
    r = client.post("/v1/workloads", json=_mpi("mpi", tenant.queue, min_available=3), headers=tenant.headers)
    assert r.status_code in (200, 201), r.text
    workload_id = r.json()["id"]
    shown = client.get(f"/v1/workloads/{workload_id}", headers=tenant.headers).json()
    assert [p["min_replicas"] for p in shown["pod_sets"]] == [None, 2]
    assert shown["min_available"] == 3  # the sum of the minimums (launcher 1 of 1, workers 2 of 4)
    with wiring.uow() as uow:
        [pending] = uow.snapshots.load().pending
    assert [(p.name, p.replicas, p.min_replicas) for p in pending.pod_sets] == [
        ("launcher", 1, None),
        ("workers", 4, 2),
    ]
    assert pending.min_available == 3
    assert pending.reducible


def test_openapi_documents_the_minimum(client: TestClient) -> None:
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    field = schemas["PodSetSpec"]["properties"]["min_replicas"]
    assert "as few as" in field["description"]


def test_a_gang_admitted_partially_dispatches_exactly_its_admitted_pods(
    wiring: Wiring, client: TestClient, tenant: Tenant
) -> None:
    """Four 8-GPU nodes; an occupant takes two of them first: the launcher and two of the four
    workers are admitted, the run holds those three pods and its dispatch order carries them."""
    occupant = client.post("/v1/workloads", json=gang("occupant", tenant.queue, replicas=2), headers=tenant.headers)
    assert occupant.status_code in (200, 201), occupant.text
    r = client.post("/v1/workloads", json=_mpi("mpi", tenant.queue), headers=tenant.headers)
    workload_id = r.json()["id"]
    epoch = acquire_leadership(wiring.uow, "me", utc_now(), 15.0)
    assert epoch is not None
    run_cycle(wiring.uow, "me", epoch, Policy(), wiring.settings.subject_prefix, utc_now(), 15.0, True)
    with wiring.uow() as uow:
        orders = {o.workload_id: o for o in uow.runs.to_dispatch(10)}
    order = orders[workload_id]
    assert Counter(p.pod_set for p in order.pods) == {"launcher": 1, "workers": 2}
    assert sorted(p.index for p in order.pods if p.pod_set == "workers") == [0, 1]
    assert order.min_available == 3
    shown = client.get(f"/v1/workloads/{workload_id}", headers=tenant.headers).json()
    assert shown["state"] == "admitted"


def test_submit_judges_can_this_ever_fit_by_the_minimums(client: TestClient, tenant: Tenant) -> None:
    """Four 8-GPU nodes: six workers never fit, but a gang that may start with two of them is
    accepted; one whose minimum (five workers and the launcher) exceeds the fleet is refused."""
    accepted = client.post("/v1/workloads", json=_mpi("elastic", tenant.queue, workers=6), headers=tenant.headers)
    assert accepted.status_code == 201, accepted.text
    refused = client.post("/v1/workloads", json=_mpi("huge", tenant.queue, workers=8, least=5), headers=tenant.headers)
    assert refused.status_code == 409, refused.text
    assert "needs 6 pods placed at once" in refused.json()["detail"]
    plain = client.post(
        "/v1/workloads", json=_mpi("plain", tenant.queue, workers=6, least=None), headers=tenant.headers
    )
    assert plain.status_code == 409, plain.text


async def test_a_simulated_cluster_runs_exactly_the_admitted_pods_to_success(
    wiring: Wiring, client: TestClient, tenant: Tenant, tmp_path: Path
) -> None:
    prefix = wiring.settings.subject_prefix
    client.post("/v1/workloads", json=gang("occupant", tenant.queue, replicas=2), headers=tenant.headers)
    body = _mpi("mpi", tenant.queue, duration_seconds=5)
    workload_id = client.post("/v1/workloads", json=body, headers=tenant.headers).json()["id"]
    epoch = acquire_leadership(wiring.uow, "me", utc_now(), 15.0)
    assert epoch is not None
    run_cycle(wiring.uow, "me", epoch, Policy(), prefix, utc_now(), 15.0, True)
    recorder, clock = Recorder(), Clock()
    sim = SimCluster("sim-h100", recorder.publish, "p", tmp_path / "sim.json", start_delay=1.0, clock=clock)
    await dispatch_once(wiring.uow, {"sim-h100": sim}, prefix, utc_now)
    [run] = [r for r in sim.runs.values() if any(p[0] == "launcher" for p in r.pods)]
    assert sorted((pod_set, index) for pod_set, index, _ in run.pods) == [
        ("launcher", 0),
        ("workers", 0),
        ("workers", 1),
    ]
    for t, state in ((1_001.5, "running"), (1_007.0, "succeeded")):
        clock.t = t
        recorder.sent.clear()
        await sim.tick()
        for _, report, msg_id in recorder.sent:
            if report["run_id"] != run.run_id:
                continue
            result = handle(
                wiring.uow(),
                InboundMessage(f"{prefix}.cluster.sim-h100.pods", json.dumps(report).encode(), {}, msg_id),
                prefix,
                utc_now(),
            )
            assert result.outcome is Outcome.APPLIED, result.detail
        assert client.get(f"/v1/workloads/{workload_id}", headers=tenant.headers).json()["state"] == state
