"""Gang placement on concrete nodes: all-or-nothing, one cluster, real free capacity."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from controlplane.domain.model import GPU, SHARE, Cluster, Node, NodePool, PodAssignment, Workload

FreeCapacity = dict[str, dict[str, int]]  # node id -> dimension -> free amount


@dataclass(frozen=True)
class Placement:
    cluster_id: str
    assignments: tuple[PodAssignment, ...]
    leftover_gpu_slots: int  # free GPU slots left on the nodes it touched: lower packs tighter
    spread: bool = False  # over several pools although one pool alone could hold the gang


@dataclass(frozen=True)
class Miss:
    """Why a gang did not fit one cluster: how many of its pods the best attempt placed."""

    cluster_id: str
    placed: int
    detail: str


def _fits(free: Mapping[str, int], demand: Mapping[str, int]) -> bool:
    return all(free.get(key, 0) >= amount for key, amount in demand.items())


def _gpu_slots(free: Mapping[str, int]) -> int:
    return sum(v for k, v in free.items() if k in (GPU, SHARE) or k.startswith("mig:"))


def candidate_pools(workload: Workload, cluster: Cluster) -> list[NodePool]:
    """Pools of `cluster` this workload may use at all (isolation, taints)."""
    pools = []
    for pool in cluster.pools:
        if workload.requires_isolation and not pool.sharing.isolated:
            continue
        if pool.untolerated_taints(workload.tolerations):
            continue
        pools.append(pool)
    return pools


def place_gang(
    workload: Workload,
    cluster: Cluster,
    pools: list[NodePool],
    nodes_by_pool: Mapping[str, list[Node]],
    free: FreeCapacity,
) -> Placement | Miss:
    """Best-fit every pod of the gang onto nodes of `pools`; `free` is not modified."""
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
                if demand is None or not _fits(node_free, demand):
                    continue
                left = _gpu_slots(node_free) - _gpu_slots(demand)
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
    leftover = sum(_gpu_slots(trial[node_id]) for node_id in touched)
    return Placement(cluster.id, tuple(assignments), leftover)


def place_in_cluster(
    workload: Workload,
    cluster: Cluster,
    nodes_by_pool: Mapping[str, list[Node]],
    free: FreeCapacity,
    prefer_same_pool: bool = True,
) -> Placement | Miss:
    """The preferred placement of the gang in one cluster, or why it does not fit."""
    found = placements_in_cluster(workload, cluster, nodes_by_pool, free, prefer_same_pool)
    return found if isinstance(found, Miss) else found[0]


def placements_in_cluster(
    workload: Workload,
    cluster: Cluster,
    nodes_by_pool: Mapping[str, list[Node]],
    free: FreeCapacity,
    prefer_same_pool: bool = True,
) -> list[Placement] | Miss:
    """Feasible placements in one cluster, tightest first; a Miss when there is none.

    With `prefer_same_pool`, every single-pool placement is offered before one that spreads the
    gang over several pools, so a caller that rejects a placement (a per-model limit, say) can
    fall back to another pool of the same cluster.
    """
    pools = candidate_pools(workload, cluster)
    if not pools:
        return Miss(cluster.id, 0, cluster.name)
    fits: list[Placement] = []
    if prefer_same_pool and len(pools) > 1:
        single = [place_gang(workload, cluster, [pool], nodes_by_pool, free) for pool in pools]
        fits = sorted((p for p in single if isinstance(p, Placement)), key=lambda p: p.leftover_gpu_slots)
    spread = place_gang(workload, cluster, pools, nodes_by_pool, free)
    if isinstance(spread, Miss):
        return fits or spread
    if not fits:
        return [spread]
    if not any(p.assignments == spread.assignments for p in fits):
        fits.append(replace(spread, spread=True))
    return fits


def empty_capacity(nodes: list[Node], pools_by_id: Mapping[str, NodePool]) -> FreeCapacity:
    return {node.id: pools_by_id[node.pool_id].node_capacity() for node in nodes if node.schedulable}


def why_never_fits(workload: Workload, clusters: tuple[Cluster, ...], nodes: tuple[Node, ...]) -> str | None:
    """None if some cluster of the fleet, empty, could hold the gang; else a reason for people."""
    if not clusters:
        return "the fleet has no clusters"
    pools_by_id = {pool.id: pool for cluster in clusters for pool in cluster.pools}
    nodes_by_pool: dict[str, list[Node]] = {}
    for node in nodes:
        if node.schedulable:
            nodes_by_pool.setdefault(node.pool_id, []).append(node)
    free = empty_capacity(list(nodes), pools_by_id)
    best: Miss | None = None
    for cluster in clusters:
        result = place_in_cluster(workload, cluster, nodes_by_pool, free)
        if not isinstance(result, Miss):
            return None
        if best is None or result.placed > best.placed:
            best = result
    assert best is not None
    return (
        f"no cluster in the fleet could ever hold this gang: it needs {workload.min_available} pods "
        f"placed at once and the best cluster ({best.detail}) holds at most {best.placed} even when empty"
    )
