"""Where a workload's reason comes from (migration 0014), end to end on SQLite and PostgreSQL: while
it is queued, the scheduler's pending row if it has decided the gang since it was queued, else the
workload's own reason (the text of its last transition); every change of state drops the row."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import select

from adapters.sql.tables import PendingReasonRow, WorkloadRow
from controlplane.bootstrap import Wiring, utc_now
from controlplane.core.snapshot import Policy
from controlplane.service.ports import QUEUED_REASON, PendingRecord
from controlplane.service.scheduling import acquire_leadership, run_cycle
from tests.integration.fleet import Tenant, gang

TTL = 3600.0


def _view(client: TestClient, tenant: Tenant, workload_id: str) -> dict[str, Any]:
    response = client.get(f"/v1/workloads/{workload_id}", headers=tenant.headers)
    assert response.status_code == 200, response.text
    return dict(response.json())


def _listed(client: TestClient, tenant: Tenant) -> dict[str, dict[str, Any]]:
    response = client.get("/v1/workloads", headers=tenant.headers)
    assert response.status_code == 200, response.text
    return {item["id"]: item for item in response.json()["items"]}


def _pending_rows(wiring: Wiring) -> dict[str, tuple[str, str]]:
    with wiring.uow() as uow:
        rows = uow.session.execute(  # type: ignore[attr-defined]
            select(PendingReasonRow.workload_id, PendingReasonRow.reason, PendingReasonRow.kind)
        ).all()
    return {row[0]: (row[1], row[2]) for row in rows}


def _states(wiring: Wiring) -> dict[str, str]:
    with wiring.uow() as uow:
        return dict(uow.session.execute(select(WorkloadRow.id, WorkloadRow.state)).all())  # type: ignore[attr-defined]


def _record(wiring: Wiring, records: list[PendingRecord]) -> int:
    with wiring.uow() as uow:
        written = uow.workloads.record_pending(records)
        uow.commit()
    return written


def test_the_pending_row_is_shown_while_queued_and_goes_with_every_change_of_state(
    wiring: Wiring, client: TestClient, tenant: Tenant
) -> None:
    # 4 nodes x 8 H100: the two low gangs fill the cluster, the waiter finds no room.
    low = [
        client.post("/v1/workloads", json=gang(f"low{i}", tenant.queue, replicas=2), headers=tenant.headers).json()[
            "id"
        ]
        for i in range(2)
    ]
    waiter = client.post("/v1/workloads", json=gang("waiter", tenant.queue, replicas=2), headers=tenant.headers)
    waiter_id = waiter.json()["id"]
    fresh = _view(client, tenant, waiter_id)
    assert (fresh["reason"], fresh["reason_detail"], fresh["queue_position"]) == (QUEUED_REASON, None, None)

    # A reason written by record_pending is what the view and the list show.
    detail = {"kind": "no-fit", "pods": 2, "best_cluster": "sim-h100", "placed": 0}
    records = [PendingRecord(w, f"no-fit: {w} finds no room", "no-fit", detail) for w in [*low, waiter_id]]
    assert _record(wiring, records) == 3
    assert _record(wiring, records) == 0  # the same reasons again: nothing written
    view = _view(client, tenant, waiter_id)
    assert (view["reason"], view["reason_detail"], view["queue_position"]) == (
        f"no-fit: {waiter_id} finds no room",
        detail,
        3,
    )
    listed = _listed(client, tenant)
    assert [listed[w]["reason"] for w in [*low, waiter_id]] == [r.text for r in records]
    assert [listed[w]["queue_position"] for w in [*low, waiter_id]] == [1, 2, 3]
    undecided = client.post("/v1/workloads", json=gang("undecided", tenant.queue), headers=tenant.headers).json()["id"]
    with wiring.uow() as uow:
        assert {w: uow.cloud.pending_kinds()[w] for w in low} == dict.fromkeys(low, "no-fit")
        stored = uow.snapshots.stored_reasons()
    assert stored[waiter_id] == (f"no-fit: {waiter_id} finds no room", "no-fit")
    assert set(stored) == {*low, waiter_id}  # a gang the scheduler has not decided has no stored reason
    assert client.post(f"/v1/workloads/{undecided}/cancel", headers=tenant.headers).status_code == 200

    # The scheduler admits the low gangs (their rows go) and decides the waiter (its row changes).
    epoch = acquire_leadership(wiring.uow, "s", utc_now(), TTL)
    assert epoch is not None
    prefix = wiring.settings.subject_prefix
    run_cycle(wiring.uow, "s", epoch, Policy(), prefix, utc_now(), TTL, True)
    assert {w: _states(wiring)[w] for w in low} == dict.fromkeys(low, "admitted")
    assert set(_pending_rows(wiring)) == {waiter_id}
    admitted = _view(client, tenant, low[0])
    assert (admitted["reason"], admitted["reason_detail"], admitted["queue_position"]) == ("admitted", None, None)
    decided = _view(client, tenant, waiter_id)
    assert decided["reason"].startswith("no-fit: ")
    assert decided["reason_detail"]["kind"] == "no-fit"

    # No reason is written for a workload that is no longer queued.
    assert _record(wiring, [PendingRecord(low[0], "no-fit: too late", "no-fit", detail)]) == 0
    assert low[0] not in _pending_rows(wiring)

    # An urgent gang preempts one low gang: requeued, it shows the eviction text (no kind, no
    # position) until the scheduler decides it again.
    urgent = client.post(
        "/v1/workloads", json=gang("urgent", tenant.queue, replicas=2, priority_class="urgent"), headers=tenant.headers
    ).json()["id"]
    run_cycle(wiring.uow, "s", epoch, Policy(), prefix, utc_now(), TTL, True)
    [victim] = [w for w in low if _states(wiring)[w] == "queued"]
    requeued = _view(client, tenant, victim)
    assert requeued["reason"].startswith("preempted: workload urgent (priority 1000)")
    assert (requeued["reason_detail"], requeued["queue_position"]) == (None, None)
    assert _listed(client, tenant)[victim]["reason"] == requeued["reason"]
    assert victim not in _pending_rows(wiring)
    assert _states(wiring)[urgent] == "admitted"
    run_cycle(wiring.uow, "s", epoch, Policy(), prefix, utc_now(), TTL, True)
    again = _view(client, tenant, victim)
    assert again["reason"].startswith("no-fit: ")
    assert again["reason_detail"]["kind"] == "no-fit"
    assert again["queue_position"] is not None

    # A cancel drops the row too: the cancelled workload shows the cancel's text.
    assert client.post(f"/v1/workloads/{waiter_id}/cancel", headers=tenant.headers).status_code == 200
    cancelled = _view(client, tenant, waiter_id)
    assert (cancelled["state"], cancelled["reason_detail"]) == ("cancelled", None)
    assert not cancelled["reason"].startswith("no-fit")
    assert _listed(client, tenant)[waiter_id]["reason"] == cancelled["reason"]
    states = _states(wiring)
    assert all(states[w] == "queued" for w in _pending_rows(wiring))  # rows only for queued gangs


def test_writes_in_one_transaction_and_after_a_rollback_see_only_their_own_records(
    wiring: Wiring, client: TestClient, tenant: Tenant
) -> None:
    # PostgreSQL stages the records in a session table emptied at commit: a second write in the
    # same transaction, or the next one after a rolled-back write, must not re-apply earlier ones.
    ids = [
        client.post("/v1/workloads", json=gang(f"w{i}", tenant.queue), headers=tenant.headers).json()["id"]
        for i in range(3)
    ]
    first = [PendingRecord(w, f"no-fit: {w} first", "no-fit", {"kind": "no-fit"}) for w in ids]
    with wiring.uow() as uow:
        assert uow.workloads.record_pending(first) == 3
        # Rolled back: nothing stays, in the table or in the batch.
    assert _pending_rows(wiring) == {}
    with wiring.uow() as uow:
        assert uow.workloads.record_pending(first[:1]) == 1
        assert uow.workloads.record_pending([PendingRecord(ids[0], "no-fit: again", "no-fit", {})]) == 1
        second = [PendingRecord(ids[1], "behind: the heads", "behind-heads", {"kind": "behind-heads"})]
        assert uow.workloads.record_pending(second) == 1  # the first record is not applied again
        uow.commit()
    assert _pending_rows(wiring) == {
        ids[0]: ("no-fit: again", "no-fit"),
        ids[1]: ("behind: the heads", "behind-heads"),
    }
    assert _record(wiring, [PendingRecord(ids[2], "no-fit: later", "no-fit", {"kind": "no-fit"})]) == 1
    assert set(_pending_rows(wiring)) == set(ids)
