"""`IncrementalScheduler.park`: the reasons of the gangs a cycle leaves parked are known before the
ordered pass, so the live scheduler stores them first (a new gang behind its queue's heads learns
so without waiting for that pass); `decide` then tells only the candidates' reasons."""

from __future__ import annotations

from dataclasses import replace

from controlplane.core.decision import BehindHeads, QuotaLimit
from controlplane.core.incremental import IncrementalScheduler
from controlplane.core.schedule import schedule
from controlplane.core.snapshot import LiveRun, Policy
from controlplane.domain.model import PodAssignment
from tests.unit.builders import NOW, gpus, make_queue, make_snapshot, make_workload, single_pool_fleet, tree_of

# No eviction: a blocked gang cannot ask for one, so every blocked head is parked, not decided.
POLICY = Policy(heads_per_queue=2, preemption=False, reclaim=False)


def test_park_tells_the_parked_reasons_and_decide_only_the_candidates() -> None:
    clusters, nodes = single_pool_fleet(nodes=2)
    tree = tree_of(
        make_queue("cohort"), make_queue("t1", "cohort"), make_queue("q1", "t1", limit=2), make_queue("q2", "t1")
    )
    full = LiveRun(
        "r",
        "q1",
        "c1",
        0,
        (PodAssignment("worker", 0, nodes[0].id, {"cpu": 1000, "mem": 4096, "gpu": 2}),),
        run_id="r1",
    )
    waiting = [make_workload(f"w{i}", gpus(1), queue="q1", seq=i) for i in range(3)]
    too_big = make_workload("big", gpus(3), queue="q1", seq=9)  # more than q1's limit on its own
    free = make_workload("free", gpus(1), queue="q2", seq=1)
    snapshot = make_snapshot(clusters, nodes, [*waiting, too_big, free], tree=tree, live=[full])
    scheduler = IncrementalScheduler()

    early = {p.workload_id: p.why for p in scheduler.park(snapshot, POLICY)}
    assert set(early) == {"w0", "w1", "w2", "big"}
    assert isinstance(early["w0"], QuotaLimit)  # its first two heads
    assert isinstance(early["w1"], QuotaLimit)
    assert isinstance(early["w2"], BehindHeads)
    assert isinstance(early["big"], QuotaLimit)
    assert early["big"].never
    decision = scheduler.decide(snapshot, POLICY, NOW)
    assert [a.workload_id for a in decision.admissions] == ["free"]
    assert decision.pending == ()  # nothing left to tell: the parked reasons were told by `park`
    one_shot = schedule(snapshot, POLICY, NOW)
    assert {p.workload_id: p.why for p in one_shot.pending} == early
    assert scheduler.pending_reasons() == {p.workload_id: p for p in one_shot.pending}

    # A gang arriving behind the heads is told by `park`, and only it.
    late = make_workload("late", gpus(1), queue="q1", seq=20)
    after = replace(snapshot, pending=(*waiting, too_big, late))
    assert [(p.workload_id, type(p.why)) for p in scheduler.park(after, POLICY)] == [("late", BehindHeads)]
    assert scheduler.decide(after, POLICY, NOW).pending == ()

    # `decide` alone (no `park` before it on this snapshot) tells everything that changed itself.
    again = replace(after, pending=(*waiting, too_big, late, make_workload("later", gpus(1), queue="q1", seq=21)))
    assert [p.workload_id for p in scheduler.decide(again, POLICY, NOW).pending] == ["later"]
