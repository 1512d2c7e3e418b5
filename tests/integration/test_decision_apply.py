"""Writing a decision: the set-based pending reasons, the epoch fence, a restarted leader's first
write, and the scheduler loop waking on a change that is not its own (every test on SQLite and
PostgreSQL)."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from adapters.sql.pending_reasons import write_pending
from adapters.sql.tables import PendingReasonRow, RunRow, WorkloadRow
from controlplane.bootstrap import Wiring, utc_now
from controlplane.core.decision import EndCause
from controlplane.core.incremental import IncrementalScheduler
from controlplane.core.snapshot import Policy
from controlplane.service.errors import LostLeadership
from controlplane.service.ports import PendingRecord
from controlplane.service.scheduling import LIVE_RUN_STATES, LIVE_WORKLOAD_STATES, acquire_leadership, run_cycle
from controlplane.service.snapshot_cache import SnapshotCache
from controlplane.workers.scheduler_loop import wait_for_next_cycle
from tests.integration.fleet import Tenant, gang

# workload id -> (its own reason, its pending row's reason, kind and detail or None, its state)
Stored = dict[str, tuple[str, str | None, str | None, Any, str]]


def _stored(wiring: Wiring) -> Stored:
    with wiring.uow() as uow:
        rows = uow.session.execute(  # type: ignore[attr-defined]
            select(
                WorkloadRow.id,
                WorkloadRow.reason,
                PendingReasonRow.reason,
                PendingReasonRow.kind,
                PendingReasonRow.detail,
                WorkloadRow.state,
            ).outerjoin(PendingReasonRow, PendingReasonRow.workload_id == WorkloadRow.id)
        ).all()
    return {row[0]: tuple(row[1:]) for row in rows}


def _submit(client: TestClient, tenant: Tenant, count: int, replicas: int = 2) -> list[str]:
    ids = []
    for i in range(count):
        body = gang(f"g{i}", tenant.queue, replicas=replicas)
        response = client.post("/v1/workloads", json=body, headers=tenant.headers)
        assert response.status_code in (200, 201, 202), response.text
        ids.append(response.json()["id"])
    return ids


def _row_by_row(before: Stored, records: list[PendingRecord]) -> tuple[Stored, int]:
    """What writing each record alone would leave: a queued workload whose shown reason or kind
    (its pending row's, else its own reason and kind "") differs gets a pending row with all three
    fields; anything else keeps what it has."""
    after, written = dict(before), 0
    for r in records:
        own, reason, kind, _, state = before[r.workload_id]
        shown = (own, "") if reason is None else (reason, kind)
        if state == "queued" and shown != (r.text, r.kind):
            after[r.workload_id] = (own, r.text, r.kind, dict(r.detail), state)
            written += 1
    return after, written


def test_set_based_reasons_are_what_row_by_row_writes_would_store(
    wiring: Wiring, client: TestClient, tenant: Tenant
) -> None:
    ids = _submit(client, tenant, 6)  # no scheduler runs here: all stay queued
    with wiring.uow() as uow:
        uow.workloads.set_state(ids[5], ["queued"], "cancelled", "cancelled", utc_now())
        uow.commit()
    shared = {"kind": "no-fit", "needed": 40, "quote": 'a "quoted" \\ text'}
    records = [
        PendingRecord(ids[0], "no fit: 40 pods", "no-fit", shared),
        PendingRecord(ids[1], "no fit: 40 pods", "no-fit", shared),
        PendingRecord(ids[2], "quota: team over its limit ünïcode", "quota-limit", {"kind": "quota-limit"}),
        PendingRecord(ids[3], "no fit: 40 pods", "no-fit", shared),
        PendingRecord(ids[5], "never written: cancelled", "no-fit", shared),
    ]
    with wiring.uow() as uow:
        assert write_pending(uow.session, records[3:4]) == 1  # type: ignore[attr-defined]
        uow.commit()
    before = _stored(wiring)
    expected, expected_count = _row_by_row(before, records)
    with wiring.uow() as uow:
        written = write_pending(uow.session, records)  # type: ignore[attr-defined]
        uow.commit()
    assert _stored(wiring) == expected
    assert written == expected_count == 3  # ids[3] already held its reason, ids[5] is not queued
    with wiring.uow() as uow:
        assert write_pending(uow.session, records) == 0  # type: ignore[attr-defined]
        uow.commit()


def test_a_deposed_leaders_decision_writes_nothing(wiring: Wiring, client: TestClient, tenant: Tenant) -> None:
    _submit(client, tenant, 5)
    epoch = acquire_leadership(wiring.uow, "old", utc_now(), 3600.0)
    assert epoch is not None
    before = _stored(wiring)
    assert acquire_leadership(wiring.uow, "new", utc_now() + timedelta(hours=2), 3600.0) is not None
    with pytest.raises(LostLeadership):
        run_cycle(wiring.uow, "old", epoch, Policy(), wiring.settings.subject_prefix, utc_now(), 3600.0)
    assert _stored(wiring) == before  # neither admissions nor reasons landed


def test_a_restarted_leader_sends_only_the_reasons_that_differ_from_what_is_stored(
    wiring: Wiring, client: TestClient, tenant: Tenant
) -> None:
    _submit(client, tenant, 6)
    prefix = wiring.settings.subject_prefix
    epoch = acquire_leadership(wiring.uow, "s", utc_now(), 3600.0)
    assert epoch is not None
    cache = SnapshotCache()
    for _ in range(3):  # admit, then reasons settle on the capacity the admitted gangs took
        run_cycle(wiring.uow, "s", epoch, Policy(), prefix, utc_now(), 3600.0, True, cache=cache)
    stored = _stored(wiring)
    restarted = SnapshotCache()  # a new leader's cache: a full load, reasons read beside it
    sent: list[int] = []
    pending_to_write = restarted.pending_to_write

    def counting(records: Any) -> Any:
        chosen = pending_to_write(records)
        sent.append(len(chosen))
        return chosen

    restarted.pending_to_write = counting  # type: ignore[method-assign]
    result = run_cycle(wiring.uow, "s", epoch, Policy(), prefix, utc_now(), 3600.0, True, cache=restarted)
    assert (result.admitted, result.reasons_written, result.pending) == (0, 0, 4)
    assert sent == [0]  # nothing differed from the stored reasons: nothing was even sent
    assert _stored(wiring) == stored


def test_a_cycle_on_the_kept_state_counts_every_gang_it_leaves_pending(
    wiring: Wiring, client: TestClient, tenant: Tenant
) -> None:
    """The kept state's decision lists only the reasons that changed (the park phase stored the
    rest): the count the cycle reports (its log line, `gpufleet_scheduler_cycle_pending_gangs`) is
    still every gang left pending."""
    _submit(client, tenant, 6)
    prefix = wiring.settings.subject_prefix
    epoch = acquire_leadership(wiring.uow, "s", utc_now(), 3600.0)
    assert epoch is not None
    cache, scheduler = SnapshotCache(), IncrementalScheduler()

    def cycle() -> Any:
        return run_cycle(
            wiring.uow, "s", epoch, Policy(), prefix, utc_now(), 3600.0, True, cache=cache, scheduler=scheduler
        )

    first = cycle()
    assert first.admitted + first.pending == 6
    cycle()  # the reasons settle on the capacity the admitted gangs took
    again = cycle()
    assert (again.admitted, again.reasons_written, again.pending) == (0, 0, first.pending)


async def test_the_loop_wakes_for_a_change_and_otherwise_waits_out_its_interval(
    wiring: Wiring, client: TestClient, tenant: Tenant
) -> None:
    with wiring.uow() as uow:
        seen = uow.snapshots.latest_change()
    stop = asyncio.Event()
    waiting = asyncio.create_task(wait_for_next_cycle(wiring.uow, stop, time.monotonic(), 3600.0, seen))
    await asyncio.sleep(0.3)  # several polls: nothing changed, so it still waits
    assert not waiting.done()
    await asyncio.to_thread(_submit, client, tenant, 1)
    await asyncio.wait_for(waiting, timeout=30)  # the submit's change woke it, long before the hour
    blind = asyncio.create_task(wait_for_next_cycle(wiring.uow, stop, time.monotonic(), 3600.0, None))
    await asyncio.sleep(0.3)
    assert not blind.done()  # without a cursor (standby, after an error) only the interval or stop
    stop.set()
    await asyncio.wait_for(blind, timeout=30)


def test_evictions_are_written_set_based_each_run_and_workload_with_its_own_values(
    wiring: Wiring, client: TestClient, tenant: Tenant
) -> None:
    ids = _submit(client, tenant, 3, replicas=1)
    epoch = acquire_leadership(wiring.uow, "s", utc_now(), 3600.0)
    assert epoch is not None
    run_cycle(wiring.uow, "s", epoch, Policy(), wiring.settings.subject_prefix, utc_now(), 3600.0, True)
    with wiring.uow() as uow:
        session = uow.session  # type: ignore[attr-defined]
        runs = dict(session.execute(select(RunRow.workload_id, RunRow.id)).all())
        assert set(runs) == set(ids)
        first, second, third = (runs[w] for w in ids)
        now = utc_now()
        assert uow.runs.end_all([(third, "done", EndCause.SUCCEEDED)], LIVE_RUN_STATES, "succeeded", now) == {third}
        ends = [
            (first, "preempted: for w", EndCause.PREEMPTED),
            (second, "reclaimed: for q", EndCause.RECLAIMED),
            (third, "preempted: too late", EndCause.PREEMPTED),  # ended already: left alone
        ]
        assert uow.runs.end_all(ends, LIVE_RUN_STATES, "preempted", now) == {first, second}
        changes = [(ids[0], "queued", "preempted: for w"), (ids[1], "failed", "reclaimed: stopped")]
        assert uow.workloads.set_states(changes, LIVE_WORKLOAD_STATES, now) == {ids[0], ids[1]}
        assert uow.workloads.set_states([(ids[0], "failed", "again")], LIVE_WORKLOAD_STATES, now) == set()
        uow.commit()
    with wiring.uow() as uow:
        session = uow.session  # type: ignore[attr-defined]
        ended = {
            row[0]: tuple(row[1:])
            for row in session.execute(select(RunRow.id, RunRow.state, RunRow.message, RunRow.end_cause))
        }
        workloads = {
            row[0]: (row[1], row[2], row[3] is not None)
            for row in session.execute(
                select(WorkloadRow.id, WorkloadRow.state, WorkloadRow.reason, WorkloadRow.finished_at)
            )
        }
    assert ended == {
        first: ("preempted", "preempted: for w", "preempted"),
        second: ("preempted", "reclaimed: for q", "reclaimed"),
        third: ("succeeded", "done", "succeeded"),
    }
    assert workloads[ids[0]] == ("queued", "preempted: for w", False)
    assert workloads[ids[1]] == ("failed", "reclaimed: stopped", True)
    assert workloads[ids[2]][0] == "admitted"  # not asked to move


def test_a_loan_of_reserved_capacity_is_stored_with_its_run_and_taken_back_through_sql(
    wiring: Wiring, client: TestClient, tenant: Tenant
) -> None:
    """The live path end to end: a run admitted on capacity reserved for a waiting gang keeps that
    gang's id (`runs.lent_to`, shown on the workload's runs); the next snapshot reads it back, and
    once the work the reservation waited for ends, the owner takes the capacity back (end cause
    `taken-back`) and starts in the same cycle."""
    prefix = wiring.settings.subject_prefix
    epoch = acquire_leadership(wiring.uow, "s", utc_now(), 3600.0)
    assert epoch is not None

    def submit(body: dict[str, Any]) -> str:
        response = client.post("/v1/workloads", json=body, headers=tenant.headers)
        assert response.status_code in (200, 201, 202), response.text
        return str(response.json()["id"])

    def cycle() -> None:
        run_cycle(wiring.uow, "s", epoch, Policy(), prefix, utc_now(), 3600.0, True)

    occupant = submit(gang("occupant", tenant.queue, replicas=3, max_runtime_seconds=3600))
    cycle()
    big = submit(gang("big", tenant.queue, replicas=4))
    filler = submit(gang("filler", tenant.queue, replicas=1))
    cycle()
    lent = client.get(f"/v1/workloads/{filler}", headers=tenant.headers).json()
    assert lent["state"] == "admitted"
    assert lent["runs"][-1]["lent_to"] == big
    with wiring.uow() as uow:
        session = uow.session  # type: ignore[attr-defined]
        runs = {row[0]: row[1:] for row in session.execute(select(RunRow.workload_id, RunRow.id, RunRow.lent_to))}
        assert runs[filler][1] == big
        assert runs[occupant][1] is None
        uow.runs.end_all([(runs[occupant][0], "done", EndCause.SUCCEEDED)], LIVE_RUN_STATES, "succeeded", utc_now())
        uow.workloads.set_states([(occupant, "succeeded", "done")], LIVE_WORKLOAD_STATES, utc_now())
        uow.commit()
    cycle()
    taken = client.get(f"/v1/workloads/{filler}", headers=tenant.headers).json()
    assert taken["state"] == "queued"
    assert taken["runs"][-1]["end_cause"] == "taken-back"
    assert taken["runs"][-1]["message"].startswith("taken-back: this run borrowed capacity held for workload big")
    assert client.get(f"/v1/workloads/{big}", headers=tenant.headers).json()["state"] == "admitted"


async def test_the_cycles_own_writes_do_not_wake_the_loop_anyone_elses_do(
    wiring: Wiring, client: TestClient, tenant: Tenant
) -> None:
    _submit(client, tenant, 3, replicas=1)
    epoch = acquire_leadership(wiring.uow, "s", utc_now(), 3600.0)
    assert epoch is not None
    prefix, cache = wiring.settings.subject_prefix, SnapshotCache()
    result = run_cycle(wiring.uow, "s", epoch, Policy(), prefix, utc_now(), 3600.0, True, cache=cache)
    assert result.admitted >= 1
    assert result.own_changes
    seen = cache.last_change_read
    assert seen is not None
    stop = asyncio.Event()
    # Blind to nothing, the poll sees the decision's own writes at once: they were logged.
    await asyncio.wait_for(wait_for_next_cycle(wiring.uow, stop, time.monotonic(), 3600.0, seen), timeout=30)
    waiting = asyncio.create_task(
        wait_for_next_cycle(wiring.uow, stop, time.monotonic(), 3600.0, seen, result.own_changes)
    )
    await asyncio.sleep(0.3)  # several polls, all past only the cycle's own changes
    assert not waiting.done()
    await asyncio.to_thread(_submit, client, tenant, 1)
    await asyncio.wait_for(waiting, timeout=30)  # someone else's change wakes it
    # The next cycle still reads what its predecessor wrote: nothing admitted is admitted again.
    again = run_cycle(wiring.uow, "s", epoch, Policy(), prefix, utc_now(), 3600.0, True, cache=cache)
    with wiring.uow() as uow:
        states = uow.session.execute(select(WorkloadRow.state)).scalars().all()  # type: ignore[attr-defined]
    assert states.count("admitted") == result.admitted + again.admitted
