"""check_decision catches decisions that break the scheduler's invariants."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace

import pytest

from controlplane.core.decision import NoFit
from controlplane.core.invariants import InvariantViolation, check_decision
from controlplane.core.snapshot import Admission, Decision, PendingReason
from controlplane.domain.model import CPU, GPU, MEM, SHARE, PodAssignment
from tests.unit.builders import (
    default_tree,
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
    single_pool_fleet,
    tree_of,
)


def pod(node: str, demand: Mapping[str, int], index: int = 0, *, pod_set: str = "worker") -> PodAssignment:
    """One pod of a gang on `node`, holding `demand` plus the default host resources."""
    return PodAssignment(pod_set, index, node, {CPU: 1000, MEM: 4096, **demand})


def admit(workload_id: str, *assignments: PodAssignment, cluster: str = "c1") -> Admission:
    return Admission(workload_id, cluster, assignments)


def test_invariant_violation_is_an_assertion_error() -> None:
    assert issubclass(InvariantViolation, AssertionError)


def test_an_empty_decision_passes() -> None:
    clusters, nodes = single_pool_fleet()
    check_decision(make_snapshot(clusters, nodes, [make_workload("w")]), Decision())


def test_a_decision_of_the_scheduler_passes() -> None:
    clusters, nodes = single_pool_fleet(nodes=2)
    snapshot = make_snapshot(clusters, nodes, [make_workload(f"w{i}", gpus(3), seq=i) for i in range(6)])
    decision = run_schedule(snapshot)
    assert len(decision.admissions) == 4
    check_decision(snapshot, decision)


def test_a_node_filled_exactly_to_capacity_passes() -> None:
    clusters, nodes = single_pool_fleet(nodes=1)
    pending = [make_workload("a", gpus(4)), make_workload("b", gpus(4))]
    decision = Decision(admissions=(admit("a", pod("p1-n0", {GPU: 4})), admit("b", pod("p1-n0", {GPU: 4}))))
    check_decision(make_snapshot(clusters, nodes, pending), decision)


def test_two_admissions_over_committing_a_nodes_gpus_are_caught() -> None:
    clusters, nodes = single_pool_fleet(nodes=1)
    pending = [make_workload("a", gpus(8)), make_workload("b", gpus(1))]
    decision = Decision(admissions=(admit("a", pod("p1-n0", {GPU: 8})), admit("b", pod("p1-n0", {GPU: 1}))))
    with pytest.raises(InvariantViolation, match="node p1-n0 over-committed on gpu: 9 > 8"):
        check_decision(make_snapshot(clusters, nodes, pending), decision)


def test_an_admission_on_top_of_a_live_run_is_caught() -> None:
    clusters, nodes = single_pool_fleet(nodes=1)
    live_wl = make_workload("live", gpus(6))
    live = live_run_of(admit("live", pod("p1-n0", {GPU: 6})), live_wl)
    snapshot = make_snapshot(clusters, nodes, [make_workload("a", gpus(4))], live=[live])
    with pytest.raises(InvariantViolation, match="over-committed on gpu: 10 > 8"):
        check_decision(snapshot, Decision(admissions=(admit("a", pod("p1-n0", {GPU: 4})),)))


def test_mig_slice_over_commit_is_caught() -> None:
    clusters, nodes = single_pool_fleet(nodes=1, gpus_per_node=1, sharing="mig:all-balanced")
    workload = make_workload("a", mig("3g.40gb", 2))
    decision = Decision(
        admissions=(admit("a", pod("p1-n0", {"mig:3g.40gb": 1}, 0), pod("p1-n0", {"mig:3g.40gb": 1}, 1)),)
    )
    with pytest.raises(InvariantViolation, match=re.escape("over-committed on mig:3g.40gb: 2 > 1")):
        check_decision(make_snapshot(clusters, nodes, [workload]), decision)


def test_share_over_commit_is_caught() -> None:
    clusters, nodes = single_pool_fleet(nodes=1, gpus_per_node=1, sharing="timeslice:4")
    pending = [make_workload("a", frac(0.75)), make_workload("b", frac(0.5))]
    decision = Decision(admissions=(admit("a", pod("p1-n0", {SHARE: 3})), admit("b", pod("p1-n0", {SHARE: 2}))))
    with pytest.raises(InvariantViolation, match="over-committed on share: 5 > 4"):
        check_decision(make_snapshot(clusters, nodes, pending), decision)


def test_a_dimension_the_node_does_not_offer_is_an_over_commit() -> None:
    clusters, nodes = single_pool_fleet(nodes=1, sharing="mig:all-balanced")
    decision = Decision(admissions=(admit("a", pod("p1-n0", {GPU: 1})),))
    with pytest.raises(InvariantViolation, match="over-committed on gpu: 1 > 0"):
        check_decision(make_snapshot(clusters, nodes, [make_workload("a")]), decision)


def test_cpu_over_commit_is_caught() -> None:
    pool = make_pool(cpu_millis=1500)
    clusters, nodes = (make_cluster("c1", pool),), make_nodes(pool, 1)
    decision = Decision(admissions=(admit("a", pod("p1-n0", {GPU: 1}, 0), pod("p1-n0", {GPU: 1}, 1)),))
    with pytest.raises(InvariantViolation, match="over-committed on cpu"):
        check_decision(make_snapshot(clusters, nodes, [make_workload("a", gpus(1, 2))]), decision)


def test_a_gang_admitted_below_min_available_is_caught() -> None:
    clusters, nodes = single_pool_fleet(nodes=2)
    workload = make_workload("a", gpus(8, 3), min_available=2)
    decision = Decision(admissions=(admit("a", pod("p1-n0", {GPU: 8})),))
    with pytest.raises(InvariantViolation, match="gang a admitted with fewer than min_available pods"):
        check_decision(make_snapshot(clusters, nodes, [workload]), decision)


def test_an_elastic_gang_at_min_available_passes() -> None:
    clusters, nodes = single_pool_fleet(nodes=2)
    workload = make_workload("a", gpus(8, 3), min_available=2)
    decision = Decision(admissions=(admit("a", pod("p1-n0", {GPU: 8}, 0), pod("p1-n1", {GPU: 8}, 1)),))
    check_decision(make_snapshot(clusters, nodes, [workload]), decision)


def test_a_gang_spanning_clusters_is_caught() -> None:
    p1 = make_pool("p1", "c1")
    p2 = make_pool("p2", "c2")
    clusters = (make_cluster("c1", p1), make_cluster("c2", p2))
    nodes = make_nodes(p1, 1) + make_nodes(p2, 1)
    decision = Decision(admissions=(admit("a", pod("p1-n0", {GPU: 8}, 0), pod("p2-n0", {GPU: 8}, 1)),))
    with pytest.raises(InvariantViolation, match=r"gang a spans clusters \['c1', 'c2'\]"):
        check_decision(make_snapshot(clusters, nodes, [make_workload("a", gpus(8, 2))]), decision)


def test_an_admission_naming_the_wrong_cluster_is_caught() -> None:
    p1 = make_pool("p1", "c1")
    p2 = make_pool("p2", "c2")
    clusters = (make_cluster("c1", p1), make_cluster("c2", p2))
    nodes = make_nodes(p1, 1) + make_nodes(p2, 1)
    decision = Decision(admissions=(admit("a", pod("p2-n0", {GPU: 8}), cluster="c1"),))
    with pytest.raises(InvariantViolation, match="spans clusters"):
        check_decision(make_snapshot(clusters, nodes, [make_workload("a", gpus(8))]), decision)


def test_admitting_a_workload_twice_is_caught() -> None:
    clusters, nodes = single_pool_fleet(nodes=2)
    decision = Decision(admissions=(admit("a", pod("p1-n0", {GPU: 1})), admit("a", pod("p1-n1", {GPU: 1}))))
    with pytest.raises(InvariantViolation, match="admitted a twice or while not pending"):
        check_decision(make_snapshot(clusters, nodes, [make_workload("a")]), decision)


def test_admitting_a_workload_that_is_not_pending_is_caught() -> None:
    clusters, nodes = single_pool_fleet(nodes=1)
    decision = Decision(admissions=(admit("ghost", pod("p1-n0", {GPU: 1})),))
    with pytest.raises(InvariantViolation, match="admitted ghost twice or while not pending"):
        check_decision(make_snapshot(clusters, nodes, [make_workload("a")]), decision)


def test_a_queue_pushed_above_its_gpu_eq_limit_is_caught() -> None:
    clusters, nodes = single_pool_fleet(nodes=1)
    snapshot = make_snapshot(clusters, nodes, [make_workload("a", gpus(5))], tree=default_tree(queue_limit=4))
    with pytest.raises(InvariantViolation, match="q1 above its gpu-eq limit"):
        check_decision(snapshot, Decision(admissions=(admit("a", pod("p1-n0", {GPU: 5})),)))


def test_queue_limit_check_includes_live_usage() -> None:
    clusters, nodes = single_pool_fleet(nodes=1)
    live = live_run_of(admit("old", pod("p1-n0", {GPU: 3})), make_workload("old", gpus(3)))
    snapshot = make_snapshot(
        clusters, nodes, [make_workload("a", gpus(2))], tree=default_tree(queue_limit=4), live=[live]
    )
    with pytest.raises(InvariantViolation, match="q1 above its gpu-eq limit"):
        check_decision(snapshot, Decision(admissions=(admit("a", pod("p1-n0", {GPU: 2})),)))


def test_queue_at_exactly_its_limit_passes() -> None:
    clusters, nodes = single_pool_fleet(nodes=1, sharing="mig:all-balanced")
    snapshot = make_snapshot(
        clusters,
        nodes,
        [make_workload("a", mig("3g.40gb", 2), mig("1g.10gb", name="x"))],
        tree=default_tree(queue_limit=1),
    )
    decision = Decision(
        admissions=(
            admit(
                "a",
                pod("p1-n0", {"mig:3g.40gb": 1}, 0),
                pod("p1-n0", {"mig:3g.40gb": 1}, 1),
                pod("p1-n0", {"mig:1g.10gb": 1}, 0, pod_set="x"),
            ),
        )
    )
    check_decision(snapshot, decision)


def test_pending_reasons_do_not_affect_the_check() -> None:
    clusters, nodes = single_pool_fleet(nodes=1)
    snapshot = make_snapshot(clusters, nodes, [make_workload("a")])
    check_decision(snapshot, Decision(pending=(PendingReason("a", NoFit(1, None)),)))


def test_a_team_pushed_above_its_gpu_eq_limit_is_caught() -> None:
    clusters, nodes = single_pool_fleet(nodes=1)
    tree = tree_of(make_queue("t1", None, limit=4), make_queue("q1", "t1"), make_queue("q2", "t1"))
    pending = [make_workload("a", gpus(3), queue="q1"), make_workload("b", gpus(3), queue="q2")]
    decision = Decision(admissions=(admit("a", pod("p1-n0", {GPU: 3})), admit("b", pod("p1-n0", {GPU: 3}))))
    with pytest.raises(InvariantViolation):
        check_decision(make_snapshot(clusters, nodes, pending, tree=tree), decision)


def test_a_pod_the_gang_does_not_have_is_caught() -> None:
    clusters, nodes = single_pool_fleet(nodes=1)
    pending = [make_workload("a", gpus(1, 2))]
    decision = Decision(admissions=(admit("a", pod("p1-n0", {GPU: 1}), pod("p1-n0", {GPU: 1}, 2)),))
    with pytest.raises(InvariantViolation, match="places pod worker-2, which it does not have"):
        check_decision(make_snapshot(clusters, nodes, pending), decision)


def test_a_pod_set_below_its_minimum_is_caught_and_one_at_it_passes() -> None:
    clusters, nodes = single_pool_fleet(nodes=1)
    launcher = replace(gpus(0, 1, name="launcher"), min_replicas=1)
    workers = replace(gpus(1, 4, name="workers"), min_replicas=2)
    pending = [make_workload("a", launcher, workers, min_available=3)]
    snapshot = make_snapshot(clusters, nodes, pending)
    at_minimum = (
        pod("p1-n0", {}, pod_set="launcher"),
        *(pod("p1-n0", {GPU: 1}, i, pod_set="workers") for i in range(2)),
    )
    check_decision(snapshot, Decision(admissions=(admit("a", *at_minimum),)))
    below = (pod("p1-n0", {GPU: 1}, i, pod_set="workers") for i in range(3))
    with pytest.raises(InvariantViolation, match="0 pods of launcher, below its minimum 1"):
        check_decision(snapshot, Decision(admissions=(admit("a", *below),)))
