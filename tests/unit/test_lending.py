"""Reserved capacity is lent while its reservation waits, and taken back by the gang it is held for.

The fleet: one cluster, two 8-GPU nodes. `occupant` runs on one node until NOW + 1 h (declared);
`big` needs both nodes, so it holds them from NOW, due in an hour; the other node is free.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.core.decision import EvictionKind
from controlplane.core.incremental import IncrementalScheduler, same_decision
from controlplane.core.invariants import InvariantViolation, check_decision
from controlplane.core.schedule import schedule
from controlplane.core.snapshot import Admission, Decision, Eviction, LiveRun, Policy, Snapshot
from controlplane.domain.model import Workload
from tests.unit.builders import (
    NOW,
    gpus,
    live_run_of,
    make_cluster,
    make_nodes,
    make_pool,
    make_snapshot,
    make_workload,
    reason_of,
    run_schedule,
)
from tests.unit.test_schedule_properties import PROPERTY_SETTINGS

POOL = make_pool(gpus_per_node=8)
CLUSTERS = (make_cluster("c1", POOL),)
NODES = make_nodes(POOL, 2)
BIG = make_workload("big", gpus(8, 2), seq=1)


def _occupant() -> LiveRun:
    occupant = make_workload("occupant", gpus(8), seq=0)
    (admission,) = run_schedule(make_snapshot(CLUSTERS, NODES[:1], [occupant])).admissions
    return replace(live_run_of(admission, occupant), run_id="occupant-r", admitted_at=NOW, max_runtime_seconds=3600)


def _borrower(**changes: object) -> Workload:
    return replace(make_workload("borrower", gpus(8), seq=2), **changes)


def _first_cycle(borrower: Workload, policy: Policy | None = None) -> tuple[Snapshot, Decision]:
    snapshot = make_snapshot(CLUSTERS, NODES, [BIG, borrower], live=[_occupant()])
    return snapshot, run_schedule(snapshot, policy)


def _lent_run(borrower: Workload, decision: Decision) -> LiveRun:
    (admission,) = decision.admissions
    return replace(live_run_of(admission, borrower), run_id="borrower-r", admitted_at=NOW)


def test_a_preemptible_gang_borrows_what_a_reservation_holds_and_is_marked_lent_to_its_owner() -> None:
    _, decision = _first_cycle(_borrower())
    assert [(a.workload_id, a.lent_to) for a in decision.admissions] == [("borrower", "big")]
    assert "2 node(s) of cluster c1 held for big, due by" in reason_of(decision, "big")


@pytest.mark.parametrize(
    "changes",
    [
        {"preemptible": False},  # it could never be taken back
        {"min_runtime_seconds": 7200},  # still protected when the reservation is due (in 3600 s)
    ],
)
def test_only_a_gang_that_can_be_given_back_by_the_time_the_reservation_is_due_borrows(
    changes: dict[str, object],
) -> None:
    _, decision = _first_cycle(_borrower(**changes))
    assert not decision.admissions


def test_a_minimum_runtime_that_ends_before_the_reservation_is_due_may_borrow() -> None:
    _, decision = _first_cycle(_borrower(min_runtime_seconds=1800))
    assert [a.lent_to for a in decision.admissions] == ["big"]


def test_lending_can_be_turned_off() -> None:
    _, decision = _first_cycle(_borrower(), Policy(lend_reserved=False))
    assert not decision.admissions


def test_while_it_waits_its_search_counts_what_it_lent_as_free() -> None:
    """Next cycle the lent run (no declared end) sits on one of its nodes: the reservation still
    holds both nodes, due when the occupant ends, not "when running work ends"."""
    borrower = _borrower()
    _, first = _first_cycle(borrower)
    lent = _lent_run(borrower, first)
    decision = run_schedule(make_snapshot(CLUSTERS, NODES, [BIG], live=[_occupant(), lent]))
    due = (NOW + timedelta(seconds=3600)).isoformat()
    assert f"2 node(s) of cluster c1 held for big, due by {due}" in reason_of(decision, "big")
    assert not decision.evictions


def test_once_the_work_it_waits_for_ends_the_owner_takes_back_what_it_lent_whatever_its_priority() -> None:
    borrower = _borrower()
    _, first = _first_cycle(borrower)
    lent = replace(_lent_run(borrower, first), priority=5)  # (its class's priority rose since)
    after = make_snapshot(CLUSTERS, NODES, [BIG], live=[lent])  # the occupant ended
    decision = run_schedule(after)
    check_decision(after, decision)
    assert [(e.workload_id, e.kind, e.beneficiary) for e in decision.evictions] == [
        ("borrower", EvictionKind.TAKE_BACK, "big")
    ]
    assert [a.workload_id for a in decision.admissions] == ["big"]
    assert str(decision.evictions[0].end_cause) == "taken-back"


def test_a_gang_takes_back_only_what_was_lent_to_it() -> None:
    borrower = _borrower()
    _, first = _first_cycle(borrower)
    # Of higher priority, so preemption may not take it either.
    lent_elsewhere = replace(_lent_run(borrower, first), lent_to="someone-else", priority=5)
    decision = run_schedule(make_snapshot(CLUSTERS, NODES, [BIG], live=[lent_elsewhere]))
    assert not decision.evictions
    assert not decision.admissions


def test_the_kept_state_lends_and_takes_back_as_the_one_shot_decision_does() -> None:
    borrower = _borrower()
    scheduler = IncrementalScheduler()
    snapshot, one_shot = _first_cycle(borrower)
    decision = scheduler.decide(snapshot, Policy(), NOW)
    assert same_decision(one_shot, decision, scheduler.pending_reasons())
    after = make_snapshot(CLUSTERS, NODES, [BIG], live=[_lent_run(borrower, decision)])
    decision = scheduler.decide(after, Policy(), NOW)
    assert same_decision(run_schedule(after), decision, scheduler.pending_reasons())
    assert [e.kind for e in decision.evictions] == [EvictionKind.TAKE_BACK]


def test_the_invariants_refuse_a_take_back_of_a_run_not_lent_to_the_taker_and_a_loan_that_cannot_come_back() -> None:
    borrower = _borrower()
    _, first = _first_cycle(borrower)
    lent = replace(_lent_run(borrower, first), lent_to="someone-else")
    snapshot = make_snapshot(CLUSTERS, NODES, [BIG], live=[lent])
    take_back = Eviction("borrower", "borrower-r", EvictionKind.TAKE_BACK, "big")
    with pytest.raises(InvariantViolation, match="not lent"):
        check_decision(snapshot, Decision(admissions=(), evictions=(take_back,), pending=()))
    steady = replace(borrower, preemptible=False)
    (admission,) = first.admissions
    loan = Admission(admission.workload_id, admission.cluster_id, admission.assignments, lent_to="big")
    pending = make_snapshot(CLUSTERS, NODES, [BIG, steady], live=[_occupant()])
    with pytest.raises(InvariantViolation, match="could not give back"):
        check_decision(pending, Decision(admissions=(loan,), evictions=(), pending=()))


# --- the kept state on random lending histories ---------------------------------------------------


@st.composite
def lending_histories(
    draw: st.DrawFn,
) -> tuple[int, list[LiveRun], list[Workload], list[Workload], list[tuple[str, int]]]:
    """A cluster of `k` 8-GPU nodes, all but one busy with runs that may declare an end; a
    head gang that needs every node; gangs behind it that may or may not borrow (preemptible or
    not, with or without a minimum runtime, whole or half nodes); then events."""
    k = draw(st.integers(2, 4))
    pool = make_pool(gpus_per_node=8)
    nodes = make_nodes(pool, k)
    occupants = [make_workload(f"occ{i}", gpus(8), priority=2, seq=i) for i in range(k - 1)]  # not preemptible by it
    placed = run_schedule(make_snapshot((make_cluster("c1", pool),), nodes[: k - 1], occupants)).admissions
    live = [
        replace(
            live_run_of(a, w),
            run_id=f"{w.id}-r",
            admitted_at=NOW,
            max_runtime_seconds=draw(st.sampled_from([None, 600.0, 3600.0])),
        )
        for a, w in zip(placed, occupants, strict=True)
    ]
    head = make_workload("big", gpus(8, k), priority=1, seq=10)
    behind = [
        replace(
            make_workload(f"b{i}", gpus(draw(st.sampled_from([4, 8]))), priority=draw(st.integers(0, 1)), seq=11 + i),
            preemptible=draw(st.booleans()),
            min_runtime_seconds=draw(st.sampled_from([0, 300, 7200])),
            max_runtime_seconds=draw(st.sampled_from([None, None, 300])),
        )
        for i in range(draw(st.integers(1, 4)))
    ]
    events = draw(st.lists(st.tuples(st.sampled_from(LENDING_EVENTS), st.integers(0, 100)), min_size=1, max_size=6))
    return k, live, [head, *behind], occupants, events


LENDING_EVENTS = ("occupants-end", "finish-occupant", "finish-any", "time", "nothing")


@given(lending_histories(), st.sampled_from([Policy(), Policy(disruption_budget=1), Policy(fair_share=False)]))
@PROPERTY_SETTINGS
def test_the_kept_state_lends_and_takes_back_as_the_one_shot_decision_on_random_histories(
    history: tuple[int, list[LiveRun], list[Workload], list[Workload], list[tuple[str, int]]], policy: Policy
) -> None:
    k, live, pending, occupants, events = history
    pool = make_pool(gpus_per_node=8)
    snapshot = make_snapshot((make_cluster("c1", pool),), make_nodes(pool, k), pending, live=live)
    waiting = {w.id: w for w in (*pending, *occupants)}  # for requeues
    scheduler, now = IncrementalScheduler(), NOW
    for step, (event, pick) in enumerate(events):
        decision = scheduler.decide(snapshot, policy, now)
        check_decision(snapshot, decision)
        assert same_decision(schedule(snapshot, policy, now), decision, scheduler.pending_reasons()), f"step {step}"
        by_id = {w.id: w for w in snapshot.pending}
        evicted = {e.run_id for e in decision.evictions}
        runs = [r for r in snapshot.live_runs if r.run_id not in evicted]
        for eviction in decision.evictions:
            by_id[eviction.workload_id] = waiting[eviction.workload_id]
        for admission in decision.admissions:
            run = live_run_of(admission, by_id.pop(admission.workload_id))
            workload = waiting[admission.workload_id]
            runs.append(
                replace(
                    run,
                    run_id=f"{admission.workload_id}-r{step}",
                    admitted_at=now,
                    preemptible=workload.preemptible,
                    min_runtime_seconds=workload.min_runtime_seconds,
                    max_runtime_seconds=workload.max_runtime_seconds,
                )
            )
        occupying = [r for r in runs if r.workload_id.startswith("occ")]
        if event == "occupants-end":
            runs = [r for r in runs if r not in occupying]
        elif event == "finish-occupant" and occupying:
            runs.remove(occupying[pick % len(occupying)])
        elif event == "finish-any" and runs:
            del runs[pick % len(runs)]
        elif event == "time":
            now += timedelta(seconds=pick * 40)
        snapshot = replace(snapshot, pending=tuple(by_id.values()), live_runs=tuple(runs))
    assert same_decision(
        schedule(snapshot, policy, now), scheduler.decide(snapshot, policy, now), scheduler.pending_reasons()
    )
