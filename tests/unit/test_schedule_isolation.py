"""One bad gang or queue never fails a scheduling cycle for the whole fleet (issue 11)."""

from __future__ import annotations

from controlplane.core.decision import PendingKind
from controlplane.core.schedule import MAX_FAILED_GANGS_PER_CYCLE
from controlplane.domain.model import QueueNode, Quota
from controlplane.service.wording import pending_text
from tests.unit.builders import (
    admitted_ids,
    gpus,
    make_queue,
    make_snapshot,
    make_workload,
    mig,
    reason_of,
    run_schedule,
    single_pool_fleet,
    tree_of,
)


def two_queues(q2: QueueNode | None = None) -> dict[str, QueueNode]:
    return tree_of(
        make_queue("cohort"),
        make_queue("t1", "cohort"),
        make_queue("q1", "t1"),
        q2 or make_queue("q2", "t1"),
    )


def test_a_gang_whose_scheduling_raises_gets_a_reason_and_the_others_are_admitted() -> None:
    clusters, nodes = single_pool_fleet(nodes=4)
    # A MIG profile no GPU has (stored before validation existed, or by hand): computing its
    # gpu-eq raises. It is first in line, so every other gang comes after it in the same cycle.
    poison = make_workload("poison", mig("99g.999gb"), priority=100, seq=0)
    others = [make_workload(f"ok-{i}", gpus(8), seq=i + 1, queue="q1" if i % 2 else "q2") for i in range(3)]
    decision = run_schedule(make_snapshot(clusters, nodes, [poison, *others], tree=two_queues()))
    assert admitted_ids(decision) == ["ok-0", "ok-1", "ok-2"]
    reason = reason_of(decision, "poison")
    assert reason.startswith("error:")
    assert "InvalidSharingMode" in reason
    assert decision.stats.get("failed") == 1


def test_after_too_many_failing_gangs_the_cycle_keeps_its_decisions_and_defers_the_rest() -> None:
    clusters, nodes = single_pool_fleet(nodes=8)
    good_first = make_workload("first", gpus(8), priority=200, seq=0)
    poisons = [make_workload(f"poison-{i}", mig("0g.0gb"), priority=100, seq=1 + i) for i in range(5)]
    later = make_workload("later", gpus(8), priority=0, seq=10)
    decision = run_schedule(make_snapshot(clusters, nodes, [good_first, *poisons, later]))
    assert "first" in admitted_ids(decision)
    failed = [p for p in decision.pending if p.kind is PendingKind.ERROR and "raised" in pending_text(p)]
    assert len(failed) == MAX_FAILED_GANGS_PER_CYCLE
    deferred = {
        p.workload_id
        for p in decision.pending
        if p.kind is PendingKind.NOT_CONSIDERED and "not considered this cycle" in pending_text(p)
    }
    assert "later" in deferred or "later" in admitted_ids(decision)
    # Every pending gang has exactly one reason.
    ids = [p.workload_id for p in decision.pending]
    assert len(ids) == len(set(ids)) == 6 - (1 if "later" in admitted_ids(decision) else 0)


def test_an_infinite_queue_limit_holds_only_that_queues_gangs() -> None:
    clusters, nodes = single_pool_fleet(nodes=2)
    broken = QueueNode(id="q2", name="q2", parent_id="t1", limit=Quota({"gpu-eq": float("inf")}))
    pending = [make_workload("in-q2", gpus(8), queue="q2", seq=0), make_workload("in-q1", gpus(8), queue="q1", seq=1)]
    decision = run_schedule(make_snapshot(clusters, nodes, pending, tree=two_queues(broken)))
    assert admitted_ids(decision) == ["in-q1"]
    reason = reason_of(decision, "in-q2")
    assert reason.startswith("quota: unusable")
    assert "limit gpu-eq=inf" in reason


def test_nan_weight_and_absurd_guarantee_on_a_team_hold_its_queues_only() -> None:
    clusters, nodes = single_pool_fleet(nodes=2)
    tree = tree_of(
        make_queue("cohort"),
        QueueNode(id="t1", name="t1", parent_id="cohort", weight=float("nan")),
        make_queue("q1", "t1"),
        QueueNode(id="t2", name="t2", parent_id="cohort", guaranteed=Quota({"gpu-eq": 1e300})),
        make_queue("q2", "t2"),
        make_queue("t3", "cohort"),
        make_queue("q3", "t3"),
    )
    pending = [
        make_workload("a", gpus(8), queue="q1", team="t1", seq=0),
        make_workload("b", gpus(8), queue="q2", team="t2", seq=1),
        make_workload("c", gpus(8), queue="q3", team="t3", seq=2),
    ]
    decision = run_schedule(make_snapshot(clusters, nodes, pending, tree=tree))
    assert admitted_ids(decision) == ["c"]
    assert "weight nan" in reason_of(decision, "a")
    assert "guaranteed gpu-eq=1e+300" in reason_of(decision, "b")
