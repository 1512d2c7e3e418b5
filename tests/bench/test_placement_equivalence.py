"""The indexed placement gives exactly the results of the plain per-pod scan it replaced.

The reference below is the scan as it was before the indexes (best fit, every node for every
pod), copied verbatim, plus the one rule the search gained since (`ref_gpu_pods_first`). Random
small fleets with random used capacity are placed by both, then placements are applied to (and
some released from) the capacity in place, the way the scheduler does between calls, so the change
tracking and the remembered results are exercised too.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.core.capacity import why_never_fits
from controlplane.core.placement import (
    FreeCapacity,
    Miss,
    Placement,
    candidate_pools,
    copy_capacity,
    empty_capacity,
    place_gang,
    placements_in_cluster,
    placements_in_fleet,
)
from controlplane.domain.model import (
    GPU,
    SHARE,
    Cluster,
    Node,
    NodePool,
    PodAssignment,
    PodSet,
    Taint,
    Toleration,
    Workload,
)
from tests.unit.builders import cpu_only, frac, gpus, make_cluster, make_nodes, make_pool, make_workload, mig

EXAMPLES = settings(
    max_examples=int(os.environ.get("GPUFLEET_PROPERTY_EXAMPLES", "100")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# --- the reference: the per-pod scan, as it was ---------------------------------------------------


def ref_fits(free: Mapping[str, int], demand: Mapping[str, int]) -> bool:
    return all(free.get(key, 0) >= amount for key, amount in demand.items())


def ref_gpu_slots(free: Mapping[str, int]) -> int:
    return sum(v for k, v in free.items() if k in (GPU, SHARE) or k.startswith("mig:"))


# Which pools a gang may use at all (isolation, taints, spot) is policy, not the search this file
# is about: the reference takes it from the module as it stands.
ref_candidate_pools = candidate_pools


def ref_place_gang(
    workload: Workload,
    cluster: Cluster,
    pools: list[NodePool],
    nodes_by_pool: Mapping[str, list[Node]],
    free: FreeCapacity,
) -> Placement | Miss:
    trial = {node.id: dict(free[node.id]) for pool in pools for node in nodes_by_pool.get(pool.id, [])}
    node_pool = {node.id: pool for pool in pools for node in nodes_by_pool.get(pool.id, [])}
    assignments: list[PodAssignment] = []
    touched: set[str] = set()
    for pod_set in workload.pod_sets:
        demands = {pool.id: pod_set.demand_on(pool) for pool in pools}
        for index in range(pod_set.replicas):
            best: tuple[int, str] | None = None
            for node_id, node_free in trial.items():
                demand = demands[node_pool[node_id].id]
                if demand is None or not ref_fits(node_free, demand):
                    continue
                left = ref_gpu_slots(node_free) - ref_gpu_slots(demand)
                if best is None or (left, node_id) < best:
                    best = (left, node_id)
            if best is None:
                continue
            node_id = best[1]
            demand = demands[node_pool[node_id].id]
            assert demand is not None
            for key, amount in demand.items():
                trial[node_id][key] -= amount
            touched.add(node_id)
            assignments.append(PodAssignment(pod_set.name, index, node_id, demand))
    if len(assignments) < workload.min_available:
        return Miss(cluster.id, len(assignments), cluster.name)
    leftover = sum(ref_gpu_slots(trial[node_id]) for node_id in touched)
    return Placement(cluster.id, tuple(assignments), leftover)


def ref_placements_in_cluster(
    workload: Workload,
    cluster: Cluster,
    nodes_by_pool: Mapping[str, list[Node]],
    free: FreeCapacity,
    prefer_same_pool: bool = True,
) -> list[Placement] | Miss:
    pools = ref_candidate_pools(workload, cluster)
    if not pools:
        return Miss(cluster.id, 0, cluster.name)
    fits: list[Placement] = []
    if prefer_same_pool and len(pools) > 1:
        single = [ref_place_gang(workload, cluster, [pool], nodes_by_pool, free) for pool in pools]
        fits = sorted((p for p in single if isinstance(p, Placement)), key=lambda p: p.leftover_gpu_slots)
    spread = ref_place_gang(workload, cluster, pools, nodes_by_pool, free)
    if isinstance(spread, Miss) and not fits:
        spread = ref_gpu_pods_first(workload, cluster, pools, nodes_by_pool, free) or spread
    if isinstance(spread, Miss):
        return fits or spread
    if not fits:
        return [spread]
    if not any(p.assignments == spread.assignments for p in fits):
        fits.append(replace(spread, spread=True))
    return fits


def ref_gpu_pods_first(
    workload: Workload,
    cluster: Cluster,
    pools: list[NodePool],
    nodes_by_pool: Mapping[str, list[Node]],
    free: FreeCapacity,
) -> Placement | None:
    """The rule the search gained after the scan above was copied: when the spread misses (and no
    single pool fits), a CPU-only launcher placed first may have taken the CPU its GPU workers
    needed on their only node, so the GPU pod sets are placed first, once; the assignments keep
    the gang's pod-set order."""
    order = sorted(range(len(workload.pod_sets)), key=lambda i: not ref_needs_gpu(workload.pod_sets[i]))
    if order == sorted(order):
        return None
    reordered = replace(workload, pod_sets=tuple(workload.pod_sets[i] for i in order))
    found = ref_place_gang(reordered, cluster, pools, nodes_by_pool, free)
    if isinstance(found, Miss):
        return None
    rank = {pod_set.name: i for i, pod_set in enumerate(workload.pod_sets)}
    return replace(found, assignments=tuple(sorted(found.assignments, key=lambda a: (rank[a.pod_set], a.index))))


def ref_needs_gpu(pod_set: PodSet) -> bool:
    return bool(pod_set.gpus or pod_set.mig_profile or pod_set.gpu_fraction)


# --- random fleets, used capacity and gangs -------------------------------------------------------

MODELS = ("A100-80GB", "H100-80GB")
SPOT = Taint("spot", "true")


@dataclass
class Fleet:
    clusters: tuple[Cluster, ...]
    nodes: tuple[Node, ...]
    pools_by_id: dict[str, NodePool]
    nodes_by_pool: dict[str, list[Node]]


@st.composite
def fleets(draw: st.DrawFn) -> Fleet:
    clusters: list[Cluster] = []
    nodes: list[Node] = []
    for c in range(draw(st.integers(1, 2))):
        cluster_id = f"c{c}"
        pools = []
        for p in range(draw(st.integers(1, 3))):
            pool = make_pool(
                f"{cluster_id}p{p}",
                cluster_id,
                gpu_model=draw(st.sampled_from(MODELS)),
                gpus_per_node=draw(st.sampled_from([1, 2, 4, 8])),
                sharing=draw(st.sampled_from(["exclusive", "exclusive", "mig:all-balanced", "timeslice:4", "mps:2"])),
                cpu_millis=draw(st.sampled_from([3_000, 8_000, 64_000])),
                memory_mib=draw(st.sampled_from([16_384, 64_000])),
                taints=draw(st.sampled_from([(), (SPOT,)])),
            )
            pools.append(pool)
            count = draw(st.integers(1, 6))
            cordoned = draw(st.sets(st.integers(0, count - 1), max_size=1))
            nodes.extend(make_nodes(pool, count, unschedulable=cordoned))
        clusters.append(make_cluster(cluster_id, *pools))
    pools_by_id = {p.id: p for c in clusters for p in c.pools}
    by_pool: dict[str, list[Node]] = {}
    for node in nodes:
        if node.schedulable:
            by_pool.setdefault(node.pool_id, []).append(node)
    return Fleet(tuple(clusters), tuple(nodes), pools_by_id, by_pool)


@st.composite
def pod_sets(draw: st.DrawFn, name: str) -> PodSet:
    replicas = draw(st.integers(1, 4))
    models = draw(st.sampled_from([(), (), ("A100-80GB",), ("H100-80GB",)]))
    kind = draw(st.sampled_from(["gpus", "gpus", "mig", "frac", "cpu"]))
    if kind == "gpus":
        cpu = draw(st.sampled_from([1_000, 2_500]))
        return gpus(draw(st.sampled_from([1, 2, 4, 8])), replicas, name=name, models=models, cpu_millis=cpu)
    if kind == "mig":
        return mig(draw(st.sampled_from(["1g.10gb", "2g.20gb", "3g.40gb"])), replicas, name=name, models=models)
    if kind == "frac":
        return frac(draw(st.sampled_from([0.25, 0.5, 0.75])), replicas, name=name, models=models)
    return cpu_only(replicas, name=name, cpu_millis=draw(st.sampled_from([500, 3_000])))


@st.composite
def gangs(draw: st.DrawFn, index: int) -> Workload:
    names = ["workers"] if draw(st.booleans()) else ["launcher", "workers"]
    sets = [draw(pod_sets(name)) for name in names]
    total = sum(ps.replicas for ps in sets)
    return make_workload(
        f"w{index}",
        *sets,
        min_available=draw(st.one_of(st.just(total), st.integers(1, total))),
        isolation=draw(st.booleans()),
        tolerations=draw(st.sampled_from([(), (Toleration("spot", "Exists"),)])),
    )


def use_some(draw: st.DrawFn, free: FreeCapacity) -> None:
    """Take random amounts out of the nodes; now and then one goes below zero, as it can in a
    snapshot whose live runs over-commit a node that shrank."""
    for node_id in sorted(free):
        if not draw(st.booleans()):
            continue
        node_free = free[node_id]
        for key in sorted(node_free):
            if draw(st.integers(0, 7)) == 0:
                node_free[key] = -draw(st.integers(1, 2))
            else:
                node_free[key] = node_free[key] - draw(st.integers(0, node_free[key]))


def apply(free: FreeCapacity, placement: Placement, sign: int) -> None:
    """What the scheduler does with an admission (+1) or an eviction (-1): in place."""
    for assignment in placement.assignments:
        node_free = free.get(assignment.node_id)
        if node_free is not None:
            for key, amount in assignment.demand.items():
                node_free[key] = node_free.get(key, 0) - sign * amount


# --- the properties -------------------------------------------------------------------------------


@EXAMPLES
@given(data=st.data(), fleet=fleets())
def test_indexed_placement_equals_the_per_pod_scan_across_in_place_updates(data: st.DataObject, fleet: Fleet) -> None:
    draw = data.draw
    free = empty_capacity(list(fleet.nodes), fleet.pools_by_id)
    use_some(draw, free)
    reference = copy.deepcopy(dict(free))
    assert type(reference) is dict
    workloads = [draw(gangs(i)) for i in range(draw(st.integers(1, 5)))]
    applied: list[Placement] = []
    for workload in workloads:  # live runs, taken before any placement is asked for
        live = [ref_placements_in_cluster(workload, c, fleet.nodes_by_pool, reference) for c in fleet.clusters]
        held = [p[0] for p in live if not isinstance(p, Miss)]
        if held and draw(st.booleans()):
            apply(free, held[0], +1)
            apply(reference, held[0], +1)
            applied.append(held[0])
    for step in range(draw(st.integers(1, 12))):
        # the same gang (or another of its shape) comes back after the capacity changed
        workload = replace(draw(st.sampled_from(workloads)), id=f"step{step}")
        for cluster in fleet.clusters:
            for prefer in (True, False):
                ours = placements_in_cluster(workload, cluster, fleet.nodes_by_pool, free, prefer)
                theirs = ref_placements_in_cluster(workload, cluster, fleet.nodes_by_pool, reference, prefer)
                assert ours == theirs, (workload, cluster.id, prefer)
            pools = ref_candidate_pools(workload, cluster)
            gang = place_gang(workload, cluster, pools, fleet.nodes_by_pool, free)
            assert gang == ref_place_gang(workload, cluster, pools, fleet.nodes_by_pool, reference)
            # an untracked copy (fresh indexes) and a tracked copy give the same answer too
            plain = {node_id: dict(values) for node_id, values in free.items()}
            assert placements_in_cluster(workload, cluster, fleet.nodes_by_pool, plain) == ref_placements_in_cluster(
                workload, cluster, fleet.nodes_by_pool, reference
            )
            assert place_gang(workload, cluster, pools, fleet.nodes_by_pool, copy_capacity(free)) == gang
        for prefer in (True, False):  # the whole fleet at once: the per-cluster answers, gathered
            wanted: list[Placement] = []
            closest: Miss | None = None
            for cluster in fleet.clusters:
                result = ref_placements_in_cluster(workload, cluster, fleet.nodes_by_pool, reference, prefer)
                if isinstance(result, Miss):
                    closest = result if closest is None or result.placed > closest.placed else closest
                else:
                    wanted.extend(result)
            assert placements_in_fleet(workload, fleet.clusters, fleet.nodes_by_pool, free, prefer) == (
                wanted,
                closest,
            )
        assert free == reference  # placing never changes the capacity it is given
        # admit a placement found, or give back an earlier one, in place on both sides
        found = [
            placement
            for cluster in fleet.clusters
            for result in (ref_placements_in_cluster(workload, cluster, fleet.nodes_by_pool, reference),)
            if not isinstance(result, Miss)
            for placement in result
        ]
        action = draw(st.sampled_from(["admit", "admit", "release", "poke", "nothing"]))
        if action == "admit" and found:
            chosen = draw(st.sampled_from(found))
            apply(free, chosen, +1)
            apply(reference, chosen, +1)
            applied.append(chosen)
        elif action == "release" and applied:
            released = applied.pop(draw(st.integers(0, len(applied) - 1)))
            apply(free, released, -1)
            apply(reference, released, -1)
        elif action == "poke" and free:  # a caller changing one node directly
            node_id = draw(st.sampled_from(sorted(free)))
            key = draw(st.sampled_from(sorted(free[node_id])))
            change = draw(st.sampled_from([-1, 1, 4]))
            free[node_id][key] += change
            reference[node_id][key] += change


# capacity.py's sentence for a pod that asks more GPUs than any node of its models has.
NO_NODE_HAS_GPUS = r"pod set `([^`]+)` asks (\d+) GPUs per pod and no node(?: of model .+)? has more than (\d+)"


@EXAMPLES
@given(data=st.data(), fleet=fleets())
def test_why_never_fits_equals_the_per_pod_scan_on_the_empty_fleet(data: st.DataObject, fleet: Fleet) -> None:
    workload = data.draw(gangs(0))
    nodes = tuple(replace(node, schedulable=True) for node in fleet.nodes)  # how cordons count is policy
    reason = why_never_fits(workload, fleet.clusters, nodes)
    by_pool: dict[str, list[Node]] = {}
    for node in nodes:
        by_pool.setdefault(node.pool_id, []).append(node)
    empty = {k: dict(v) for k, v in empty_capacity(list(nodes), fleet.pools_by_id).items()}
    misses = [ref_placements_in_cluster(workload, c, by_pool, empty) for c in fleet.clusters]
    if any(not isinstance(m, Miss) for m in misses):
        assert reason is None
    else:
        assert reason is not None
        best = max((m for m in misses if isinstance(m, Miss)), key=lambda m: m.placed)
        named = re.search(NO_NODE_HAS_GPUS, reason)
        if best.placed == 0 and named is not None:
            # Not one pod anywhere, and the sentence says what no node has: check it is so.
            pod_set = next(p for p in workload.pod_sets if p.name == named.group(1))
            pools = [pool for c in fleet.clusters for pool in c.pools]
            usable = [pool for pool in pools if not pod_set.gpu_models or pool.gpu_model in pod_set.gpu_models]
            assert int(named.group(2)) == pod_set.gpus > int(named.group(3)) == max(p.gpus_per_node for p in usable)
        elif best.placed == 0 and "holds at most" not in reason:
            assert "no pool offers it" in reason or "per pod and no node" in reason
        else:
            assert f"holds at most {best.placed} even when empty" in reason


def test_replacing_a_node_entry_keeps_results_right() -> None:
    pool = make_pool(gpus_per_node=8)
    cluster = make_cluster("c1", pool)
    nodes = make_nodes(pool, 2)
    free = empty_capacity(list(nodes), {pool.id: pool})
    by_pool = {pool.id: list(nodes)}
    workload = make_workload("w", gpus(8))
    first = placements_in_cluster(workload, cluster, by_pool, free)
    assert not isinstance(first, Miss)
    assert first[0].assignments[0].node_id == "p1-n0"
    free["p1-n0"] = {GPU: 0, "cpu": 512_000, "mem": 4_000_000}  # a whole new, untracked entry
    free["p1-n0"][GPU] = 1
    again = placements_in_cluster(workload, cluster, by_pool, free)
    assert not isinstance(again, Miss)
    assert again[0].assignments[0].node_id == "p1-n1"


def test_copies_of_tracked_capacity_are_plain_dicts_of_the_same_values() -> None:
    pool = make_pool(gpus_per_node=8)
    free = empty_capacity(list(make_nodes(pool, 2)), {pool.id: pool})
    deep = copy.deepcopy(free)
    assert deep == free
    assert type(deep) is dict
    assert all(type(v) is dict for v in deep.values())
    shallow = copy.copy(free)
    assert shallow == free
