"""The scheduling policy of issue 3: guarantees, borrowing, reclaim, preemption, fair share."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from controlplane.core.decision import EndCause, EvictionKind, NoFit
from controlplane.core.invariants import check_decision
from controlplane.core.snapshot import Decision, LiveRun, Policy, Snapshot
from controlplane.domain.model import PodAssignment, PodSet, QueueNode, Quota, Workload
from controlplane.service.wording import eviction_text, pending_text
from tests.unit.builders import (
    NOW,
    gpus,
    live_run_of,
    make_cluster,
    make_nodes,
    make_pool,
    make_snapshot,
    make_workload,
    run_schedule,
    tree_of,
)

POOL = make_pool(gpus_per_node=8)
CLUSTERS = (make_cluster("c1", POOL),)
NODES = make_nodes(POOL, 4)  # 32 H100


def q(id: str, parent: str | None = "team", **quotas: dict[str, float]) -> QueueNode:
    return QueueNode(
        id=id,
        name=id,
        parent_id=parent,
        guaranteed=Quota(quotas.get("guaranteed", {})),
        limit=Quota(quotas.get("limit", {})),
        borrowing_limit=Quota(quotas.get("borrowing", {})),
        lending_limit=Quota(quotas.get("lending", {})),
        weight=quotas.get("weight", {}).get("w", 1.0),
    )


def running(
    id: str,
    node: int,
    *,
    queue: str = "a",
    priority: int = 0,
    preemptible: bool = True,
    age_s: float = 3600,
    min_runtime: int = 0,
    idle: bool = False,
    gpus_used: int = 8,
) -> LiveRun:
    """A one-pod gang holding `gpus_used` GPUs of node `node`."""
    started = NOW - timedelta(seconds=age_s)
    return LiveRun(
        workload_id=id,
        queue_id=queue,
        cluster_id="c1",
        priority=priority,
        assignments=(PodAssignment("worker", 0, NODES[node].id, {"gpu": gpus_used, "cpu": 1000, "mem": 4096}),),
        run_id=f"run-{id}",
        preemptible=preemptible,
        started_at=started,
        admitted_at=started,
        min_runtime_seconds=min_runtime,
        idle=idle,
    )


def full_cluster(queue: str = "a", priority: int = 0, **kw: object) -> list[LiveRun]:
    return [running(f"r{i}", i, queue=queue, priority=priority, age_s=3600 - i, **kw) for i in range(4)]  # type: ignore[arg-type]


def decide(
    pending: list[Workload], live: list[LiveRun], tree: dict[str, QueueNode], policy: Policy | None = None
) -> Decision:
    snapshot: Snapshot = make_snapshot(CLUSTERS, NODES, pending, tree=tree, live=live)
    decision = run_schedule(snapshot, policy)
    check_decision(snapshot, decision)
    return decision


def evicted(decision: Decision) -> list[tuple[str, str]]:
    return sorted((e.workload_id, e.kind) for e in decision.evictions)


def admitted(decision: Decision) -> list[str]:
    return [a.workload_id for a in decision.admissions]


def two_queues(**a: dict[str, float]) -> dict[str, QueueNode]:
    return tree_of(q("team", None), q("a"), q("b", **a))


# --- priority preemption inside a queue ---------------------------------------------------------


def test_higher_priority_preempts_lower_priority_of_its_own_queue() -> None:
    urgent = make_workload("urgent", gpus(8), queue="a", priority=10)
    decision = decide([urgent], full_cluster(), two_queues())
    assert admitted(decision) == ["urgent"]
    [eviction] = decision.evictions
    assert eviction.kind == "preempt"
    assert eviction.beneficiary == "urgent"
    assert eviction.workload_id == "r3"  # the most recently admitted of the lowest priority
    assert "preempted: workload urgent (priority 10)" in eviction_text(eviction)


def test_equal_priority_never_preempts() -> None:
    same = make_workload("same", gpus(8), queue="a", priority=0)
    decision = decide([same], full_cluster(), two_queues())
    assert decision.evictions == ()
    assert pending_text(decision.pending[0]).startswith("no-fit")


def test_priority_never_preempts_across_queues() -> None:
    urgent = make_workload("urgent", gpus(8), queue="b", priority=1000)
    decision = decide([urgent], full_cluster(queue="a"), two_queues())
    assert decision.evictions == ()
    assert admitted(decision) == []


def test_victim_set_is_minimal() -> None:
    big = make_workload("big", gpus(8, replicas=2), queue="a", priority=10)
    decision = decide([big], full_cluster(), two_queues())
    assert evicted(decision) == [("r2", "preempt"), ("r3", "preempt")]
    assert admitted(decision) == ["big"]


def test_non_preemptible_and_min_runtime_protect_a_run() -> None:
    live = [
        running("np", 0, preemptible=False),
        running("young", 1, min_runtime=7200, age_s=60),
        running("old", 2, age_s=10_000),
        running("other", 3, age_s=9_000),
    ]
    decision = decide([make_workload("urgent", gpus(8), queue="a", priority=10)], live, two_queues())
    assert evicted(decision) == [("other", "preempt")]


def test_disruption_budget_bounds_evictions() -> None:
    big = make_workload("big", gpus(8, replicas=2), queue="a", priority=10)
    decision = decide([big], full_cluster(), two_queues(), Policy(disruption_budget=1))
    assert decision.evictions == ()
    assert admitted(decision) == []


def test_idle_runs_are_evicted_before_busy_ones() -> None:
    live = full_cluster()
    live[0] = replace(live[0], idle=True)
    decision = decide([make_workload("urgent", gpus(8), queue="a", priority=10)], live, two_queues())
    assert evicted(decision) == [("r0", "preempt")]


def test_no_eviction_when_the_gang_would_not_fit_anyway() -> None:
    huge = make_workload("huge", gpus(8, replicas=5), queue="a", priority=10)
    decision = decide([huge], full_cluster(), two_queues())
    assert decision.evictions == ()


# --- guarantees, borrowing and reclaim -----------------------------------------------------------


def test_queue_below_its_guarantee_reclaims_borrowed_capacity_whatever_its_priority() -> None:
    tree = tree_of(q("team", None), q("a"), q("b", guaranteed={"gpu-eq": 16}))
    live = full_cluster(queue="a", priority=1000)  # a has no guarantee: all of it is borrowed
    decision = decide([make_workload("mine", gpus(8), queue="b", priority=0)], live, tree)
    assert admitted(decision) == ["mine"]
    [eviction] = decision.evictions
    assert eviction.kind == "reclaim"
    assert "takes back its guarantee" in eviction_text(eviction)
    # The decision is data: who gains, from which queue, and how the run will be said to have ended.
    assert eviction.kind is EvictionKind.RECLAIM
    assert (eviction.beneficiary, eviction.beneficiary_name, eviction.beneficiary_queue) == ("mine", "mine", "b")
    assert (eviction.victim_queue, eviction.victim_priority) == ("a", 1000)
    assert eviction.end_cause is EndCause.RECLAIMED


def test_nobody_evicts_in_order_to_borrow() -> None:
    tree = tree_of(q("team", None), q("a"), q("b", guaranteed={"gpu-eq": 8}))
    big = make_workload("big", gpus(8, replicas=2), queue="b")
    decision = decide([big], full_cluster(queue="a"), tree)
    assert decision.evictions == ()


def test_work_within_its_own_guarantee_is_not_reclaimed() -> None:
    tree = tree_of(q("team", None), q("a", guaranteed={"gpu-eq": 32}), q("b", guaranteed={"gpu-eq": 16}))
    decision = decide([make_workload("mine", gpus(8), queue="b")], full_cluster(queue="a"), tree)
    assert decision.evictions == ()


def test_reclaim_takes_only_what_the_queue_borrowed() -> None:
    # a is guaranteed 24 and uses 32: only 8 of it is borrowed, so one gang at most is reclaimed.
    tree = tree_of(q("team", None), q("a", guaranteed={"gpu-eq": 24}), q("b", guaranteed={"gpu-eq": 16}))
    big = make_workload("big", gpus(8, replicas=2), queue="b")
    decision = decide([big], full_cluster(queue="a"), tree)
    assert decision.evictions == ()
    small = make_workload("small", gpus(8), queue="b")
    assert len(decide([small], full_cluster(queue="a"), tree).evictions) == 1


def test_non_preemptible_work_runs_only_within_a_guarantee() -> None:
    tree = tree_of(q("team", None), q("a"), q("b", guaranteed={"gpu-eq": 8}))
    fixed_a = replace(make_workload("fa", gpus(8), queue="a"), preemptible=False)
    fixed_b = replace(make_workload("fb", gpus(8), queue="b"), preemptible=False)
    too_big = replace(make_workload("fb2", gpus(8, replicas=2), queue="b", seq=1), preemptible=False)
    decision = decide([fixed_a, fixed_b, too_big], [], tree)
    assert admitted(decision) == ["fb"]
    reasons = {p.workload_id: pending_text(p) for p in decision.pending}
    assert "non-preemptible" in reasons["fa"]
    assert "non-preemptible" in reasons["fb2"]


def test_borrowing_limit_bounds_use_above_the_guarantee() -> None:
    tree = tree_of(q("team", None), q("a", guaranteed={"gpu-eq": 8}, borrowing={"gpu-eq": 8}))
    pending = [make_workload(f"w{i}", gpus(8), queue="a", seq=i) for i in range(3)]
    decision = decide(pending, [], tree)
    assert admitted(decision) == ["w0", "w1"]
    assert pending_text(decision.pending[0]) == "quota: a may borrow at most 8 gpu-eq above its guarantee"


def test_unlent_guarantee_stays_free_for_its_owner() -> None:
    tree = tree_of(q("team", None), q("a"), q("b", guaranteed={"gpu-eq": 16}, lending={"gpu-eq": 8}))
    pending = [make_workload(f"w{i}", gpus(8), queue="a", seq=i) for i in range(4)]
    decision = decide(pending, [], tree)
    # b keeps 16 - 8 = 8 GPUs of its unused guarantee out of reach: a gets 3 of the 4 nodes.
    assert admitted(decision) == ["w0", "w1", "w2"]
    assert "guarantee other queues do not lend" in pending_text(decision.pending[0])


# --- fair share -----------------------------------------------------------------------------------


def test_fair_share_splits_free_capacity_by_weight() -> None:
    tree = tree_of(q("team", None), q("a", weight={"w": 3.0}), q("b", weight={"w": 1.0}))
    pending = [make_workload(f"a{i}", gpus(8), queue="a", seq=i) for i in range(4)]
    pending += [make_workload(f"b{i}", gpus(8), queue="b", seq=10 + i) for i in range(4)]
    decision = decide(pending, [], tree)
    won = [w[0] for w in admitted(decision)]
    assert sorted(won) == ["a", "a", "a", "b"]


def test_equal_weights_share_equally_even_when_one_queue_submitted_first() -> None:
    tree = tree_of(q("team", None), q("a"), q("b"))
    pending = [make_workload(f"a{i}", gpus(8), queue="a", seq=i) for i in range(4)]
    pending += [make_workload(f"b{i}", gpus(8), queue="b", seq=10 + i) for i in range(4)]
    assert sorted(w[0] for w in admitted(decide(pending, [], tree))) == ["a", "a", "b", "b"]
    fifo = decide(pending, [], tree, Policy(fair_share=False))
    assert admitted(fifo) == ["a0", "a1", "a2", "a3"]


def test_queue_below_its_guarantee_goes_before_borrowers() -> None:
    tree = tree_of(q("team", None), q("a"), q("b", guaranteed={"gpu-eq": 8}))
    live = [running("r0", 0, queue="a"), running("r1", 1, queue="a")]
    pending = [make_workload("a-next", gpus(8), queue="a", seq=0), make_workload("b-first", gpus(8), queue="b", seq=9)]
    decision = decide(pending, live, tree)
    assert admitted(decision)[0] == "b-first"


# --- placement scoring and reasons -----------------------------------------------------------------


def test_cheaper_cluster_wins_when_fit_is_equal() -> None:
    dear = make_pool("dear", "c1", gpus_per_node=8)
    cheap = make_pool("cheap", "c2", gpus_per_node=8)
    dear = replace(dear, price_per_gpu_hour=11.0)
    cheap = replace(cheap, price_per_gpu_hour=6.9)
    clusters = (make_cluster("c1", dear), make_cluster("c2", cheap))
    snapshot = make_snapshot(clusters, make_nodes(dear, 1) + make_nodes(cheap, 1), [make_workload("w", gpus(8))])
    assert [a.cluster_id for a in run_schedule(snapshot).admissions] == ["c2"]


def test_placement_avoids_leaving_a_node_partly_used() -> None:
    # 4 GPUs fit on the half-used node (no new fragment) or on an empty one (which it would split).
    pool = make_pool(gpus_per_node=8)
    nodes = make_nodes(pool, 2)
    half = LiveRun("old", "a", "c1", 0, (PodAssignment("worker", 0, nodes[1].id, {"gpu": 4, "cpu": 1, "mem": 1}),))
    snapshot = make_snapshot((make_cluster("c1", pool),), nodes, [make_workload("w", gpus(4))], live=[half])
    [admission] = run_schedule(snapshot).admissions
    assert admission.assignments[0].node_id == nodes[1].id


def test_isolation_is_named_when_only_time_sliced_pools_could_serve() -> None:
    shared = make_pool("ts", sharing="timeslice:4", gpus_per_node=4)
    snapshot = make_snapshot(
        (make_cluster("c1", shared),),
        make_nodes(shared, 1),
        [make_workload("llm", PodSet("server", 1, gpu_fraction=0.5), isolation=True)],
    )
    [pending] = run_schedule(snapshot).pending
    assert pending_text(pending).startswith("isolation: this workload requires isolation")


def _spot_and_on_demand() -> tuple[tuple[object, ...], tuple[object, ...]]:
    on_demand = replace(make_pool("od", "c1", gpus_per_node=8), price_per_gpu_hour=4.0)
    spot = replace(make_pool("spot", "c1", gpus_per_node=8), spot=True, price_per_gpu_hour=1.5)
    return (make_cluster("c1", on_demand, spot),), make_nodes(on_demand, 1) + make_nodes(spot, 1)


def test_spot_preference_steers_placement() -> None:
    clusters, nodes = _spot_and_on_demand()

    def pool_for(preference: str) -> str:
        workload = replace(make_workload("w", gpus(8)), spot=preference)
        [admission] = run_schedule(make_snapshot(clusters, nodes, [workload])).admissions  # type: ignore[arg-type]
        return admission.assignments[0].node_id.split("-")[0]

    assert pool_for("prefer") == "spot"
    assert pool_for("allow") == "spot"  # cheaper, nothing against it
    assert pool_for("avoid") == "od"


def test_never_spot_keeps_a_gang_off_spot_pools_even_when_only_they_have_room() -> None:
    clusters, nodes = _spot_and_on_demand()
    busy = LiveRun("old", "q1", "c1", 0, (PodAssignment("worker", 0, nodes[0].id, {"gpu": 8, "cpu": 1, "mem": 1}),))
    workload = replace(make_workload("w", gpus(8)), spot="never")
    decision = run_schedule(make_snapshot(clusters, nodes, [workload], live=[busy]))  # type: ignore[arg-type]
    assert decision.admissions == ()
    assert pending_text(decision.pending[0]).startswith("no-fit")


def test_a_gang_spread_over_pools_stays_in_one_zone() -> None:
    zone = "topology.kubernetes.io/zone"
    a = make_pool("a", "c1", gpus_per_node=8)
    b = make_pool("b", "c1", gpus_per_node=8)
    c = make_pool("c", "c1", gpus_per_node=8)
    a, b, c = (replace(a, labels={zone: "z1"}), replace(b, labels={zone: "z2"}), replace(c, labels={zone: "z1"}))
    nodes = make_nodes(a, 1) + make_nodes(b, 1) + make_nodes(c, 1)
    snapshot = make_snapshot((make_cluster("c1", a, b, c),), nodes, [make_workload("w", gpus(8, replicas=2))])
    [admission] = run_schedule(snapshot).admissions
    assert sorted(x.node_id.split("-")[0] for x in admission.assignments) == ["a", "c"]


def test_same_pool_required_waits_rather_than_spread() -> None:
    a = make_pool("a", "c1", gpus_per_node=8)
    b = make_pool("b", "c1", gpus_per_node=8)
    nodes = make_nodes(a, 1) + make_nodes(b, 2)
    busy = LiveRun("old", "q1", "c1", 0, (PodAssignment("worker", 0, nodes[1].id, {"gpu": 8, "cpu": 1, "mem": 1}),))
    strict = replace(make_workload("strict", gpus(8, replicas=2)), same_pool="required")
    loose = make_workload("loose", gpus(8, replicas=2), seq=1)
    snapshot = make_snapshot((make_cluster("c1", a, b),), nodes, [strict, loose], live=[busy])
    decision = run_schedule(snapshot, Policy(max_reservations=0))
    assert admitted(decision) == ["loose"]  # one node of a + the free node of b
    assert [p.workload_id for p in decision.pending] == ["strict"]


def test_a_never_spot_gang_does_not_reuse_the_answer_of_an_identical_spot_tolerant_one() -> None:
    clusters, nodes = _spot_and_on_demand()
    busy = LiveRun("old", "q1", "c1", 0, (PodAssignment("worker", 0, nodes[0].id, {"gpu": 8, "cpu": 1, "mem": 1}),))
    allow = make_workload("allow", gpus(8))
    never = replace(make_workload("never", gpus(8), seq=1), spot="never")
    for order in ([allow, never], [never, allow]):
        decision = run_schedule(make_snapshot(clusters, nodes, order, live=[busy]), Policy(max_reservations=0))  # type: ignore[arg-type]
        assert admitted(decision) == ["allow"]


def test_a_reservation_names_its_cluster_by_name_and_the_gangs_behind_it_point_to_it() -> None:
    pool = make_pool(gpus_per_node=8)
    clusters, nodes = (make_cluster("c1", pool, name="east"),), make_nodes(pool, 2)
    small = make_workload("small", gpus(8), queue="b")
    busy = live_run_of(run_schedule(make_snapshot(clusters, nodes, [small])).admissions[0], small)
    big = make_workload("big", gpus(8, replicas=2), queue="a", seq=1)
    behind = make_workload("behind", gpus(8, replicas=2), queue="a", seq=2)
    decision = run_schedule(make_snapshot(clusters, nodes, [big, behind], live=[busy]))
    reasons = {p.workload_id: p for p in decision.pending}
    note = reasons["big"].reservation
    assert note is not None
    assert (note.cluster, note.holder, note.nodes, note.due) == ("east", "big", 2, None)
    assert reasons["behind"].reservation == note
    assert isinstance(reasons["big"].why, NoFit)
    assert pending_text(reasons["big"]).endswith(
        "reservation: 2 node(s) of cluster east held for big, due when running work ends"
    )
