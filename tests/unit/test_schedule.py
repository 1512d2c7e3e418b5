"""The pure scheduling core: priority then FIFO, limits, reasons, capacity, determinism."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from controlplane.core.schedule import schedule
from controlplane.core.snapshot import Admission, Decision, Policy, Snapshot
from controlplane.domain.model import GPU, PodAssignment, QueueNode
from controlplane.service.wording import pending_text
from tests.unit.builders import (
    NOW,
    admitted_ids,
    cpu_only,
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
    nodes_used,
    reason_of,
    run_schedule,
    single_pool_fleet,
    tree_of,
)


def two_team_tree(
    *, cohort: float | None = None, t1: float | None = None, t2: float | None = None, q1: float | None = None
) -> dict[str, QueueNode]:
    """cohort -> {t1 -> {q1, q2}, t2 -> {q3}}."""
    return tree_of(
        make_queue("cohort", None, limit=cohort),
        make_queue("t1", "cohort", limit=t1),
        make_queue("t2", "cohort", limit=t2),
        make_queue("q1", "t1", limit=q1),
        make_queue("q2", "t1"),
        make_queue("q3", "t2"),
    )


# --- ordering ----------------------------------------------------------------------------------


def test_higher_priority_is_admitted_before_an_older_lower_priority_gang() -> None:
    clusters, nodes = single_pool_fleet(nodes=1)
    old_low = make_workload("old-low", gpus(8), priority=0, seq=1)
    new_high = make_workload("new-high", gpus(8), priority=100, seq=2)
    decision = run_schedule(make_snapshot(clusters, nodes, [old_low, new_high]))
    assert admitted_ids(decision) == ["new-high"]
    assert reason_of(decision, "old-low").startswith("no-fit:")


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_equal_priority_is_first_in_first_out_by_created_seq(order: tuple[int, int]) -> None:
    clusters, nodes = single_pool_fleet(nodes=1)
    first = make_workload("zz-first", gpus(8), seq=1)
    second = make_workload("aa-second", gpus(8), seq=2)
    pending = [(first, second)[i] for i in order]
    decision = run_schedule(make_snapshot(clusters, nodes, pending))
    assert admitted_ids(decision) == ["zz-first"]


def test_equal_priority_and_seq_falls_back_to_workload_id() -> None:
    clusters, nodes = single_pool_fleet(nodes=1)
    decision = run_schedule(
        make_snapshot(clusters, nodes, [make_workload("b", gpus(8), seq=1), make_workload("a", gpus(8), seq=1)])
    )
    assert admitted_ids(decision) == ["a"]


def test_admissions_are_listed_in_scheduling_order() -> None:
    clusters, nodes = single_pool_fleet(nodes=4)
    pending = [
        make_workload("c", gpus(1), priority=1, seq=3),
        make_workload("a", gpus(1), priority=5, seq=9),
        make_workload("b", gpus(1), priority=1, seq=2),
    ]
    assert admitted_ids(run_schedule(make_snapshot(clusters, nodes, pending))) == ["a", "b", "c"]


def test_a_gang_that_does_not_fit_does_not_block_smaller_ones_behind_it() -> None:
    clusters, nodes = single_pool_fleet(nodes=1)
    big = make_workload("big", gpus(8, 2), priority=10)
    small = make_workload("small", gpus(4), priority=0)
    decision = run_schedule(make_snapshot(clusters, nodes, [big, small]))
    assert admitted_ids(decision) == ["small"]
    assert reason_of(decision, "big").startswith("never-fits:")


# --- limits ------------------------------------------------------------------------------------


def test_queue_limit_admits_up_to_exactly_the_limit() -> None:
    clusters, nodes = single_pool_fleet(nodes=2)
    tree = default_tree(queue_limit=8)
    pending = [make_workload("a", gpus(4), seq=1), make_workload("b", gpus(4), seq=2)]
    assert admitted_ids(run_schedule(make_snapshot(clusters, nodes, pending, tree=tree))) == ["a", "b"]


def test_queue_limit_holds_back_the_gang_that_would_exceed_it_with_a_quota_reason() -> None:
    clusters, nodes = single_pool_fleet(nodes=2)
    tree = default_tree(queue_limit=4)
    pending = [make_workload("a", gpus(4), seq=1), make_workload("b", gpus(1), seq=2)]
    decision = run_schedule(make_snapshot(clusters, nodes, pending, tree=tree))
    assert admitted_ids(decision) == ["a"]
    assert (
        reason_of(decision, "b")
        == "quota: q1 limit is 4 gpu-eq and its work in use leaves less than the 1 this gang needs"
    )


def test_team_limit_is_shared_by_its_queues() -> None:
    clusters, nodes = single_pool_fleet(nodes=2)
    pending = [make_workload("a", gpus(4), queue="q1", seq=1), make_workload("b", gpus(4), queue="q2", seq=2)]
    decision = run_schedule(make_snapshot(clusters, nodes, pending, tree=two_team_tree(t1=6)))
    assert admitted_ids(decision) == ["a"]
    assert (
        reason_of(decision, "b")
        == "quota: t1 limit is 6 gpu-eq and its work in use leaves less than the 4 this gang needs"
    )


def test_team_limit_does_not_constrain_another_team() -> None:
    clusters, nodes = single_pool_fleet(nodes=2)
    pending = [make_workload("a", gpus(4), queue="q1", seq=1), make_workload("b", gpus(8), queue="q3", seq=2)]
    decision = run_schedule(make_snapshot(clusters, nodes, pending, tree=two_team_tree(t1=4)))
    assert admitted_ids(decision) == ["a", "b"]


def test_cohort_limit_is_shared_by_every_team() -> None:
    clusters, nodes = single_pool_fleet(nodes=2)
    pending = [make_workload("a", gpus(4), queue="q1", seq=1), make_workload("b", gpus(6), queue="q3", seq=2)]
    decision = run_schedule(make_snapshot(clusters, nodes, pending, tree=two_team_tree(cohort=8)))
    assert admitted_ids(decision) == ["a"]
    assert (
        reason_of(decision, "b")
        == "quota: cohort limit is 8 gpu-eq and its work in use leaves less than the 6 this gang needs"
    )


def test_the_nearest_exceeded_limit_is_reported_first() -> None:
    clusters, nodes = single_pool_fleet(nodes=2)
    pending = [make_workload("a", gpus(4), queue="q1")]
    decision = run_schedule(make_snapshot(clusters, nodes, pending, tree=two_team_tree(cohort=1, t1=2, q1=3)))
    # Every limit on the chain is below what it needs: the nearest is named, and it is a "never".
    assert reason_of(decision, "a").startswith("quota: never under the current limits: q1 limit is 3 gpu-eq")


def test_a_gang_no_limit_ever_admits_is_told_never_apart_from_a_temporary_block() -> None:
    clusters, nodes = single_pool_fleet(nodes=2)
    tree = two_team_tree(t1=6)
    held = make_workload("held", gpus(4), queue="q1", seq=1)
    pending = [
        held,
        make_workload("later", gpus(4), queue="q1", seq=2),
        make_workload("big", gpus(8), queue="q1", seq=3),
    ]
    decision = run_schedule(make_snapshot(clusters, nodes, pending, tree=tree))
    assert admitted_ids(decision) == ["held"]
    assert reason_of(decision, "later") == (
        "quota: t1 limit is 6 gpu-eq and its work in use leaves less than the 4 this gang needs"
    )
    assert reason_of(decision, "big") == (
        "quota: never under the current limits: t1 limit is 6 gpu-eq and this gang needs 8 at least; "
        "it waits until that limit is raised (or the gang is made smaller)"
    )


def test_live_runs_count_toward_limits() -> None:
    clusters, nodes = single_pool_fleet(nodes=2)
    held = make_workload("held", gpus(4), queue="q2")
    admitted = run_schedule(make_snapshot(clusters, nodes, [held], tree=two_team_tree())).admissions[0]
    snapshot = make_snapshot(
        clusters,
        nodes,
        [make_workload("new", gpus(4), queue="q1")],
        tree=two_team_tree(t1=6),
        live=[live_run_of(admitted, held)],
    )
    assert (
        reason_of(run_schedule(snapshot), "new")
        == "quota: t1 limit is 6 gpu-eq and its work in use leaves less than the 4 this gang needs"
    )


def test_quota_is_checked_before_fit() -> None:
    clusters, nodes = single_pool_fleet(nodes=1)
    decision = run_schedule(
        make_snapshot(clusters, nodes, [make_workload("a", gpus(8, 4))], tree=default_tree(team_limit=2))
    )
    assert reason_of(decision, "a").startswith("quota: never under the current limits: t1 limit is 2 gpu-eq")


def test_a_gang_held_back_by_quota_consumes_neither_capacity_nor_quota() -> None:
    clusters, nodes = single_pool_fleet(nodes=1)
    pending = [
        make_workload("over", gpus(8), queue="q1", priority=5),
        make_workload("under", gpus(8), queue="q2"),
    ]
    decision = run_schedule(make_snapshot(clusters, nodes, pending, tree=two_team_tree(q1=4, t1=8)))
    assert admitted_ids(decision) == ["under"]


def test_mig_slices_count_as_sevenths_of_a_gpu_against_limits() -> None:
    clusters, nodes = single_pool_fleet(nodes=2, sharing="mig:all-balanced")
    pending = [
        make_workload("two-3g", mig("3g.40gb", 2), seq=1),  # 6/7
        make_workload("one-1g", mig("1g.10gb"), seq=2),  # 1/7 -> exactly 1
        make_workload("another-1g", mig("1g.10gb"), seq=3),
    ]
    decision = run_schedule(make_snapshot(clusters, nodes, pending, tree=default_tree(queue_limit=1)))
    assert admitted_ids(decision) == ["two-3g", "one-1g"]
    assert reason_of(decision, "another-1g").startswith("quota: q1 limit is 1 gpu-eq and its work in use leaves")


def test_fractional_limit_counts_shares_held_on_the_pool() -> None:
    # 0.3 of a GPU on timeslice:4 rounds up to 2 shares = 0.5 gpu-eq held, above a 0.4 limit
    clusters, nodes = single_pool_fleet(nodes=1, sharing="timeslice:4")
    decision = run_schedule(
        make_snapshot(clusters, nodes, [make_workload("a", frac(0.3))], tree=default_tree(queue_limit=0.4))
    )
    assert admitted_ids(decision) == []
    assert (
        reason_of(decision, "a")
        == "quota: q1 limit is 0.4 gpu-eq and its work in use leaves less than the 0.5 this gang needs"
    )


def test_fractional_request_within_a_fractional_limit_is_admitted() -> None:
    clusters, nodes = single_pool_fleet(nodes=1, sharing="mps:10")
    pending = [make_workload("a", frac(0.3), seq=1), make_workload("b", frac(0.3), seq=2)]
    decision = run_schedule(make_snapshot(clusters, nodes, pending, tree=default_tree(queue_limit=0.6)))
    assert admitted_ids(decision) == ["a", "b"]


def test_per_model_limit_steers_a_gang_to_another_cluster() -> None:
    h100 = make_pool("h100", "c1", gpu_model="H100-80GB", gpus_per_node=4)
    a100 = make_pool("a100", "c2", gpu_model="A100-80GB", gpus_per_node=8)
    clusters = (make_cluster("c1", h100), make_cluster("c2", a100))
    nodes = make_nodes(h100, 1) + make_nodes(a100, 1)
    tree = tree_of(make_queue("q1", None, limits={"H100-80GB": 0}))
    decision = run_schedule(make_snapshot(clusters, nodes, [make_workload("w", gpus(4))], tree=tree))
    assert [(a.workload_id, a.cluster_id) for a in decision.admissions] == [("w", "c2")]


def test_per_model_limit_with_no_other_model_leaves_the_gang_pending() -> None:
    clusters, nodes = single_pool_fleet(nodes=1)
    tree = tree_of(make_queue("q1", None, limits={"H100-80GB": 2}))
    decision = run_schedule(make_snapshot(clusters, nodes, [make_workload("w", gpus(4))], tree=tree))
    assert (
        reason_of(decision, "w")
        == "quota: q1 limit is 2 H100-80GB and its work in use leaves less than the 4 this gang needs"
    )


def test_per_model_limit_steers_a_gang_to_another_pool_of_the_same_cluster() -> None:
    h100 = make_pool("h100", "c1", gpu_model="H100-80GB", gpus_per_node=4)
    a100 = make_pool("a100", "c1", gpu_model="A100-80GB", gpus_per_node=8)
    clusters = (make_cluster("c1", h100, a100),)
    nodes = make_nodes(h100, 1) + make_nodes(a100, 1)
    tree = tree_of(make_queue("q1", None, limits={"H100-80GB": 0}))
    decision = run_schedule(make_snapshot(clusters, nodes, [make_workload("w", gpus(4))], tree=tree))
    assert [nodes_used(a) for a in decision.admissions] == [{"a100-n0"}]


def test_workload_in_a_queue_missing_from_the_tree_has_no_limits() -> None:
    clusters, nodes = single_pool_fleet(nodes=1)
    decision = run_schedule(make_snapshot(clusters, nodes, [make_workload("w", gpus(8), queue="ghost")]))
    assert admitted_ids(decision) == ["w"]


# --- reasons and queue positions ---------------------------------------------------------------


def test_never_fits_reason_names_the_gang_size_and_the_closest_cluster() -> None:
    p1 = make_pool("p1", "c1", gpus_per_node=8)
    p2 = make_pool("p2", "c2", gpus_per_node=8)
    clusters = (make_cluster("c1", p1, name="east"), make_cluster("c2", p2, name="west"))
    nodes = make_nodes(p1, 1) + make_nodes(p2, 2)
    decision = run_schedule(make_snapshot(clusters, nodes, [make_workload("w", gpus(8, 3))]))
    assert reason_of(decision, "w") == (
        "never-fits: can never fit in this fleet as it stands (needs 3 pods placed at once in one cluster; "
        "the best, west, holds 2 even with nothing running); it waits for nodes to be added or uncordoned"
    )


def test_no_fit_reason_names_the_gang_size_and_the_cluster_with_most_room_now() -> None:
    p1 = make_pool("p1", "c1", gpus_per_node=8)
    p2 = make_pool("p2", "c2", gpus_per_node=8)
    clusters = (make_cluster("c1", p1, name="east"), make_cluster("c2", p2, name="west"))
    nodes = make_nodes(p1, 3) + make_nodes(p2, 3)
    # Every east node and one west node are busy: the gang fits the fleet, just not now.
    busy = [n for n in nodes if n.pool_id == "p1"] + [n for n in nodes if n.pool_id == "p2"][:1]
    fillers = [make_workload(f"f{i}", gpus(8), seq=i) for i in range(len(busy))]
    placed = run_schedule(make_snapshot(clusters, busy, fillers)).admissions
    live = [live_run_of(a, w) for a, w in zip(placed, fillers, strict=True)]
    decision = run_schedule(make_snapshot(clusters, nodes, [make_workload("w", gpus(8, 3))], live=live))
    assert (
        reason_of(decision, "w")
        == "no-fit: needs 3 pods placed at once in one cluster; best cluster west has room for 2; "
        "reservation: 3 node(s) of cluster west held for w, due when running work ends"
    )


def test_a_reservation_holds_the_cluster_that_frees_up_soonest() -> None:
    """A declared end beats runs with none; among runs with none, the fewest to wait for. Each
    cluster of three has two 8-GPU nodes; the gang needs both nodes of one."""
    pools = [make_pool(f"p{i}", f"c{i}", gpus_per_node=8) for i in (1, 2, 3)]
    names = ("east", "west", "north")
    clusters = tuple(make_cluster(p.cluster_id, p, name=name) for p, name in zip(pools, names, strict=True))
    nodes = tuple(n for p in pools for n in make_nodes(p, 2))
    # east: both nodes busy; west: one; north: both, with runs that declare when they end.
    busy = [n for n in nodes if n.pool_id != "p2" or n.id.endswith("n0")]
    fillers = [make_workload(f"f{i}", gpus(8), seq=i) for i in range(len(busy))]
    placed = run_schedule(make_snapshot(clusters, busy, fillers)).admissions
    endless = [live_run_of(a, w) for a, w in zip(placed, fillers, strict=True)]
    declared = [
        replace(run, admitted_at=NOW, max_runtime_seconds=3600) if run.cluster_id == "c3" else run for run in endless
    ]
    gang = make_workload("w", gpus(8, 2), seq=100)
    soonest = run_schedule(make_snapshot(clusters, nodes, [gang], live=declared))
    assert "2 node(s) of cluster north held for w, due by" in reason_of(soonest, "w")
    fewest = run_schedule(make_snapshot(clusters, nodes, [gang], live=endless))
    assert "2 node(s) of cluster west held for w, due when running work ends" in reason_of(fewest, "w")


def test_no_fit_reason_on_an_empty_fleet() -> None:
    decision = run_schedule(make_snapshot((), (), [make_workload("w")]))
    assert reason_of(decision, "w") == "never-fits: can never fit in this fleet as it stands (the fleet has no cluster)"


def test_every_pending_workload_gets_a_reason() -> None:
    clusters, nodes = single_pool_fleet(nodes=1)
    tree = two_team_tree()
    pending = [
        make_workload("q1-fits", gpus(8), queue="q1", priority=9, seq=1),
        make_workload("q1-a", gpus(8), queue="q1", priority=1, seq=2),
        make_workload("q2-a", gpus(8), queue="q2", priority=1, seq=3),
        make_workload("q1-b", gpus(8), queue="q1", priority=0, seq=4),
        make_workload("q3-a", gpus(8), queue="q3", priority=0, seq=5),
        make_workload("q1-c", gpus(8), queue="q1", priority=5, seq=6),
    ]
    decision = run_schedule(make_snapshot(clusters, nodes, pending, tree=tree))
    assert admitted_ids(decision) == ["q1-fits"]
    assert {p.workload_id for p in decision.pending} == {"q1-c", "q1-a", "q1-b", "q2-a", "q3-a"}
    assert all(pending_text(p) for p in decision.pending)
    assert decision.stats == {"pending": 6, "admitted": 1, "evicted": 0}


def test_admitted_and_pending_partition_the_pending_workloads() -> None:
    clusters, nodes = single_pool_fleet(nodes=2)
    pending = [make_workload(f"w{i}", gpus(3), seq=i) for i in range(7)]
    decision = run_schedule(make_snapshot(clusters, nodes, pending))
    admitted = set(admitted_ids(decision))
    waiting = {p.workload_id for p in decision.pending}
    assert admitted | waiting == {w.id for w in pending}
    assert not admitted & waiting
    assert len(admitted) == 4  # two 3-GPU pods per 8-GPU node


# --- capacity ----------------------------------------------------------------------------------


def test_two_gangs_cannot_both_take_the_same_gpus() -> None:
    clusters, nodes = single_pool_fleet(nodes=2)
    pending = [make_workload("a", gpus(8, 2), seq=1), make_workload("b", gpus(8, 2), seq=2)]
    decision = run_schedule(make_snapshot(clusters, nodes, pending))
    assert admitted_ids(decision) == ["a"]
    assert reason_of(decision, "b").endswith("has room for 0")


def test_admissions_pack_so_later_gangs_find_whole_nodes() -> None:
    clusters, nodes = single_pool_fleet(nodes=2)
    pending = [make_workload(f"small{i}", gpus(2), seq=i) for i in range(4)] + [make_workload("big", gpus(8), seq=9)]
    decision = run_schedule(make_snapshot(clusters, nodes, pending))
    assert admitted_ids(decision) == ["small0", "small1", "small2", "small3", "big"]
    small_nodes = set().union(*(nodes_used(a) for a in decision.admissions[:4]))
    assert len(small_nodes) == 1
    assert nodes_used(decision.admissions[4]).isdisjoint(small_nodes)


# Backfill around a gang that waits is what these pin, so the head-of-line gang reserves nothing.
NO_RESERVATIONS = Policy(max_reservations=0)


def test_live_runs_consume_node_capacity() -> None:
    clusters, nodes = single_pool_fleet(nodes=1)
    live_workload = make_workload("live", gpus(6))
    admission = Admission("live", "c1", (PodAssignment("worker", 0, "p1-n0", {GPU: 6, "cpu": 1000, "mem": 4096}),))
    snapshot = make_snapshot(
        clusters,
        nodes,
        [make_workload("big", gpus(4)), make_workload("small", gpus(2))],
        live=[live_run_of(admission, live_workload)],
    )
    decision = run_schedule(snapshot, NO_RESERVATIONS)
    assert admitted_ids(decision) == ["small"]
    assert reason_of(decision, "big").endswith("has room for 0")


def test_live_mig_slices_and_shares_are_not_offered_again() -> None:
    mig_pool = make_pool("mig", sharing="mig:all-balanced", gpus_per_node=1)
    ts_pool = make_pool("ts", sharing="timeslice:4", gpus_per_node=1)
    clusters = (make_cluster("c1", mig_pool, ts_pool),)
    nodes = make_nodes(mig_pool, 1) + make_nodes(ts_pool, 1)
    first = [make_workload("m", mig("3g.40gb"), seq=1), make_workload("s", frac(0.75), seq=2)]
    round1 = run_schedule(make_snapshot(clusters, nodes, first))
    assert admitted_ids(round1) == ["m", "s"]
    live = [live_run_of(a, w) for a, w in zip(round1.admissions, first, strict=True)]
    second = [
        make_workload("m2", mig("3g.40gb"), seq=3),
        make_workload("s2", frac(0.5), seq=4),
        make_workload("s3", frac(0.25), seq=5),
        make_workload("m3", mig("2g.20gb"), seq=6),
    ]
    decision = run_schedule(make_snapshot(clusters, nodes, second, live=live), NO_RESERVATIONS)
    assert admitted_ids(decision) == ["s3", "m3"]


def test_live_run_on_a_cordoned_node_neither_frees_nor_breaks_anything() -> None:
    pool = make_pool(gpus_per_node=8)
    clusters = (make_cluster("c1", pool),)
    nodes = make_nodes(pool, 2, unschedulable=[0])
    live_workload = make_workload("live", gpus(8))
    admission = Admission("live", "c1", (PodAssignment("worker", 0, "p1-n0", {GPU: 8, "cpu": 1000, "mem": 4096}),))
    decision = run_schedule(
        make_snapshot(
            clusters,
            nodes,
            [make_workload("w", gpus(8, 2)), make_workload("v", gpus(8))],
            live=[live_run_of(admission, live_workload)],
        )
    )
    assert admitted_ids(decision) == ["v"]
    assert [nodes_used(a) for a in decision.admissions] == [{"p1-n1"}]


def test_the_tightest_cluster_wins_and_ties_go_to_the_lower_cluster_id() -> None:
    roomy = make_pool("roomy", "c1", gpus_per_node=8)
    snug = make_pool("snug", "c2", gpus_per_node=4)
    same = make_pool("same", "c0", gpus_per_node=8)
    clusters = (make_cluster("c1", roomy), make_cluster("c2", snug))
    nodes = make_nodes(roomy, 1) + make_nodes(snug, 1)
    decision = run_schedule(make_snapshot(clusters, nodes, [make_workload("w", gpus(4))]))
    assert [a.cluster_id for a in decision.admissions] == ["c2"]
    clusters = (make_cluster("c1", roomy), make_cluster("c0", same))
    nodes = make_nodes(roomy, 1) + make_nodes(same, 1)
    decision = run_schedule(make_snapshot(clusters, nodes, [make_workload("w", gpus(4))]))
    assert [a.cluster_id for a in decision.admissions] == ["c0"]


def test_isolated_inference_is_never_placed_on_time_sliced_gpus() -> None:
    ts = make_pool("ts", sharing="timeslice:4")
    mps = make_pool("mps", sharing="mps:4")
    clusters = (make_cluster("c1", ts, mps),)
    nodes = make_nodes(ts, 1) + make_nodes(mps, 1)
    pending = [make_workload(f"i{k}", frac(0.5), isolation=True, seq=k) for k in range(20)]
    decision = run_schedule(make_snapshot(clusters, nodes, pending))
    assert len(decision.admissions) == 16  # 8 GPUs x 4 shares / 2 shares each, mps pool only
    assert all(nodes_used(a) == {"mps-n0"} for a in decision.admissions)


def test_cpu_only_gangs_are_admitted_without_gpu_quota() -> None:
    clusters, nodes = single_pool_fleet(nodes=1)
    decision = run_schedule(
        make_snapshot(clusters, nodes, [make_workload("cpu", cpu_only(4))], tree=default_tree(queue_limit=0))
    )
    assert admitted_ids(decision) == ["cpu"]


# --- determinism -------------------------------------------------------------------------------


def _busy_snapshot() -> Snapshot:
    p1 = make_pool("p1", "c1", gpus_per_node=8)
    p2 = make_pool("p2", "c1", sharing="mig:all-balanced", gpus_per_node=4)
    p3 = make_pool("p3", "c2", sharing="timeslice:4", gpus_per_node=2)
    clusters = (make_cluster("c1", p1, p2), make_cluster("c2", p3))
    nodes = make_nodes(p1, 2) + make_nodes(p2, 1) + make_nodes(p3, 2)
    pending = [
        make_workload("a", gpus(4, 2), queue="q1", priority=1, seq=1),
        make_workload("b", mig("1g.10gb", 5), queue="q2", seq=2),
        make_workload("c", frac(0.5, 3), queue="q3", seq=3),
        make_workload("d", gpus(8), queue="q1", seq=4),
        make_workload("e", gpus(2, 3), queue="q2", priority=1, seq=5),
        make_workload("f", frac(0.25, 2), queue="q3", seq=6, isolation=True),
    ]
    return make_snapshot(clusters, nodes, pending, tree=two_team_tree(t1=14))


def test_the_same_snapshot_gives_the_same_decision() -> None:
    snapshot = _busy_snapshot()
    first = run_schedule(snapshot)
    assert first.admissions  # a non-trivial decision
    assert run_schedule(snapshot) == first
    assert schedule(snapshot, Policy(), NOW.replace(year=2030)) == first


def test_the_order_of_pending_workloads_in_the_snapshot_does_not_matter() -> None:
    snapshot = _busy_snapshot()
    expected = run_schedule(snapshot)
    rng = random.Random(7)
    for _ in range(10):
        shuffled = list(snapshot.pending)
        rng.shuffle(shuffled)
        permuted = make_snapshot(snapshot.clusters, snapshot.nodes, shuffled, tree=snapshot.queue_tree)
        assert run_schedule(permuted) == expected


def test_schedule_returns_a_decision_value() -> None:
    decision = run_schedule(_busy_snapshot())
    assert isinstance(decision, Decision)
    assert decision.stats["pending"] == 6
    assert decision.stats["admitted"] == len(decision.admissions)
