"""Property tests: random small fleets, queue trees, live runs and pending gangs.

Live runs are made the way production makes them: by scheduling an earlier batch of workloads on
the empty fleet and turning its admissions into runs. Then a second batch is scheduled on top.
"""

from __future__ import annotations

import os
import random
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import replace
from fractions import Fraction
from typing import NamedTuple

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.core.invariants import check_decision
from controlplane.core.snapshot import Decision, Policy, Snapshot
from controlplane.domain.model import Cluster, Node, NodePool, PodSet, QueueNode, Taint, Toleration, Workload
from controlplane.service.wording import eviction_text, pending_text
from tests.unit.builders import (
    cpu_only,
    frac,
    gpus,
    live_run_of,
    make_cluster,
    make_nodes,
    make_pool,
    make_queue,
    make_snapshot,
    make_workload,
    mig,
    run_schedule,
    tree_of,
)

MODELS = ("A100-80GB", "H100-80GB")  # both carry 1g.10gb / 2g.20gb / 3g.40gb in all-balanced
SHARINGS = ("exclusive", "mig:all-balanced", "timeslice:4")
QUEUES = ("q1", "q2", "q3")
PARENT = {"cohort": None, "t1": "cohort", "t2": "cohort", "q1": "t1", "q2": "t1", "q3": "t2"}
SPOT = Taint("spot", "true")

# GPUFLEET_PROPERTY_EXAMPLES=5000 for a long soak; 100 keeps the unit run fast.
PROPERTY_SETTINGS = settings(
    max_examples=int(os.environ.get("GPUFLEET_PROPERTY_EXAMPLES", "100")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# --- strategies --------------------------------------------------------------------------------


@st.composite
def fleets(draw: st.DrawFn) -> tuple[tuple[Cluster, ...], tuple[Node, ...]]:
    clusters: list[Cluster] = []
    nodes: list[Node] = []
    for c in range(draw(st.integers(1, 3))):
        cluster_id = f"c{c}"
        pools = []
        for p in range(draw(st.integers(1, 2))):
            pool = make_pool(
                f"{cluster_id}p{p}",
                cluster_id,
                gpu_model=draw(st.sampled_from(MODELS)),
                gpus_per_node=draw(st.sampled_from([1, 2, 4, 8])),
                sharing=draw(st.sampled_from(SHARINGS)),
                cpu_millis=draw(st.sampled_from([4_000, 64_000])),
                memory_mib=64_000,
                taints=draw(st.sampled_from([(), (SPOT,), (Taint("nvidia.com/gpu", "present"),)])),
            )
            pools.append(pool)
            count = draw(st.integers(1, 3))
            cordoned = draw(st.sets(st.integers(0, count - 1), max_size=1))
            nodes.extend(make_nodes(pool, count, unschedulable=cordoned))
        clusters.append(make_cluster(cluster_id, *pools))
    return tuple(clusters), tuple(nodes)


LIMITS = st.one_of(st.none(), st.none(), st.integers(0, 16).map(float), st.sampled_from([0.5, 1.5, 2.25]))


@st.composite
def queue_trees(draw: st.DrawFn) -> dict[str, QueueNode]:
    return tree_of(*(make_queue(q, parent, limit=draw(LIMITS)) for q, parent in PARENT.items()))


@st.composite
def pod_sets(draw: st.DrawFn, name: str) -> PodSet:
    replicas = draw(st.integers(1, 3))
    models = draw(st.sampled_from([(), (), ("A100-80GB",), ("H100-80GB",)]))
    kind = draw(st.sampled_from(["gpus", "mig", "frac", "cpu"]))
    if kind == "gpus":
        return gpus(draw(st.sampled_from([1, 2, 4, 8])), replicas, name=name, models=models)
    if kind == "mig":
        return mig(draw(st.sampled_from(["1g.10gb", "2g.20gb", "3g.40gb"])), replicas, name=name, models=models)
    if kind == "frac":
        return frac(draw(st.sampled_from([0.25, 0.3, 0.5, 0.75])), replicas, name=name, models=models)
    return cpu_only(replicas, name=name, cpu_millis=draw(st.sampled_from([500, 3000])))


@st.composite
def workloads(draw: st.DrawFn, prefix: str, seq_base: int) -> list[Workload]:
    result = []
    for i in range(draw(st.integers(0 if prefix == "old" else 1, 6))):
        names = ["workers"] if draw(st.booleans()) else ["launcher", "workers"]
        sets = [draw(pod_sets(name)) for name in names]
        total = sum(ps.replicas for ps in sets)
        least = draw(st.one_of(st.just(total), st.integers(1, total)))  # strict or elastic gangs
        if draw(st.integers(0, 3)) == 0:  # partial admission: per-pod-set minimums fix min_available
            sets = [replace(ps, min_replicas=draw(st.integers(1, ps.replicas))) for ps in sets]
            least = sum(ps.least for ps in sets)
        result.append(
            make_workload(
                f"{prefix}{i}",
                *sets,
                queue=draw(st.sampled_from(QUEUES)),
                priority=draw(st.integers(0, 2)),
                seq=seq_base + draw(st.integers(0, 3)),  # duplicate seqs exercise the id tie-break
                min_available=least,
                isolation=draw(st.booleans()),
                tolerations=draw(st.sampled_from([(), (Toleration("spot", "Exists"),)])),
            )
        )
    return result


class Scenario(NamedTuple):
    first: Snapshot  # earlier workloads on the empty fleet
    first_decision: Decision
    snapshot: Snapshot  # new workloads on top of the runs the first round admitted


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    clusters, nodes = draw(fleets())
    tree = draw(queue_trees())
    earlier = draw(workloads("old", 0))
    first = make_snapshot(clusters, nodes, earlier, tree=tree)
    first_decision = run_schedule(first)
    by_id = {w.id: w for w in earlier}
    live = [live_run_of(a, by_id[a.workload_id]) for a in first_decision.admissions]
    pending = draw(workloads("new", 100))
    return Scenario(first, first_decision, make_snapshot(clusters, nodes, pending, tree=tree, live=live))


# --- independent re-computations ---------------------------------------------------------------


def gpu_eq_held(demand: Mapping[str, int], pool: NodePool) -> Fraction:
    """GPU-equivalents one pod holds: whole GPUs, shares of `replicas`, MIG compute slices of 7."""
    total = Fraction(demand.get("gpu", 0))
    if pool.sharing.shared:
        total += Fraction(demand.get("share", 0), pool.sharing.replicas)
    for key, count in demand.items():
        if key.startswith("mig:"):
            total += Fraction(int(key[4]) * count, 7)  # profiles here are 1g/2g/3g
    return total


def assert_decision_is_sound(snapshot: Snapshot, decision: Decision) -> None:
    check_decision(snapshot, decision)

    pools = snapshot.pools_by_id()
    node_by_id = {n.id: n for n in snapshot.nodes}
    pool_of_node = {n.id: pools[n.pool_id] for n in snapshot.nodes}
    pending = {w.id: w for w in snapshot.pending}

    # admitted and pending partition the pending workloads
    admitted = [a.workload_id for a in decision.admissions]
    waiting = [p.workload_id for p in decision.pending]
    assert Counter(admitted + waiting) == Counter(w.id for w in snapshot.pending)

    # every waiting workload has a reason of a known kind (positions are read from the queue's order)
    for reason in decision.pending:
        text = pending_text(reason)
        assert text.strip()
        assert text.startswith(("quota:", "no-fit:", "never-fits:", "isolation:", "fair-share:")), text
        assert text.startswith("quota:") == reason.kind.is_quota
        assert reason.kind.is_quota or text.startswith(f"{reason.kind}:"), (reason.kind, text)

    # admitted pods are real pods of the gang, on schedulable nodes of pools allowed to serve them
    for admission in decision.admissions:
        workload = pending[admission.workload_id]
        sets = {ps.name: ps for ps in workload.pod_sets}
        keys = [(a.pod_set, a.index) for a in admission.assignments]
        assert len(keys) == len(set(keys))
        for a in admission.assignments:
            assert a.index < sets[a.pod_set].replicas
            assert node_by_id[a.node_id].schedulable
            pool = pool_of_node[a.node_id]
            assert pool.cluster_id == admission.cluster_id
            assert pool.sharing.isolated or not workload.requires_isolation
            assert not pool.untolerated_taints(workload.tolerations)
            assert dict(a.demand) == sets[a.pod_set].demand_on(pool)

    # no limit anywhere in the tree is exceeded (live + admitted usage of its subtree)
    usage: dict[str, Fraction] = defaultdict(Fraction)
    evicted = {e.run_id or e.workload_id for e in decision.evictions}
    held_by_queue = [
        (r.queue_id, r.assignments) for r in snapshot.live_runs if (r.run_id or r.workload_id) not in evicted
    ] + [(pending[a.workload_id].queue_id, a.assignments) for a in decision.admissions]
    for queue_id, assignments in held_by_queue:
        held = sum((gpu_eq_held(a.demand, pool_of_node[a.node_id]) for a in assignments), Fraction(0))
        node: str | None = queue_id
        while node is not None:
            usage[node] += held
            node = PARENT.get(node)
    for tree_node in snapshot.queue_tree.values():
        bound = tree_node.limit.amounts.get("gpu-eq")
        if bound is not None:
            assert usage[tree_node.id] <= Fraction(bound).limit_denominator(10**6), tree_node.id


# --- properties --------------------------------------------------------------------------------


@PROPERTY_SETTINGS
@given(scenarios())
def test_decisions_on_top_of_live_runs_never_over_commit_split_gangs_or_exceed_limits(scenario: Scenario) -> None:
    assert_decision_is_sound(scenario.snapshot, run_schedule(scenario.snapshot))


@PROPERTY_SETTINGS
@given(scenarios())
def test_decisions_on_an_empty_fleet_are_sound(scenario: Scenario) -> None:
    assert_decision_is_sound(scenario.first, scenario.first_decision)


@PROPERTY_SETTINGS
@given(scenarios(), st.randoms(use_true_random=False))
def test_schedule_is_deterministic_and_ignores_input_order(scenario: Scenario, rnd: random.Random) -> None:
    snapshot = scenario.snapshot
    decision = run_schedule(snapshot)
    assert run_schedule(snapshot) == decision
    pending = list(snapshot.pending)
    live = list(snapshot.live_runs)
    rnd.shuffle(pending)
    rnd.shuffle(live)
    shuffled = make_snapshot(snapshot.clusters, snapshot.nodes, pending, tree=snapshot.queue_tree, live=live)
    assert run_schedule(shuffled) == decision


@PROPERTY_SETTINGS
@given(scenarios())
def test_an_admitted_gang_is_also_admitted_when_scheduled_alone(scenario: Scenario) -> None:
    """With no competition, a gang that won its place in a crowd still fits and stays within limits.

    The runs the crowd's cycle evicted are gone in the lone run too: a gang of another queue may
    have been admitted on capacity a preemption in the crowd freed, which it could not free itself."""
    snapshot = scenario.snapshot
    by_id = {w.id: w for w in snapshot.pending}
    decision = run_schedule(snapshot)
    evicted = {e.workload_id for e in decision.evictions}
    for admission in decision.admissions:
        alone = make_snapshot(
            snapshot.clusters,
            snapshot.nodes,
            [by_id[admission.workload_id]],
            tree=snapshot.queue_tree,
            live=[r for r in snapshot.live_runs if r.workload_id not in evicted],
        )
        assert [a.workload_id for a in run_schedule(alone).admissions] == [admission.workload_id]


@PROPERTY_SETTINGS
@given(scenarios())
def test_a_second_round_with_no_new_capacity_admits_nothing_the_first_round_left_for_lack_of_room(
    scenario: Scenario,
) -> None:
    """Re-running the first round's leftovers on top of its own admissions admits none of them."""
    first, decision = scenario.first, scenario.first_decision
    by_id = {w.id: w for w in first.pending}
    live = [live_run_of(a, by_id[a.workload_id]) for a in decision.admissions]
    leftovers = [by_id[p.workload_id] for p in decision.pending]
    # Without evictions: a leftover may rightly preempt a lower-priority gang admitted after it.
    no_evictions = Policy(preemption=False, reclaim=False)
    again = run_schedule(
        make_snapshot(first.clusters, first.nodes, leftovers, tree=first.queue_tree, live=live), no_evictions
    )
    assert again.admissions == ()
    # Fair share may order queues differently once usage changed; the set left pending is the same.
    assert sorted(p.workload_id for p in again.pending) == sorted(p.workload_id for p in decision.pending)


@PROPERTY_SETTINGS
@given(scenarios(), st.integers(1, 3))
def test_opt_in_rebalancing_stays_sound_and_within_its_rate(scenario: Scenario, per_cycle: int) -> None:
    """Rebalancing takes only from other queues, never higher priority, at most `per_cycle` gangs,
    and only for a gang it then admits."""
    snapshot = scenario.snapshot
    policy = Policy(rebalance=True, rebalance_max_per_cycle=per_cycle)
    decision = run_schedule(snapshot, policy)
    assert_decision_is_sound(snapshot, decision)
    assert run_schedule(snapshot, policy) == decision
    rebalanced = [e for e in decision.evictions if e.kind == "rebalance"]
    assert len(rebalanced) <= per_cycle
    runs = {r.run_id or r.workload_id: r for r in snapshot.live_runs}
    pending = {w.id: w for w in snapshot.pending}
    admitted = {a.workload_id for a in decision.admissions}
    for eviction in rebalanced:
        victim, beneficiary = runs[eviction.run_id or eviction.workload_id], pending[eviction.beneficiary]
        assert victim.queue_id != beneficiary.queue_id
        assert victim.priority <= beneficiary.priority
        assert beneficiary.id in admitted
        assert eviction_text(eviction).startswith("rebalanced:")


@PROPERTY_SETTINGS
@given(scenarios())
def test_rebalancing_and_idle_reclaim_need_their_inputs(scenario: Scenario) -> None:
    """Off by default, and with no run marked reclaimable nothing is taken for idleness."""
    kinds = {e.kind for e in run_schedule(scenario.snapshot).evictions}
    assert not kinds & {"rebalance", "idle"}


@PROPERTY_SETTINGS
@given(scenarios(), st.data())
def test_idle_reclaim_takes_only_marked_runs_for_gangs_it_admits(scenario: Scenario, data: st.DataObject) -> None:
    snapshot = scenario.snapshot
    marked = data.draw(st.sets(st.sampled_from(range(len(snapshot.live_runs))))) if snapshot.live_runs else set()
    live = tuple(replace(r, idle_reclaimable=i in marked) for i, r in enumerate(snapshot.live_runs))
    snapshot = replace(snapshot, live_runs=live)
    decision = run_schedule(snapshot)
    assert_decision_is_sound(snapshot, decision)
    admitted = {a.workload_id for a in decision.admissions}
    for eviction in decision.evictions:
        if eviction.kind == "idle":
            assert live[[r.workload_id for r in live].index(eviction.workload_id)].idle_reclaimable
            assert eviction.beneficiary in admitted
