"""The placement indexes follow in-place updates of the free capacity, the way the scheduler makes
them: admissions take capacity, evictions give it back, a snapshot may even over-commit a node."""

from __future__ import annotations

from controlplane.core.placement import FreeCapacity, Miss, Placement, empty_capacity, placements_in_cluster
from controlplane.domain.model import GPU, Cluster, Node
from tests.unit.builders import cpu_only, gpus, make_cluster, make_nodes, make_pool, make_workload, mig


def fleet(nodes: int = 2, sharing: str = "exclusive") -> tuple[Cluster, dict[str, list[Node]], FreeCapacity]:
    pool = make_pool(gpus_per_node=8, sharing=sharing)
    cluster = make_cluster("c1", pool)
    layout = make_nodes(pool, nodes)
    return cluster, {pool.id: list(layout)}, empty_capacity(list(layout), {pool.id: pool})


def take(free: FreeCapacity, placement: Placement, sign: int = 1) -> None:
    for assignment in placement.assignments:
        for key, amount in assignment.demand.items():
            free[assignment.node_id][key] -= sign * amount


def test_capacity_given_back_in_place_is_offered_again() -> None:
    cluster, by_pool, free = fleet(nodes=2)
    for node_id in free:  # live runs hold every GPU before the first placement is asked for
        free[node_id][GPU] = 0
    whole_node = make_workload("w", gpus(8))
    assert isinstance(placements_in_cluster(whole_node, cluster, by_pool, free), Miss)
    free["p1-n1"][GPU] += 8  # an eviction gives a node back
    found = placements_in_cluster(whole_node, cluster, by_pool, free)
    assert not isinstance(found, Miss)
    assert [a.node_id for a in found[0].assignments] == ["p1-n1"]


def test_an_admission_applied_in_place_is_not_offered_twice() -> None:
    cluster, by_pool, free = fleet(nodes=2)
    whole_node = make_workload("w", gpus(8))
    first = placements_in_cluster(whole_node, cluster, by_pool, free)
    assert not isinstance(first, Miss)
    take(free, first[0])
    second = placements_in_cluster(make_workload("w2", gpus(8)), cluster, by_pool, free)
    assert not isinstance(second, Miss)
    assert [a.node_id for a in second[0].assignments] == ["p1-n1"]
    take(free, second[0])
    assert isinstance(placements_in_cluster(make_workload("w3", gpus(8)), cluster, by_pool, free), Miss)
    take(free, first[0], sign=-1)
    third = placements_in_cluster(make_workload("w4", gpus(8)), cluster, by_pool, free)
    assert not isinstance(third, Miss)
    assert [a.node_id for a in third[0].assignments] == ["p1-n0"]


def test_a_node_over_committed_on_gpus_is_still_the_tightest_for_a_cpu_only_pod() -> None:
    cluster, by_pool, free = fleet(nodes=2)
    free["p1-n1"][GPU] = -1  # live runs hold more than the node has (it shrank)
    found = placements_in_cluster(make_workload("w", cpu_only()), cluster, by_pool, free)
    assert not isinstance(found, Miss)
    assert [a.node_id for a in found[0].assignments] == ["p1-n1"]  # -1 free GPU slots left beats 8


def test_a_mig_node_with_an_over_committed_profile_still_offers_its_other_slices() -> None:
    cluster, by_pool, free = fleet(nodes=1, sharing="mig:all-balanced")  # per GPU: 2 x 1g, 1 x 2g, 1 x 3g
    node = free["p1-n0"]
    node["mig:1g.10gb"] = -2
    node["mig:2g.20gb"] = 0
    node["mig:3g.40gb"] = 1  # 1 - 2 + 0 = -1 free slots in total, yet one 3g slice is free
    found = placements_in_cluster(make_workload("w", mig("3g.40gb")), cluster, by_pool, free)
    assert not isinstance(found, Miss)
    assert found[0].leftover_gpu_slots == -2
