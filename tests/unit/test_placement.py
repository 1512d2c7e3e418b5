"""Gang placement: all-or-nothing, best fit, one pool preferred, one cluster only."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from controlplane.core.capacity import why_never_fits
from controlplane.core.placement import (
    FreeCapacity,
    Miss,
    Placement,
    candidate_pools,
    empty_capacity,
    place_gang,
    place_in_cluster,
)
from controlplane.domain.model import GPU, SHARE, Cluster, Node, PodSet, Taint, Toleration
from tests.unit.builders import cpu_only, frac, gpus, make_cluster, make_nodes, make_pool, make_workload, mig


def layout(clusters: Iterable[Cluster], nodes: Iterable[Node]) -> tuple[dict[str, list[Node]], FreeCapacity]:
    """The nodes-by-pool map and free capacity of an empty fleet, as the scheduler builds them."""
    nodes = list(nodes)
    pools_by_id = {p.id: p for c in clusters for p in c.pools}
    by_pool: dict[str, list[Node]] = {}
    for node in nodes:
        if node.schedulable:
            by_pool.setdefault(node.pool_id, []).append(node)
    return by_pool, empty_capacity(nodes, pools_by_id)


def pool_of(nodes: Iterable[Node]) -> dict[str, str]:
    return {n.id: n.pool_id for n in nodes}


# --- all-or-nothing ----------------------------------------------------------------------------


def test_gang_that_cannot_place_min_available_pods_is_a_miss_with_the_count_it_could_place() -> None:
    pool = make_pool(gpus_per_node=8)
    cluster = make_cluster("c1", pool)
    nodes = make_nodes(pool, 2)
    by_pool, free = layout([cluster], nodes)
    result = place_gang(make_workload("w", gpus(8, replicas=3)), cluster, [pool], by_pool, free)
    assert isinstance(result, Miss)
    assert result.placed == 2
    assert result.cluster_id == "c1"


def test_gang_is_placed_once_min_available_pods_fit_even_if_not_all_do() -> None:
    pool = make_pool(gpus_per_node=8)
    cluster = make_cluster("c1", pool)
    nodes = make_nodes(pool, 2)
    by_pool, free = layout([cluster], nodes)
    result = place_gang(make_workload("w", gpus(8, replicas=3), min_available=2), cluster, [pool], by_pool, free)
    assert isinstance(result, Placement)
    assert len(result.assignments) == 2
    assert {a.node_id for a in result.assignments} == {"p1-n0", "p1-n1"}


def test_place_gang_does_not_modify_the_free_capacity_it_is_given() -> None:
    pool = make_pool(gpus_per_node=8)
    cluster = make_cluster("c1", pool)
    by_pool, free = layout([cluster], make_nodes(pool, 2))
    before = {k: dict(v) for k, v in free.items()}
    assert isinstance(place_gang(make_workload("w", gpus(4, replicas=3)), cluster, [pool], by_pool, free), Placement)
    assert free == before


def test_assignments_name_pod_set_index_node_and_demand() -> None:
    pool = make_pool(gpus_per_node=8)
    cluster = make_cluster("c1", pool)
    by_pool, free = layout([cluster], make_nodes(pool, 1))
    result = place_gang(make_workload("w", gpus(2, replicas=3)), cluster, [pool], by_pool, free)
    assert isinstance(result, Placement)
    assert [(a.pod_set, a.index, a.node_id) for a in result.assignments] == [
        ("worker", 0, "p1-n0"),
        ("worker", 1, "p1-n0"),
        ("worker", 2, "p1-n0"),
    ]
    assert all(a.demand == {GPU: 2, "cpu": 1000, "mem": 4096} for a in result.assignments)
    assert result.leftover_gpu_slots == 2


def test_partially_used_nodes_only_offer_their_free_capacity() -> None:
    pool = make_pool(gpus_per_node=8)
    cluster = make_cluster("c1", pool)
    by_pool, free = layout([cluster], make_nodes(pool, 1))
    free["p1-n0"][GPU] = 3
    assert isinstance(place_gang(make_workload("w", gpus(4)), cluster, [pool], by_pool, free), Miss)
    assert isinstance(place_gang(make_workload("w", gpus(3)), cluster, [pool], by_pool, free), Placement)


def test_cpu_and_memory_limit_pods_per_node_too() -> None:
    pool = make_pool(gpus_per_node=8, cpu_millis=2500)
    cluster = make_cluster("c1", pool)
    by_pool, free = layout([cluster], make_nodes(pool, 1))
    result = place_gang(make_workload("w", gpus(1, replicas=3)), cluster, [pool], by_pool, free)
    assert isinstance(result, Miss)
    assert result.placed == 2


def test_mig_slices_are_consumed_per_pod() -> None:
    pool = make_pool(sharing="mig:all-balanced", gpus_per_node=1)  # 2 x 1g.10gb per node
    cluster = make_cluster("c1", pool)
    by_pool, free = layout([cluster], make_nodes(pool, 1))
    assert isinstance(place_gang(make_workload("w", mig("1g.10gb", 2)), cluster, [pool], by_pool, free), Placement)
    miss = place_gang(make_workload("w", mig("1g.10gb", 3)), cluster, [pool], by_pool, free)
    assert isinstance(miss, Miss)
    assert miss.placed == 2


def test_shares_are_consumed_per_pod() -> None:
    pool = make_pool(sharing="timeslice:4", gpus_per_node=1)
    cluster = make_cluster("c1", pool)
    by_pool, free = layout([cluster], make_nodes(pool, 1))
    result = place_gang(make_workload("w", frac(0.5, 3)), cluster, [pool], by_pool, free)
    assert isinstance(result, Miss)
    assert result.placed == 2
    fit = place_gang(make_workload("w", frac(0.25, 4)), cluster, [pool], by_pool, free)
    assert isinstance(fit, Placement)
    assert sum(a.demand[SHARE] for a in fit.assignments) == 4


def test_unschedulable_nodes_take_no_pods() -> None:
    pool = make_pool(gpus_per_node=8)
    cluster = make_cluster("c1", pool)
    nodes = make_nodes(pool, 2, unschedulable=[0])
    by_pool, free = layout([cluster], nodes)
    assert "p1-n0" not in free
    result = place_in_cluster(make_workload("w", gpus(8, 2)), cluster, by_pool, free)
    assert isinstance(result, Miss)
    assert result.placed == 1


# --- best fit ----------------------------------------------------------------------------------


def test_best_fit_picks_the_node_left_with_the_fewest_free_gpus() -> None:
    pool = make_pool(gpus_per_node=8)
    cluster = make_cluster("c1", pool)
    by_pool, free = layout([cluster], make_nodes(pool, 3))
    free["p1-n0"][GPU] = 8
    free["p1-n1"][GPU] = 2
    free["p1-n2"][GPU] = 4
    result = place_gang(make_workload("w", gpus(2)), cluster, [pool], by_pool, free)
    assert isinstance(result, Placement)
    assert [a.node_id for a in result.assignments] == ["p1-n1"]
    assert result.leftover_gpu_slots == 0


def test_best_fit_packs_a_gang_onto_as_few_nodes_as_possible() -> None:
    pool = make_pool(gpus_per_node=8)
    cluster = make_cluster("c1", pool)
    by_pool, free = layout([cluster], make_nodes(pool, 3))
    result = place_gang(make_workload("w", gpus(2, replicas=4)), cluster, [pool], by_pool, free)
    assert isinstance(result, Placement)
    assert len({a.node_id for a in result.assignments}) == 1


def test_best_fit_prefers_the_tighter_pool_in_a_cluster() -> None:
    big = make_pool("big", gpus_per_node=8)
    small = make_pool("small", gpus_per_node=4)
    cluster = make_cluster("c1", big, small)
    nodes = make_nodes(big, 1) + make_nodes(small, 1)
    by_pool, free = layout([cluster], nodes)
    result = place_in_cluster(make_workload("w", gpus(4)), cluster, by_pool, free)
    assert isinstance(result, Placement)
    assert [a.node_id for a in result.assignments] == ["small-n0"]


# --- one pool preferred ------------------------------------------------------------------------


def _two_pool_cluster() -> tuple[Cluster, tuple[Node, ...], dict[str, list[Node]], FreeCapacity]:
    a = make_pool("a", gpus_per_node=8)
    b = make_pool("b", gpus_per_node=8)
    cluster = make_cluster("c1", a, b)
    nodes = make_nodes(a, 1) + make_nodes(b, 1)
    by_pool, free = layout([cluster], nodes)
    free["a-n0"][GPU] = 4  # pool a has only half a node free
    return cluster, nodes, by_pool, free


def test_gang_stays_in_one_pool_when_one_pool_can_hold_it() -> None:
    cluster, nodes, by_pool, free = _two_pool_cluster()
    result = place_in_cluster(make_workload("w", gpus(4, 2)), cluster, by_pool, free, prefer_same_pool=True)
    assert isinstance(result, Placement)
    assert {pool_of(nodes)[a.node_id] for a in result.assignments} == {"b"}


def test_without_pool_preference_best_fit_may_spread_a_gang_over_pools() -> None:
    cluster, nodes, by_pool, free = _two_pool_cluster()
    result = place_in_cluster(make_workload("w", gpus(4, 2)), cluster, by_pool, free, prefer_same_pool=False)
    assert isinstance(result, Placement)
    assert {pool_of(nodes)[a.node_id] for a in result.assignments} == {"a", "b"}


def test_gang_spans_pools_of_one_cluster_when_no_single_pool_can_hold_it() -> None:
    a = make_pool("a", gpus_per_node=8)
    b = make_pool("b", gpus_per_node=8)
    cluster = make_cluster("c1", a, b)
    nodes = make_nodes(a, 1) + make_nodes(b, 1)
    by_pool, free = layout([cluster], nodes)
    result = place_in_cluster(make_workload("w", gpus(8, 2)), cluster, by_pool, free)
    assert isinstance(result, Placement)
    assert {pool_of(nodes)[a.node_id] for a in result.assignments} == {"a", "b"}


def test_launcher_and_workers_with_different_requests_land_on_the_pools_serving_each() -> None:
    mig_pool = make_pool("mig", sharing="mig:all-balanced", gpus_per_node=1)
    ex_pool = make_pool("ex", gpus_per_node=8)
    cluster = make_cluster("c1", mig_pool, ex_pool)
    nodes = make_nodes(mig_pool, 1) + make_nodes(ex_pool, 2)
    by_pool, free = layout([cluster], nodes)
    workload = make_workload("w", mig("1g.10gb", name="launcher"), gpus(8, replicas=2, name="workers"))
    result = place_in_cluster(workload, cluster, by_pool, free)
    assert isinstance(result, Placement)
    where = {(a.pod_set, a.index): pool_of(nodes)[a.node_id] for a in result.assignments}
    assert where == {("launcher", 0): "mig", ("workers", 0): "ex", ("workers", 1): "ex"}
    launcher = next(a for a in result.assignments if a.pod_set == "launcher")
    assert launcher.demand["mig:1g.10gb"] == 1
    assert len({a.node_id for a in result.assignments if a.pod_set == "workers"}) == 2


def test_cpu_only_launcher_with_gpu_workers_fits_in_one_pool() -> None:
    pool = make_pool(gpus_per_node=8)
    cluster = make_cluster("c1", pool)
    by_pool, free = layout([cluster], make_nodes(pool, 2))
    workload = make_workload("w", cpu_only(1), gpus(8, replicas=2, name="workers"))
    result = place_in_cluster(workload, cluster, by_pool, free)
    assert isinstance(result, Placement)
    assert [a.pod_set for a in result.assignments] == ["launcher", "workers", "workers"]
    assert GPU not in result.assignments[0].demand


# --- candidate pools: isolation and taints -----------------------------------------------------


def test_isolation_excludes_timeslice_pools_but_not_mps() -> None:
    ts = make_pool("ts", sharing="timeslice:4")
    mps = make_pool("mps", sharing="mps:4")
    ex = make_pool("ex")
    cluster = make_cluster("c1", ts, mps, ex)
    isolated = make_workload("w", frac(0.5), isolation=True)
    assert [p.id for p in candidate_pools(isolated, cluster)] == ["mps", "ex"]
    assert [p.id for p in candidate_pools(make_workload("w", frac(0.5)), cluster)] == ["ts", "mps", "ex"]


def test_isolated_fractional_gang_cannot_use_a_timeslice_only_cluster() -> None:
    ts = make_pool("ts", sharing="timeslice:4")
    cluster = make_cluster("c1", ts)
    by_pool, free = layout([cluster], make_nodes(ts, 1))
    assert isinstance(place_in_cluster(make_workload("w", frac(0.5)), cluster, by_pool, free), Placement)
    miss = place_in_cluster(make_workload("w", frac(0.5), isolation=True), cluster, by_pool, free)
    assert isinstance(miss, Miss)
    assert miss.placed == 0


def test_untolerated_taint_excludes_a_pool_and_a_toleration_readmits_it() -> None:
    tainted = make_pool("tainted", taints=[Taint("reserved", "research")])
    cluster = make_cluster("c1", tainted)
    by_pool, free = layout([cluster], make_nodes(tainted, 1))
    assert candidate_pools(make_workload("w"), cluster) == []
    assert isinstance(place_in_cluster(make_workload("w"), cluster, by_pool, free), Miss)
    tolerant = make_workload("w", tolerations=[Toleration("reserved", "Equal", "research")])
    assert isinstance(place_in_cluster(tolerant, cluster, by_pool, free), Placement)


def test_gpu_taints_do_not_exclude_a_pool() -> None:
    pool = make_pool(taints=[Taint("nvidia.com/gpu", "present"), Taint("sku", "h100")])
    cluster = make_cluster("c1", pool)
    assert candidate_pools(make_workload("w"), cluster) == [pool]


def test_gang_avoids_the_tainted_pool_and_uses_the_clean_one() -> None:
    tainted = make_pool("tainted", gpus_per_node=4, taints=[Taint("spot", "true")])
    clean = make_pool("clean", gpus_per_node=8)
    cluster = make_cluster("c1", tainted, clean)
    nodes = make_nodes(tainted, 1) + make_nodes(clean, 1)
    by_pool, free = layout([cluster], nodes)
    result = place_in_cluster(make_workload("w", gpus(4)), cluster, by_pool, free)
    assert isinstance(result, Placement)
    assert [a.node_id for a in result.assignments] == ["clean-n0"]


def test_model_allow_list_restricts_the_gang_to_matching_pools() -> None:
    h100 = make_pool("h100", gpu_model="H100-80GB", gpus_per_node=4)
    a100 = make_pool("a100", gpu_model="A100-80GB", gpus_per_node=8)
    cluster = make_cluster("c1", h100, a100)
    by_pool, free = layout([cluster], make_nodes(h100, 1) + make_nodes(a100, 1))
    result = place_in_cluster(make_workload("w", gpus(4, models=["A100-80GB"])), cluster, by_pool, free)
    assert isinstance(result, Placement)
    assert [a.node_id for a in result.assignments] == ["a100-n0"]


# --- why_never_fits ----------------------------------------------------------------------------


def test_why_never_fits_is_none_when_an_empty_cluster_could_hold_the_gang() -> None:
    pool = make_pool(gpus_per_node=8)
    assert why_never_fits(make_workload("w", gpus(8, 2)), (make_cluster("c1", pool),), make_nodes(pool, 2)) is None


def test_a_gang_never_spans_clusters_even_if_the_fleet_has_room_in_total() -> None:
    p1 = make_pool("p1", "c1", gpus_per_node=8)
    p2 = make_pool("p2", "c2", gpus_per_node=8)
    clusters = (make_cluster("c1", p1, name="east"), make_cluster("c2", p2, name="west"))
    reason = why_never_fits(make_workload("w", gpus(8, 2)), clusters, make_nodes(p1, 1) + make_nodes(p2, 1))
    assert reason is not None
    assert "needs 2 pods placed at once" in reason
    assert "holds at most 1 even when empty" in reason


def test_why_never_fits_names_the_cluster_that_came_closest() -> None:
    p1 = make_pool("p1", "c1", gpus_per_node=8)
    p2 = make_pool("p2", "c2", gpus_per_node=8)
    clusters = (make_cluster("c1", p1, name="small"), make_cluster("c2", p2, name="bigger"))
    reason = why_never_fits(make_workload("w", gpus(8, 4)), clusters, make_nodes(p1, 1) + make_nodes(p2, 3))
    assert reason is not None
    assert "best cluster (bigger) holds at most 3" in reason


@pytest.mark.parametrize(
    ("pod_set", "says"),
    [
        (gpus(16), "pod set `worker` asks 16 GPUs per pod and no node has more than 8"),
        (gpus(2, models=("B200",)), "asks for GPU model B200 and no pool offers it (the pools offer H100-80GB)"),
        (gpus(16, models=("H100-80GB",)), "asks 16 GPUs per pod and no node of model H100-80GB has more than 8"),
        (gpus(1, cpu_millis=10**6), "asks 1000000m CPU per pod and no node has more than"),
        (gpus(1, memory_mib=10**8), "asks 100000000 MiB of memory per pod and no node has more than"),
    ],
)
def test_why_never_fits_names_what_no_node_has(pod_set: PodSet, says: str) -> None:
    pool = make_pool("p1", "c1", gpus_per_node=8, gpu_model="H100-80GB")
    reason = why_never_fits(make_workload("w", pod_set), (make_cluster("c1", pool),), make_nodes(pool, 2))
    assert reason is not None
    assert reason.startswith("no cluster in the fleet could ever hold this gang: ")
    assert says in reason


def test_why_never_fits_on_an_empty_fleet() -> None:
    assert why_never_fits(make_workload("w"), (), ()) == "the fleet has no clusters"


def test_why_never_fits_reports_requests_no_pool_can_serve() -> None:
    pool = make_pool(gpus_per_node=8)
    reason = why_never_fits(make_workload("w", mig("1g.10gb")), (make_cluster("c1", pool),), make_nodes(pool, 4))
    assert reason is not None
    assert "holds at most 0" in reason


def test_why_never_fits_respects_isolation() -> None:
    ts = make_pool("ts", sharing="timeslice:4")
    clusters = (make_cluster("c1", ts),)
    assert why_never_fits(make_workload("w", frac(0.5)), clusters, make_nodes(ts, 1)) is None
    assert why_never_fits(make_workload("w", frac(0.5), isolation=True), clusters, make_nodes(ts, 1)) is not None


def test_a_cordoned_node_still_counts_for_what_the_fleet_could_ever_hold() -> None:
    pool = make_pool(gpus_per_node=8)
    cluster = make_cluster("c1", pool)
    nodes = make_nodes(pool, 2, unschedulable=[1])
    assert why_never_fits(make_workload("w", gpus(8, 2)), (cluster,), nodes) is None
    assert why_never_fits(make_workload("w", gpus(8, 3)), (cluster,), nodes) is not None


def test_a_cpu_only_launcher_does_not_take_the_cpu_its_gpu_workers_need() -> None:
    """Found by the property test: best fit pod by pod put the launcher (no GPU) on the GPU node,
    whose CPU the three workers then lacked, though a node of another pool had room for it."""
    gpu_pool = make_pool("gpu", gpus_per_node=4, cpu_millis=3000)
    other = make_pool("shared", gpus_per_node=1, sharing="timeslice:4", cpu_millis=4000)
    cluster = make_cluster("c1", gpu_pool, other)
    nodes = (*make_nodes(gpu_pool, 1), *make_nodes(other, 1))
    by_pool, free = layout([cluster], nodes)
    gang = make_workload("w", cpu_only(cpu_millis=500), gpus(1, replicas=3, cpu_millis=1000))
    result = place_in_cluster(gang, cluster, by_pool, free)
    assert not isinstance(result, Miss), result
    [placement] = result if isinstance(result, list) else [result]
    placed = {(a.pod_set, a.index): a.node_id for a in placement.assignments}
    assert placed == {("launcher", 0): "shared-n0", **{("worker", i): "gpu-n0" for i in range(3)}}
    assert [a.pod_set for a in placement.assignments] == ["launcher", "worker", "worker", "worker"]
    assert why_never_fits(gang, [cluster], nodes) is None
