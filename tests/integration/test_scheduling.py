"""The scheduler's shell on a real database: leases, epoch fencing, admissions and reasons."""

from __future__ import annotations

from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from adapters.sql.tables import LeaderLeaseRow, RunRow
from controlplane.bootstrap import Wiring, utc_now
from controlplane.core.snapshot import Policy
from controlplane.service.errors import LostLeadership
from controlplane.service.scheduling import acquire_leadership, release_leadership, run_cycle
from tests.integration.fleet import Tenant, gang

TTL = 15.0


def _cycle(wiring: Wiring, holder: str, epoch: int) -> None:
    run_cycle(wiring.uow, holder, epoch, Policy(), wiring.settings.subject_prefix, utc_now(), TTL, True)


def test_lease_epochs_rise_and_a_live_lease_excludes_others(wiring: Wiring) -> None:
    now = utc_now()
    assert acquire_leadership(wiring.uow, "a", now, TTL) == 1
    assert acquire_leadership(wiring.uow, "a", now, TTL) == 1
    assert acquire_leadership(wiring.uow, "b", now, TTL) is None
    assert acquire_leadership(wiring.uow, "b", now + timedelta(seconds=TTL + 1), TTL) == 2
    release_leadership(wiring.uow, "b", 2)
    assert acquire_leadership(wiring.uow, "a", now + timedelta(seconds=TTL + 2), TTL) == 3


def test_a_deposed_leader_cannot_apply_its_decision(wiring: Wiring, client: TestClient, tenant: Tenant) -> None:
    client.post("/v1/workloads", json=gang("g1", tenant.queue), headers=tenant.headers)
    now = utc_now()
    old = acquire_leadership(wiring.uow, "old", now, TTL)
    assert old == 1
    assert acquire_leadership(wiring.uow, "new", now + timedelta(seconds=TTL + 1), TTL) == 2
    with pytest.raises(LostLeadership):
        _cycle(wiring, "old", 1)
    with wiring.uow() as uow:
        assert uow.session.query(RunRow).count() == 0  # type: ignore[attr-defined]
    _cycle(wiring, "new", 2)
    with wiring.uow() as uow:
        [run] = uow.session.query(RunRow).all()  # type: ignore[attr-defined]
        assert run.epoch == 2
        lease = uow.session.get(LeaderLeaseRow, "scheduler")  # type: ignore[attr-defined]
        assert lease.holder == "new"


def test_gangs_admitted_all_or_nothing_and_pending_reasons_shown(
    wiring: Wiring, client: TestClient, tenant: Tenant
) -> None:
    ids = [
        client.post("/v1/workloads", json=gang(f"g{i}", tenant.queue), headers=tenant.headers).json()["id"]
        for i in range(3)
    ]
    urgent = client.post(
        "/v1/workloads", json=gang("urgent", tenant.queue, replicas=2, priority_class="urgent"), headers=tenant.headers
    ).json()["id"]
    epoch = acquire_leadership(wiring.uow, "s", utc_now(), TTL)
    assert epoch is not None
    _cycle(wiring, "s", epoch)
    views = {i: client.get(f"/v1/workloads/{i}", headers=tenant.headers).json() for i in [*ids, urgent]}
    # 4 nodes x 8 H100: the urgent 2-node gang goes first, then one 4-node gang cannot fit (only 2 nodes left).
    assert views[urgent]["state"] == "admitted"
    assert len(views[urgent]["nodes"]) == 2
    assert views[urgent]["cluster"] == "sim-h100"
    assert views[urgent]["runs"][0]["epoch"] == epoch
    for i in ids:
        assert views[i]["state"] == "queued"
        assert views[i]["reason"].startswith("no-fit: needs 4 pods")
        assert "room for 2" in views[i]["reason"]
        # Next to the sentence, the kind and fields machines read (the autoscaler reads the kind).
        assert views[i]["reason_detail"] == {
            "kind": "no-fit",
            "pods": 4,
            "best_cluster": "sim-h100",
            "placed": 2,
            "protected": [],
            "protected_until": None,
        }
    assert [views[i]["queue_position"] for i in ids] == [1, 2, 3]
    with wiring.uow() as uow:
        kinds = uow.cloud.pending_kinds()
    assert {kinds[i] for i in ids} == {"no-fit"}


def test_queue_limit_keeps_work_pending_with_a_quota_reason(
    wiring: Wiring, client: TestClient, tenant: Tenant, admin: dict[str, str]
) -> None:
    assert client.patch(f"/v1/queues/{tenant.queue}", json={"limit": {"gpu-eq": 48}}, headers=admin).status_code == 200
    first = client.post("/v1/workloads", json=gang("a", tenant.queue, replicas=1, gpus=8), headers=tenant.headers)
    big = client.post("/v1/workloads", json=gang("b", tenant.queue, replicas=2, gpus=8), headers=tenant.headers)
    small = client.post("/v1/workloads", json=gang("c", tenant.queue, replicas=4, gpus=8), headers=tenant.headers)
    epoch = acquire_leadership(wiring.uow, "s", utc_now(), TTL)
    assert epoch is not None
    _cycle(wiring, "s", epoch)
    states = {
        name: client.get(f"/v1/workloads/{r.json()['id']}", headers=tenant.headers).json()
        for name, r in (("a", first), ("b", big), ("c", small))
    }
    assert states["a"]["state"] == "admitted"
    assert states["b"]["state"] == "admitted"
    assert states["c"]["state"] == "queued"
    assert (
        states["c"]["reason"]
        == "quota: vision-train limit is 48 gpu-eq and its work in use leaves less than the 32 this gang needs"
    )
    assert states["c"]["reason_detail"] == {
        "kind": "quota-limit",
        "node": "vision-train",
        "key": "gpu-eq",
        "limit": 48.0,
        "amount": 32.0,
        "never": False,
    }


def test_cancelled_workload_is_never_admitted(wiring: Wiring, client: TestClient, tenant: Tenant) -> None:
    wid = client.post("/v1/workloads", json=gang("gone", tenant.queue), headers=tenant.headers).json()["id"]
    client.post(f"/v1/workloads/{wid}/cancel", headers=tenant.headers)
    epoch = acquire_leadership(wiring.uow, "s", utc_now(), TTL)
    assert epoch is not None
    _cycle(wiring, "s", epoch)
    view = client.get(f"/v1/workloads/{wid}", headers=tenant.headers).json()
    assert view["state"] == "cancelled"
    assert view["runs"] == []


def test_preemption_requeues_the_victim_tears_it_down_and_tells_consumers(
    wiring: Wiring, client: TestClient, tenant: Tenant
) -> None:
    low = [
        client.post("/v1/workloads", json=gang(f"low{i}", tenant.queue, replicas=2), headers=tenant.headers).json()[
            "id"
        ]
        for i in range(2)
    ]
    epoch = acquire_leadership(wiring.uow, "s", utc_now(), TTL)
    assert epoch is not None
    _cycle(wiring, "s", epoch)
    urgent = client.post(
        "/v1/workloads", json=gang("urgent", tenant.queue, replicas=2, priority_class="urgent"), headers=tenant.headers
    ).json()["id"]
    _cycle(wiring, "s", epoch)
    views = {i: client.get(f"/v1/workloads/{i}", headers=tenant.headers).json() for i in [*low, urgent]}
    assert views[urgent]["state"] == "admitted"
    # Both low gangs were admitted in the same cycle: exactly one of them makes room.
    assert sorted(views[i]["state"] for i in low) == ["admitted", "queued"]
    victim = next(views[i] for i in low if views[i]["state"] == "queued")
    assert victim["reason"].startswith("preempted: workload urgent (priority 1000)")
    assert [r["state"] for r in victim["runs"]] == ["preempted"]
    with wiring.uow() as uow:
        assert [t.run_id for t in uow.runs.to_teardown(10)] == [victim["runs"][0]["id"]]
        subjects = [s for _, s, _ in uow.outbox.unpublished(100)]
    assert f"{wiring.settings.subject_prefix}.events.workload.{tenant.team}.{tenant.queue}.preempted" in subjects
