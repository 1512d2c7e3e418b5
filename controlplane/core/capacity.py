"""One capacity model and one fit question, for the scheduler, submit validation and the autoscaler.

`FleetCapacity` is the fleet's free capacity per node with its nodes by pool and by cluster (the
placement indexes follow its in-place changes). `fits` answers "where could this gang go on this
capacity": every placement honouring the gang's constraints (one cluster, all-or-nothing, pools it
may use, `same_pool`, a zone or rack when no single pool holds it), tightest first per cluster,
and the best miss. The three callers ask it on different capacity:

- the scheduler, on the free capacity of this cycle (then ranks and checks quota, `fit.py`);
- submit validation, on the whole fleet empty and uncordoned ("could this ever fit", `why_never_fits`);
- the autoscaler, on the free capacity plus k hypothetical nodes (`with_nodes`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from controlplane.core.placement import (
    FreeCapacity,
    Miss,
    Placement,
    candidate_pools,
    empty_capacity,
    largest_fit,
    place_gang,
    placements_in_cluster,
)
from controlplane.domain.model import Cluster, Node, NodePool, PodAssignment, Workload

# Node labels that name a failure or network domain: a gang no single pool holds may still stay
# inside one of each (and the scorer prefers placements that do).
TOPOLOGY_LABELS = ("topology.kubernetes.io/zone", "topology.kubernetes.io/rack", "cloud.google.com/gke-placement-group")


@dataclass(frozen=True)
class Fits:
    """The answer of `fits`: feasible placements (cluster by cluster), and why there were none."""

    placements: list[Placement]
    best_miss: Miss | None  # the attempt that placed the most pods, None if no cluster missed


class FleetCapacity:
    """Free capacity of a fleet's schedulable nodes, updated in place as work takes and frees it."""

    def __init__(self, clusters: Sequence[Cluster], nodes: Iterable[Node]) -> None:
        self.clusters = tuple(clusters)
        self.pools: dict[str, NodePool] = {pool.id: pool for cluster in self.clusters for pool in cluster.pools}
        nodes = list(nodes)
        self.pool_of_node: dict[str, NodePool] = {n.id: self.pools[n.pool_id] for n in nodes if n.pool_id in self.pools}
        schedulable = [node for node in nodes if node.schedulable]
        self.nodes_by_pool: dict[str, list[Node]] = {}
        self.nodes_by_cluster: dict[str, list[str]] = {}
        for node in schedulable:
            self.nodes_by_pool.setdefault(node.pool_id, []).append(node)
            self.nodes_by_cluster.setdefault(node.cluster_id, []).append(node.id)
        self.free: FreeCapacity = empty_capacity(schedulable, self.pools)

    def take(self, assignments: Iterable[PodAssignment]) -> None:
        """Take the capacity of pod assignments (live runs, or a placement counted on)."""
        free = self.free
        for a in assignments:
            node_free = free.get(a.node_id)
            if node_free is not None:
                for key, amount in a.demand.items():
                    node_free[key] = node_free.get(key, 0) - amount

    def with_nodes(self, extra: Mapping[str, Sequence[Node]]) -> FleetCapacity:
        """A copy with hypothetical empty nodes added to pools (pool id -> nodes): the fleet the
        autoscaler would have after buying them. This capacity is not changed."""
        grown = FleetCapacity.__new__(FleetCapacity)
        grown.clusters, grown.pools = self.clusters, self.pools
        grown.pool_of_node = dict(self.pool_of_node)
        grown.nodes_by_pool = dict(self.nodes_by_pool)
        grown.nodes_by_cluster = dict(self.nodes_by_cluster)
        free = {node_id: dict(amounts) for node_id, amounts in self.free.items()}
        for pool_id, nodes in extra.items():
            pool = self.pools[pool_id]
            grown.nodes_by_pool[pool_id] = [*self.nodes_by_pool.get(pool_id, []), *nodes]
            grown.nodes_by_cluster[pool.cluster_id] = [
                *self.nodes_by_cluster.get(pool.cluster_id, []),
                *(node.id for node in nodes),
            ]
            for node in nodes:
                grown.pool_of_node[node.id] = pool
                free[node.id] = pool.node_capacity()
        grown.free = free
        return grown

    def fits(
        self, workload: Workload, clusters: Sequence[Cluster] | None = None, prefer_same_pool: bool = True
    ) -> Fits:
        chosen = self.clusters if clusters is None else clusters
        return fits(workload, chosen, self.nodes_by_pool, self.pool_of_node, self.free, prefer_same_pool)


def fits(
    workload: Workload,
    clusters: Sequence[Cluster],
    nodes_by_pool: Mapping[str, list[Node]],
    pool_of_node: Mapping[str, NodePool],
    free: FreeCapacity,
    prefer_same_pool: bool = True,
) -> Fits:
    """The one fit question: every placement of the gang on `free` its constraints allow.

    A gang whose pod sets have minimums is asked at its full counts first, then at the largest
    reduced counts that fit (`placement.partial`): the placements then hold that many pods, and
    with none the miss is the one at its minimum counts."""
    return largest_fit(
        workload,
        lambda gang: _fits_as_is(gang, clusters, nodes_by_pool, pool_of_node, free, prefer_same_pool),
        lambda answer: bool(answer.placements),
    )


def _fits_as_is(
    workload: Workload,
    clusters: Sequence[Cluster],
    nodes_by_pool: Mapping[str, list[Node]],
    pool_of_node: Mapping[str, NodePool],
    free: FreeCapacity,
    prefer_same_pool: bool,
) -> Fits:
    placements: list[Placement] = []
    best_miss: Miss | None = None
    for cluster in clusters:
        found = fits_in_cluster(workload, cluster, nodes_by_pool, pool_of_node, free, prefer_same_pool)
        if isinstance(found, Miss):
            if best_miss is None or found.placed > best_miss.placed:
                best_miss = found
        else:
            placements.extend(found)
    return Fits(placements, best_miss)


def fits_in_cluster(
    workload: Workload,
    cluster: Cluster,
    nodes_by_pool: Mapping[str, list[Node]],
    pool_of_node: Mapping[str, NodePool],
    free: FreeCapacity,
    prefer_same_pool: bool = True,
) -> list[Placement] | Miss:
    """One cluster's part of `fits` for a gang asked as it is (no pod-set minimums tried): its
    placements there (a list the caller owns, maybe empty when `same_pool` is required and only
    several pools hold it), or the Miss. `fits` is these parts in the order of the clusters, and
    its best miss the first Miss that placed the most pods."""
    found = placements_in_cluster(workload, cluster, nodes_by_pool, free, prefer_same_pool)
    if isinstance(found, Miss):
        return found
    if workload.same_pool == "required":
        return [p for p in found if pools_used(p, pool_of_node) == 1]
    if all(pools_used(p, pool_of_node) > 1 for p in found):
        found.extend(_zone_placements(workload, cluster, nodes_by_pool, free))
    return found


def why_never_fits(workload: Workload, clusters: Sequence[Cluster], nodes: Iterable[Node]) -> str | None:
    """None if some cluster of the fleet, empty, could hold the gang; else a reason for people."""
    return never_fits(empty_fleet(clusters, nodes), workload)


def empty_fleet(clusters: Sequence[Cluster], nodes: Iterable[Node]) -> FleetCapacity:
    """The fleet as if nothing ran on it and no node were cordoned (a cordon is temporary: a gang that
    fits the fleet once its nodes come back is not refused)."""
    return FleetCapacity(clusters, [replace(node, schedulable=True) for node in nodes])


def never_fits(empty: FleetCapacity, workload: Workload) -> str | None:
    """`why_never_fits` on an `empty_fleet` built once (the submit path asks it for many gangs)."""
    if not empty.clusters:
        return "the fleet has no clusters"
    answer = empty.fits(workload)
    if answer.placements:
        return None
    best = answer.best_miss
    if best is None:  # every cluster held it, but only over several pools
        return "same_pool is required, but only several node pools together could ever hold this gang"
    cause = _pod_no_node_holds(workload, empty.clusters) if best.placed == 0 else None
    if cause is not None:
        return f"no cluster in the fleet could ever hold this gang: {cause}"
    return (
        f"no cluster in the fleet could ever hold this gang: it needs {workload.min_available} pods "
        f"placed at once and the best cluster ({best.detail}) holds at most {best.placed} even when empty"
    )


def _pod_no_node_holds(workload: Workload, clusters: Sequence[Cluster]) -> str | None:
    """Why not even one pod fits anywhere, said of the pod set and what it asks (a GPU model no
    pool offers, more GPUs, CPU or memory than any node of the models it may use has); None when
    it is something else (MIG layouts, taints, sharing: the general sentence then)."""
    pools = [pool for cluster in clusters for pool in cluster.pools]
    offered = sorted({pool.gpu_model for pool in pools})
    for pod_set in workload.pod_sets:
        models = pod_set.gpu_models
        usable = [pool for pool in pools if not models or pool.gpu_model in models]
        if not usable:
            return (
                f"pod set `{pod_set.name}` asks for GPU model {' or '.join(models)} and no pool offers it "
                f"(the pools offer {', '.join(offered) or 'none'})"
            )
        of_models = f" of model {' or '.join(models)}" if models else ""
        most = max(pool.gpus_per_node for pool in usable)
        if pod_set.gpus > most:
            return (
                f"pod set `{pod_set.name}` asks {pod_set.gpus} GPUs per pod and no node{of_models} has more than {most}"
            )
        cpu = max(pool.cpu_millis for pool in usable)
        if pod_set.cpu_millis > cpu:
            return (
                f"pod set `{pod_set.name}` asks {pod_set.cpu_millis}m CPU per pod and no node{of_models} "
                f"has more than {cpu}m"
            )
        memory = max(pool.memory_mib for pool in usable)
        if pod_set.memory_mib > memory:
            return (
                f"pod set `{pod_set.name}` asks {pod_set.memory_mib} MiB of memory per pod and no node{of_models} "
                f"has more than {memory} MiB"
            )
    return None


def pools_used(placement: Placement, pool_of_node: Mapping[str, NodePool]) -> int:
    return len({pool_of_node[a.node_id].id for a in placement.assignments})


def _zone_placements(
    workload: Workload, cluster: Cluster, nodes_by_pool: Mapping[str, list[Node]], free: FreeCapacity
) -> list[Placement]:
    """A gang no single pool can hold may still stay inside one zone or rack: offer those too."""
    pools = candidate_pools(workload, cluster)
    found = []
    for label in TOPOLOGY_LABELS:
        groups: dict[str, list[NodePool]] = {}
        for pool in pools:
            if label in pool.labels:
                groups.setdefault(pool.labels[label], []).append(pool)
        for _, group in sorted(groups.items()):
            if 1 < len(group) < len(pools):
                placed = place_gang(workload, cluster, group, nodes_by_pool, free)
                if isinstance(placed, Placement):
                    found.append(replace(placed, spread=False))
    return found
