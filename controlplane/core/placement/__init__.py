"""Gang placement on concrete nodes: all-or-nothing, one cluster, real free capacity.

The rule is plain best fit: pods are placed one after the other (pod sets in order, replicas in
order), each on the node that leaves the fewest free GPU slots (whole GPUs, MIG slices, shares)
after taking it, ties broken by node id; a gang is a `Placement` once `min_available` of its pods
are placed (and every pod set its `min_replicas`), else a `Miss` that says how many were. Which
counts of a gang whose pod sets have minimums to ask for is `partial.py`'s rule.

Scanning every node for every pod is far too slow for 10,000 nodes and a backlog of 100,000 gangs
(issue 3, "Speed"), so the same rule is computed from indexes and remembered answers:

- every pool keeps its nodes in buckets by free GPU slots, each bucket sorted by node id: the
  tightest node that fits is the first one that fits from the first bucket at or above the pod's
  own slots, and a pool whose most free amount of a slot is below the request is skipped whole;
- the replicas of a pod set are identical: once one does not fit, the rest do not either (a trial
  only takes capacity), and the best node the gang has not touched stays best until it is taken;
  a gang of one pod (most of a backlog) needs no trial at all;
- a single-pool attempt whose pools lack the free slots for `min_available` pods is a miss
  without placing pod by pod (single-pool misses are dropped, so their count does not matter);
- `empty_capacity()` hands out a `FreeCapacity` whose node dicts report their own changes, so the
  indexes follow the caller's in-place updates (admissions, evictions) without a rescan, and
  answers are remembered per gang shape until a node of a pool they read changes.

A `FreeCapacity` built any other way (a plain dict, a `dict()` copy) gets fresh indexes on each
call: correct, only slower; `copy_capacity()` makes a tracked copy. The results are exactly those
of the per-pod scan: tests/bench/test_placement_equivalence.py checks that against a copy of it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from controlplane.core.placement.partial import at_counts, largest_fit
from controlplane.core.placement.search import search_context
from controlplane.core.placement.tracking import NodeFree, TrackedCapacity
from controlplane.core.placement.types import FreeCapacity, Miss, Placement, candidate_pools, gpu_slots
from controlplane.domain.model import Cluster, Node, NodePool, Workload

__all__ = [
    "FreeCapacity",
    "Miss",
    "Placement",
    "at_counts",
    "candidate_pools",
    "copy_capacity",
    "empty_capacity",
    "gpu_slots",
    "largest_fit",
    "place_gang",
    "place_in_cluster",
    "placements_in_cluster",
    "placements_in_fleet",
]


def place_gang(
    workload: Workload,
    cluster: Cluster,
    pools: list[NodePool],
    nodes_by_pool: Mapping[str, list[Node]],
    free: FreeCapacity,
) -> Placement | Miss:
    """Best-fit every pod of the gang onto nodes of `pools`; `free` is not modified."""
    return search_context(free, nodes_by_pool).place(workload, cluster, pools)


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
    found = search_context(free, nodes_by_pool).placements(workload, cluster, prefer_same_pool)
    return found if isinstance(found, Miss) else list(found)  # the caller owns its list


def placements_in_fleet(
    workload: Workload,
    clusters: Sequence[Cluster],
    nodes_by_pool: Mapping[str, list[Node]],
    free: FreeCapacity,
    prefer_same_pool: bool = True,
) -> tuple[list[Placement], Miss | None]:
    """`placements_in_cluster` over `clusters` in one call: every feasible placement (cluster by
    cluster, in their order) and the first Miss that placed the most pods (None if no cluster
    missed).

    The same answer as calling `placements_in_cluster` per cluster, but in a fleet where most
    gangs wait it is remembered as a whole (pass the same `clusters` sequence each time), so a
    gang whose shape was already decided costs one look-up instead of one per cluster.
    """
    placements, miss = search_context(free, nodes_by_pool).fleet(workload, clusters, prefer_same_pool)
    return list(placements), miss


def empty_capacity(nodes: list[Node], pools_by_id: Mapping[str, NodePool]) -> FreeCapacity:
    """The free capacity of empty `nodes` (schedulable ones only), ready to be updated in place.

    The dicts it returns tell the placement indexes which nodes changed, so keep updating them in
    place (`free[node][key] -= amount`); replacing or adding whole node entries is allowed too but
    makes every later call rebuild its indexes. The node lists of the `nodes_by_pool` passed with
    it are taken as they are while the capacity is in use (another list, or one of another length,
    is indexed afresh; a list changed in place keeping its length is not noticed).
    """
    capacity = TrackedCapacity()
    dirty = capacity.ledger.dirty
    per_pool: dict[str, dict[str, int]] = {}  # node_capacity() works MIG geometry out: once per pool
    for node in nodes:
        if node.schedulable:
            empty = per_pool.get(node.pool_id)
            if empty is None:
                empty = per_pool[node.pool_id] = pools_by_id[node.pool_id].node_capacity()
            dict.__setitem__(capacity, node.id, NodeFree(empty, node.id, dirty))
    return capacity


def copy_capacity(free: FreeCapacity, node_ids: Iterable[str] | None = None) -> FreeCapacity:
    """An independent copy of `free` (or of its `node_ids`) that keeps the indexes of its own.

    Use it for trial capacity that is updated in place between placement calls (a copy made with
    `dict()` works too, but gets fresh indexes on every call).
    """
    capacity = TrackedCapacity()
    dirty = capacity.ledger.dirty
    for node_id in free if node_ids is None else node_ids:
        dict.__setitem__(capacity, node_id, NodeFree(free[node_id], node_id, dirty))
    return capacity
