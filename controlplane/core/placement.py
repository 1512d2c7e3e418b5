"""Gang placement on concrete nodes: all-or-nothing, one cluster, real free capacity.

The rule is plain best fit: pods are placed one after the other (pod sets in order, replicas in
order), each on the node that leaves the fewest free GPU slots (whole GPUs, MIG slices, shares)
after taking it, ties broken by node id; a gang is a `Placement` once `min_available` of its pods
are placed, else a `Miss` that says how many were.

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

from bisect import bisect_left, insort
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Self

from controlplane.domain.model import GPU, SHARE, Cluster, Node, NodePool, PodAssignment, PodSet, Workload

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


def gpu_slots(amounts: Mapping[str, int]) -> int:
    """GPU slots in a demand or a node's free capacity: whole GPUs, MIG slices and shares."""
    return sum(value for key, value in amounts.items() if _is_slot(key))


def _is_slot(key: str) -> bool:
    return key in (GPU, SHARE) or key.startswith("mig:")


def candidate_pools(workload: Workload, cluster: Cluster) -> list[NodePool]:
    """Pools of `cluster` this workload may use at all (isolation, taints, spot)."""
    pools = []
    for pool in cluster.pools:
        if workload.requires_isolation and not pool.sharing.isolated:
            continue
        if pool.spot and workload.spot == "never":
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
    return _context(free, nodes_by_pool).place(workload, cluster, pools)


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
    found = _context(free, nodes_by_pool).placements(workload, cluster, prefer_same_pool)
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
    placements, miss = _context(free, nodes_by_pool).fleet(workload, clusters, prefer_same_pool)
    return list(placements), miss


def empty_capacity(nodes: list[Node], pools_by_id: Mapping[str, NodePool]) -> FreeCapacity:
    """The free capacity of empty `nodes` (schedulable ones only), ready to be updated in place.

    The dicts it returns tell the placement indexes which nodes changed, so keep updating them in
    place (`free[node][key] -= amount`); replacing or adding whole node entries is allowed too but
    makes every later call rebuild its indexes. The node lists of the `nodes_by_pool` passed with
    it are taken as they are while the capacity is in use (another list, or one of another length,
    is indexed afresh; a list changed in place keeping its length is not noticed).
    """
    capacity = _TrackedCapacity()
    dirty = capacity.ledger.dirty
    per_pool: dict[str, dict[str, int]] = {}  # node_capacity() works MIG geometry out: once per pool
    for node in nodes:
        if node.schedulable:
            empty = per_pool.get(node.pool_id)
            if empty is None:
                empty = per_pool[node.pool_id] = pools_by_id[node.pool_id].node_capacity()
            dict.__setitem__(capacity, node.id, _NodeFree(empty, node.id, dirty))
    return capacity


def copy_capacity(free: FreeCapacity, node_ids: Iterable[str] | None = None) -> FreeCapacity:
    """An independent copy of `free` (or of its `node_ids`) that keeps the indexes of its own.

    Use it for trial capacity that is updated in place between placement calls (a copy made with
    `dict()` works too, but gets fresh indexes on every call).
    """
    capacity = _TrackedCapacity()
    dirty = capacity.ledger.dirty
    for node_id in free if node_ids is None else node_ids:
        dict.__setitem__(capacity, node_id, _NodeFree(free[node_id], node_id, dirty))
    return capacity


def why_never_fits(workload: Workload, clusters: tuple[Cluster, ...], nodes: tuple[Node, ...]) -> str | None:
    """None if some cluster of the fleet, empty, could hold the gang; else a reason for people."""
    if not clusters:
        return "the fleet has no clusters"
    pools_by_id = {pool.id: pool for cluster in clusters for pool in cluster.pools}
    # A cordon is temporary: a gang that fits the fleet once its nodes come back is not refused.
    whole_fleet = [replace(node, schedulable=True) for node in nodes]
    nodes_by_pool: dict[str, list[Node]] = {}
    for node in whole_fleet:
        nodes_by_pool.setdefault(node.pool_id, []).append(node)
    free = empty_capacity(whole_fleet, pools_by_id)
    pool_of = {node.id: node.pool_id for node in whole_fleet}
    best: Miss | None = None
    for cluster in clusters:
        result = place_in_cluster(workload, cluster, nodes_by_pool, free)
        if not isinstance(result, Miss):
            # place_in_cluster offers a single-pool placement first whenever one exists.
            if workload.same_pool != "required" or len({pool_of[a.node_id] for a in result.assignments}) == 1:
                return None
            continue
        if best is None or result.placed > best.placed:
            best = result
    if best is None:
        return "same_pool is required, but only several node pools together could ever hold this gang"
    return (
        f"no cluster in the fleet could ever hold this gang: it needs {workload.min_available} pods "
        f"placed at once and the best cluster ({best.detail}) holds at most {best.placed} even when empty"
    )


# --- change tracking ------------------------------------------------------------------------------


class _Ledger:
    """What changed in a tracked `FreeCapacity` since the indexes last looked, and the indexes."""

    __slots__ = ("context", "dirty", "trusted")

    def __init__(self) -> None:
        self.dirty: set[str] = set()  # node ids whose free capacity changed
        self.context: _Context | None = None
        # False once whole node entries were replaced: a dict put there is not tracked, so the
        # indexes could go stale; every call then builds fresh ones.
        self.trusted = True


class _TrackedCapacity(dict[str, dict[str, int]]):
    """The `FreeCapacity` of `empty_capacity()`: a plain dict to its users."""

    __slots__ = ("ledger",)

    def __init__(self) -> None:
        super().__init__()
        self.ledger = _Ledger()

    def _untrust(self) -> None:
        self.ledger.trusted = False
        self.ledger.context = None

    def __setitem__(self, key: str, value: dict[str, int]) -> None:
        self._untrust()
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        self._untrust()
        super().__delitem__(key)

    def pop(self, *args: Any) -> Any:
        self._untrust()
        return super().pop(*args)

    def popitem(self) -> tuple[str, dict[str, int]]:
        self._untrust()
        return super().popitem()

    def clear(self) -> None:
        self._untrust()
        super().clear()

    def setdefault(self, *args: Any) -> Any:
        self._untrust()
        return super().setdefault(*args)

    def update(self, *args: Any, **kwargs: Any) -> None:
        self._untrust()
        super().update(*args, **kwargs)

    # `|=` must be tracked too; typeshed's dict pairs it with `__or__` in a way no subclass can
    # restate, hence the ignore.
    def __ior__(self, other: Any) -> Self:  # type: ignore[override,misc]
        self.update(other)
        return self

    def __reduce__(self) -> Any:
        # Copies and pickles are plain dicts: the indexes belong to this object only.
        return (dict, (dict(self),))


class _NodeFree(dict[str, int]):
    """One node's free capacity; every change marks the node dirty for the indexes."""

    __slots__ = ("_dirty", "_node_id")

    def __init__(self, values: Mapping[str, int], node_id: str, dirty: set[str]) -> None:
        super().__init__(values)
        self._node_id = node_id
        self._dirty = dirty

    def __setitem__(self, key: str, value: int) -> None:
        super().__setitem__(key, value)
        self._dirty.add(self._node_id)

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        self._dirty.add(self._node_id)

    def pop(self, *args: Any) -> Any:
        self._dirty.add(self._node_id)
        return super().pop(*args)

    def popitem(self) -> tuple[str, int]:
        self._dirty.add(self._node_id)
        return super().popitem()

    def clear(self) -> None:
        self._dirty.add(self._node_id)
        super().clear()

    def setdefault(self, *args: Any) -> Any:
        self._dirty.add(self._node_id)
        return super().setdefault(*args)

    def update(self, *args: Any, **kwargs: Any) -> None:
        self._dirty.add(self._node_id)
        super().update(*args, **kwargs)

    def __ior__(self, other: Any) -> Self:  # type: ignore[override,misc]  # see _TrackedCapacity.__ior__
        self.update(other)
        return self

    def __reduce__(self) -> Any:
        return (dict, (dict(self),))


# --- indexes --------------------------------------------------------------------------------------


class _PoolIndex:
    """The nodes of one pool bucketed by free GPU slots, each bucket sorted by node id."""

    __slots__ = ("buckets", "counts", "free_of", "keys", "maxima", "negative", "nodes", "pool", "size", "slots")

    def __init__(self, pool: NodePool, nodes: list[Node], free: FreeCapacity) -> None:
        self.pool = pool
        self.nodes = nodes  # the caller's list: a different list means a different layout
        self.size = len(nodes)
        self.free_of: dict[str, dict[str, int]] = {}
        self.slots: dict[str, int] = {}
        self.buckets: dict[int, list[str]] = {}
        # per slot dimension: free amount -> number of nodes with it (for the largest free amount)
        self.counts: dict[str, dict[int, int]] = {}
        self.maxima: dict[str, int] = {}
        self.negative: set[str] = set()  # nodes with a negative slot amount (an over-committed snapshot)
        # Built once per pool per cycle on tracked capacity, but once per call on a plain trial
        # copy: kept to one pass with the slot keys worked out once per key layout.
        free_of, slots_of, buckets, counts = self.free_of, self.slots, self.buckets, self.counts
        layout: object = None
        slot_keys: tuple[str, ...] = ()
        for node in nodes:
            node_id = node.id
            node_free = free[node_id]
            free_of[node_id] = node_free
            keys = node_free.keys()
            if keys != layout:
                layout = keys
                slot_keys = tuple(key for key in node_free if _is_slot(key))
            total = 0
            for key in slot_keys:
                value = node_free[key]
                total += value
                per_value = counts.get(key)
                if per_value is None:
                    per_value = counts[key] = {}
                per_value[value] = per_value.get(value, 0) + 1
                if value < 0:
                    self.negative.add(node_id)
            slots_of[node_id] = total
            bucket = buckets.get(total)
            if bucket is None:
                buckets[total] = [node_id]
            else:
                bucket.append(node_id)
        for bucket in buckets.values():
            bucket.sort()
        self.keys = sorted(buckets)

    def refresh(self, node_id: str, previous: Mapping[str, int]) -> None:
        """Re-file a node whose free capacity changed; `previous` is what the index knew."""
        for key, value in previous.items():
            if _is_slot(key):
                per_value = self.counts[key]
                per_value[value] -= 1
                if not per_value[value]:
                    del per_value[value]
        old = self.slots[node_id]
        bucket = self.buckets[old]
        del bucket[bisect_left(bucket, node_id)]
        if not bucket:
            del self.buckets[old]
            del self.keys[bisect_left(self.keys, old)]
        self.negative.discard(node_id)
        node_free = self.free_of[node_id]
        total = 0
        for key, value in node_free.items():
            if _is_slot(key):
                total += value
                per_value = self.counts.setdefault(key, {})
                per_value[value] = per_value.get(value, 0) + 1
                if value < 0:
                    self.negative.add(node_id)
        self.slots[node_id] = total
        target = self.buckets.get(total)
        if target is None:
            self.buckets[total] = [node_id]
            insort(self.keys, total)
        else:
            insort(target, node_id)
        self.maxima.clear()

    def most_free(self, key: str) -> int:
        """The largest free amount of slot dimension `key` on any node of the pool."""
        found = self.maxima.get(key)
        if found is None:
            per_value = self.counts.get(key, {})
            having = sum(per_value.values())
            found = max(per_value) if per_value else 0
            if having < self.size:  # nodes without the key offer none of it
                found = max(found, 0)
            self.maxima[key] = found
        return found

    def room_for(self, demand: _Demand, wanted: int) -> int:
        """At most how many pods of `demand` the pool's nodes could take (slots only), capped at
        `wanted`."""
        room = wanted
        for key, amount in demand.slot_items:
            if amount > 0:
                fit = 0
                for value, nodes in self.counts.get(key, {}).items():
                    if value >= amount:
                        fit += nodes * (value // amount)
                room = min(room, fit)
        return room

    def best(
        self, demand: tuple[tuple[str, int], ...], need: int, taken: Mapping[str, object]
    ) -> tuple[int, str] | None:
        """(slots left, node id) of the tightest node not in `taken` that fits, or None."""
        keys = self.keys
        # A node that fits has at least `need` free slots, unless some slot amount is negative.
        start = 0 if self.negative else bisect_left(keys, need)
        free_of = self.free_of
        for position in range(start, len(keys)):
            slots = keys[position]
            for node_id in self.buckets[slots]:
                if node_id in taken:
                    continue
                node_free = free_of[node_id]
                for key, amount in demand:
                    if node_free.get(key, 0) < amount:
                        break
                else:
                    return slots - need, node_id
        return None


@dataclass(frozen=True)
class _Demand:
    """What one pod of a pod set takes from a node of one pool."""

    pool_id: str
    items: tuple[tuple[str, int], ...]
    slot_items: tuple[tuple[str, int], ...]  # the GPU-slot part of `items`
    slots: int  # GPU slots it takes in all

    @staticmethod
    def of(pod_set: PodSet, pool: NodePool) -> _Demand | None:
        demand = pod_set.demand_on(pool)
        if demand is None:
            return None
        slot_items = tuple((key, amount) for key, amount in demand.items() if _is_slot(key))
        return _Demand(pool.id, tuple(demand.items()), slot_items, sum(amount for _, amount in slot_items))


@dataclass(frozen=True)
class _Shape:
    """What placement depends on in a workload: gangs of one shape fit or fail alike."""

    pod_sets: tuple[PodSet, ...]
    min_available: int
    requires_isolation: bool
    tolerations: tuple[object, ...]
    no_spot: bool  # spot pools are not candidates

    @staticmethod
    def of(workload: Workload) -> _Shape:
        return _Shape(
            workload.pod_sets,
            workload.min_available,
            workload.requires_isolation,
            workload.tolerations,
            workload.spot == "never",
        )

    @property
    def one_pod(self) -> bool:
        """A gang of one pod (most of a real backlog): best fit is the tightest node of any pool."""
        return len(self.pod_sets) == 1 and self.pod_sets[0].replicas == 1


@dataclass(frozen=True)
class _Plan:
    """A gang shape in one cluster: its candidate pools and the pools it can use at all."""

    cluster: Cluster
    pools: list[NodePool]  # candidate pools (isolation, taints), in the cluster's order
    relevant: tuple[str, ...]  # ids of candidate pools serving at least one of its pod sets


_MemoKey = tuple[object, ...]


class _Context:
    """Indexes over one `FreeCapacity` and one nodes-by-pool layout, plus remembered results.

    Results are remembered per gang shape (per cluster, per pool of a cluster, per fleet) with
    the pools they read; a change to a node of a pool forgets every result that read the pool,
    so an admission in one pool keeps what was found for shapes that pool cannot serve (MIG
    requests and whole-GPU pools, say), and a remembered answer costs one look-up.
    """

    def __init__(self, free: FreeCapacity, nodes_by_pool: Mapping[str, list[Node]], ledger: _Ledger | None) -> None:
        self.free = free
        self.nodes_by_pool = nodes_by_pool
        self.ledger = ledger  # None for untracked capacity: nothing is kept past one call
        self.pools: dict[str, _PoolIndex] = {}
        self.pool_of_node: dict[str, _PoolIndex] = {}
        self.known: dict[str, dict[str, int]] = {}  # node id -> free capacity its index last saw
        self.shape_ids: dict[_Shape, int] = {}
        self.workload_shapes: dict[int, tuple[Workload, _Shape, int]] = {}
        self.plans: dict[tuple[int, int], _Plan] = {}
        self.demands: dict[tuple[int, str], tuple[_Demand | None, ...]] = {}
        # Remembered results; each entry starts with the object it was found for (a cluster or a
        # sequence of clusters), checked by identity since keys hold only its id.
        self.memo: dict[_MemoKey, tuple[object, list[Placement] | Miss]] = {}
        self.fleet_memo: dict[_MemoKey, tuple[object, list[Placement], Miss | None]] = {}
        self.singles: dict[_MemoKey, tuple[object, Placement | Miss]] = {}
        # pool id -> the remembered entries that read it: (store, key), forgotten when it changes
        self.readers: dict[str, list[tuple[dict[_MemoKey, Any], _MemoKey]]] = {}
        self.fleet_readers: dict[str, list[_MemoKey]] = {}  # cluster id -> fleet_memo keys
        self.clusters_of_pool: dict[str, set[str]] = {}  # pool id -> ids of clusters listing it

    # -- bookkeeping ---------------------------------------------------------------------------

    def sync(self) -> None:
        """Re-file the nodes the caller changed since the last call; forget what they change."""
        ledger = self.ledger
        if ledger is None or not ledger.dirty:
            return
        changed: set[str] = set()
        for node_id in ledger.dirty:
            index = self.pool_of_node.get(node_id)
            if index is None:
                continue  # in no index yet: the index will read it when it is built
            changed.add(index.pool.id)
            index.refresh(node_id, self.known[node_id])
            self.known[node_id] = dict(index.free_of[node_id])
        ledger.dirty.clear()
        for pool_id in changed:
            self.forget(pool_id)

    def forget(self, pool_id: str) -> None:
        for store, key in self.readers.pop(pool_id, ()):
            store.pop(key, None)
        # Whole-fleet answers read every cluster: they listen per cluster, a shorter list.
        for cluster_id in self.clusters_of_pool.get(pool_id, ()):
            for key in self.fleet_readers.pop(cluster_id, ()):
                self.fleet_memo.pop(key, None)

    def remember(self, store: dict[_MemoKey, Any], key: _MemoKey, value: object, pool_ids: Iterable[str]) -> None:
        if self.ledger is None:
            return  # untracked capacity may change unseen: nothing outlives the call
        store[key] = value
        for pool_id in pool_ids:
            self.readers.setdefault(pool_id, []).append((store, key))

    def index(self, pool: NodePool) -> _PoolIndex:
        nodes = self.nodes_by_pool.get(pool.id, [])
        found = self.pools.get(pool.id)
        if found is not None and found.nodes is nodes and found.size == len(nodes):
            return found
        if found is not None:
            self.forget(pool.id)  # the caller's layout of the pool changed
        found = self.pools[pool.id] = _PoolIndex(pool, nodes, self.free)
        if self.ledger is not None:
            for node in nodes:
                self.pool_of_node[node.id] = found
                self.known[node.id] = dict(found.free_of[node.id])
        return found

    def shape(self, workload: Workload) -> tuple[_Shape, int]:
        entry = self.workload_shapes.get(id(workload))
        if entry is not None and entry[0] is workload:
            return entry[1], entry[2]
        shape = _Shape.of(workload)
        shape_id = self.shape_ids.setdefault(shape, len(self.shape_ids))
        if self.ledger is not None:
            self.workload_shapes[id(workload)] = (workload, shape, shape_id)
        return shape, shape_id

    def pod_demands(self, shape: _Shape, shape_id: int, pool: NodePool) -> tuple[_Demand | None, ...]:
        """What one pod of each pod set takes from a node of `pool` (None: the pool cannot serve it)."""
        found = self.demands.get((shape_id, pool.id))
        if found is None:
            found = self.demands[(shape_id, pool.id)] = tuple(_Demand.of(ps, pool) for ps in shape.pod_sets)
        return found

    def plan(self, workload: Workload, shape: _Shape, shape_id: int, cluster: Cluster) -> _Plan:
        found = self.plans.get((id(cluster), shape_id))
        if found is None or found.cluster is not cluster:
            pools = candidate_pools(workload, cluster)
            relevant = tuple(
                pool.id for pool in pools if any(d is not None for d in self.pod_demands(shape, shape_id, pool))
            )
            found = self.plans[(id(cluster), shape_id)] = _Plan(cluster, pools, relevant)
            for pool in cluster.pools:
                self.clusters_of_pool.setdefault(pool.id, set()).add(cluster.id)
        return found

    # -- placement -----------------------------------------------------------------------------

    def placements(self, workload: Workload, cluster: Cluster, prefer_same_pool: bool) -> list[Placement] | Miss:
        # The scheduler asks this for every cluster for every pending gang, and in a busy fleet
        # almost every answer is remembered: keep that path short.
        if self.ledger is not None and self.ledger.dirty:
            self.sync()
        entry = self.workload_shapes.get(id(workload))
        if entry is not None and entry[0] is workload:
            shape, shape_id = entry[1], entry[2]
        else:
            shape, shape_id = self.shape(workload)
        memo_key = (id(cluster), shape_id, prefer_same_pool)
        remembered = self.memo.get(memo_key)
        if remembered is not None and remembered[0] is cluster:
            return remembered[1]
        plan = self.plan(workload, shape, shape_id, cluster)
        found = self._placements(shape, shape_id, plan, prefer_same_pool)
        self.remember(self.memo, memo_key, (cluster, found), plan.relevant)
        return found

    def fleet(
        self, workload: Workload, clusters: Sequence[Cluster], prefer_same_pool: bool
    ) -> tuple[list[Placement], Miss | None]:
        if self.ledger is not None and self.ledger.dirty:
            self.sync()
        _, shape_id = self.shape(workload)
        memo_key = (id(clusters), shape_id, prefer_same_pool)
        remembered = self.fleet_memo.get(memo_key)
        if remembered is not None and remembered[0] is clusters:
            return remembered[1], remembered[2]
        placements: list[Placement] = []
        best_miss: Miss | None = None
        for cluster in clusters:
            found = self.placements(workload, cluster, prefer_same_pool)
            if isinstance(found, Miss):
                if best_miss is None or found.placed > best_miss.placed:
                    best_miss = found
            else:
                placements.extend(found)
        if self.ledger is not None:
            self.fleet_memo[memo_key] = (clusters, placements, best_miss)
            for cluster in clusters:
                self.fleet_readers.setdefault(cluster.id, []).append(memo_key)
        return placements, best_miss

    def _placements(self, shape: _Shape, shape_id: int, plan: _Plan, prefer_same_pool: bool) -> list[Placement] | Miss:
        cluster, pools = plan.cluster, plan.pools
        if not pools:
            return Miss(cluster.id, 0, cluster.name)
        fits: list[Placement] = []
        if prefer_same_pool and len(pools) > 1:
            relevant = set(plan.relevant)
            for pool in pools:
                if pool.id not in relevant:
                    continue  # serves none of the pod sets: a single-pool attempt places nothing
                single = self._single(shape, shape_id, cluster, pool)
                if isinstance(single, Placement):
                    fits.append(single)
            fits.sort(key=lambda p: p.leftover_gpu_slots)  # stable: ties keep the pools' order
            if shape.one_pod and shape.min_available == 1:
                # Spread over all pools, one pod lands on the tightest node of any pool: the
                # single-pool placement with the least left over (ties: node id) is that very
                # placement, so the spread adds nothing, and when no pool fits it places none.
                return fits or Miss(cluster.id, 0, cluster.name)
        spread = self._place(shape, shape_id, cluster, pools, exact=True)
        if isinstance(spread, Miss):
            return fits or spread
        if not fits:
            return [spread]
        if not any(p.assignments == spread.assignments for p in fits):
            fits.append(replace(spread, spread=True))
        return fits

    def _single(self, shape: _Shape, shape_id: int, cluster: Cluster, pool: NodePool) -> Placement | Miss:
        """The gang in `pool` alone (exact only when a Placement), remembered per pool version:
        a gang that can use every pool (a CPU-only launcher can) then re-tries only the pool that
        changed."""
        key = (id(cluster), pool.id, shape_id)
        remembered = self.singles.get(key)
        if remembered is not None and remembered[0] is cluster:
            return remembered[1]
        single = self._place(shape, shape_id, cluster, [pool], exact=False)
        self.remember(self.singles, key, (cluster, single), (pool.id,))
        return single

    def place(self, workload: Workload, cluster: Cluster, pools: list[NodePool]) -> Placement | Miss:
        self.sync()
        shape, shape_id = self.shape(workload)
        return self._place(shape, shape_id, cluster, pools, exact=True)

    def _place(
        self, shape: _Shape, shape_id: int, cluster: Cluster, pools: list[NodePool], exact: bool
    ) -> Placement | Miss:
        """Best fit, pod by pod. With `exact` False the result is only right when it is a
        Placement: a Miss may stop early and under-count (callers that drop misses use that)."""
        if shape.one_pod:
            return self._place_one(shape, shape_id, cluster, pools)
        serving = []
        for pool in pools:
            demands = self.pod_demands(shape, shape_id, pool)
            if any(d is not None for d in demands):
                serving.append((self.index(pool), demands))
        if not exact and self._short(shape, serving):
            return Miss(cluster.id, 0, cluster.name)
        trial: dict[str, dict[str, int]] = {}  # copies of the nodes this gang touched
        trial_slots: dict[str, int] = {}
        trial_pool: dict[str, str] = {}
        assignments: list[PodAssignment] = []
        remaining = sum(ps.replicas for ps in shape.pod_sets)
        for set_index, pod_set in enumerate(shape.pod_sets):
            remaining -= pod_set.replicas
            options: list[tuple[_PoolIndex, _Demand]] = []
            for index, demands in serving:
                demand = demands[set_index]
                if demand is None:
                    continue
                for key, amount in demand.slot_items:
                    if index.most_free(key) < amount:
                        break  # no node of the pool has enough of this slot: skip the pool whole
                else:
                    options.append((index, demand))
            if options:
                by_pool = {index.pool.id: demand for index, demand in options}
                self._place_pod_set(pod_set, options, by_pool, trial, trial_slots, trial_pool, assignments)
            if not exact and len(assignments) + remaining < shape.min_available:
                return Miss(cluster.id, len(assignments), cluster.name)
        if len(assignments) < shape.min_available:
            return Miss(cluster.id, len(assignments), cluster.name)
        leftover = sum(trial_slots.values())
        return Placement(cluster.id, tuple(assignments), leftover)

    @staticmethod
    def _short(shape: _Shape, serving: list[tuple[_PoolIndex, tuple[_Demand | None, ...]]]) -> bool:
        """Whether the pools' free slots cannot hold `min_available` of the gang's pods even
        before placing any: then the attempt is a miss without going pod by pod."""
        room = 0
        for set_index, pod_set in enumerate(shape.pod_sets):
            fit = 0
            for index, demands in serving:
                demand = demands[set_index]
                if demand is not None:
                    fit += index.room_for(demand, pod_set.replicas - fit)
                    if fit >= pod_set.replicas:
                        break
            room += fit
        return room < shape.min_available

    def _place_one(self, shape: _Shape, shape_id: int, cluster: Cluster, pools: list[NodePool]) -> Placement | Miss:
        """`_place` for a gang of one pod, without the trial bookkeeping a gang needs."""
        best: tuple[int, str, _Demand] | None = None
        for pool in pools:
            demand = self.pod_demands(shape, shape_id, pool)[0]
            if demand is None:
                continue
            index = self.index(pool)
            for key, amount in demand.slot_items:
                if index.most_free(key) < amount:
                    break
            else:
                found = index.best(demand.items, demand.slots, {})
                if found is not None and (best is None or found < best[:2]):
                    best = (found[0], found[1], demand)
        if best is None:
            if shape.min_available > 0:
                return Miss(cluster.id, 0, cluster.name)
            return Placement(cluster.id, (), 0)
        left, node_id, demand = best
        if shape.min_available > 1:
            return Miss(cluster.id, 1, cluster.name)
        assignment = PodAssignment(shape.pod_sets[0].name, 0, node_id, dict(demand.items))
        return Placement(cluster.id, (assignment,), left)

    def _place_pod_set(
        self,
        pod_set: PodSet,
        options: list[tuple[_PoolIndex, _Demand]],
        by_pool: Mapping[str, _Demand],
        trial: dict[str, dict[str, int]],
        trial_slots: dict[str, int],
        trial_pool: dict[str, str],
        assignments: list[PodAssignment],
    ) -> None:
        demand_dicts: dict[str, dict[str, int]] = {}  # one dict per pool, shared by the set's pods
        untouched: tuple[int, str, _PoolIndex, _Demand] | None = None
        stale = True  # whether `untouched` must be looked up again
        for replica in range(pod_set.replicas):
            best: tuple[int, str] | None = None
            best_demand: _Demand | None = None
            for node_id, node_free in trial.items():
                demand = by_pool.get(trial_pool[node_id])
                if demand is None:
                    continue
                for key, amount in demand.items:
                    if node_free.get(key, 0) < amount:
                        break
                else:
                    candidate = (trial_slots[node_id] - demand.slots, node_id)
                    if best is None or candidate < best:
                        best, best_demand = candidate, demand
            if stale:
                # The best node nobody in this gang took yet stays best until it is taken.
                untouched = None
                for index, demand in options:
                    found = index.best(demand.items, demand.slots, trial)
                    if found is not None and (untouched is None or found < untouched[:2]):
                        untouched = (found[0], found[1], index, demand)
                stale = False
            if untouched is not None and (best is None or untouched[:2] < best):
                _, node_id, index, demand = untouched
                trial[node_id] = dict(index.free_of[node_id])
                trial_slots[node_id] = index.slots[node_id]
                trial_pool[node_id] = index.pool.id
                best, best_demand = untouched[:2], demand
                stale = True
            if best is None or best_demand is None:
                return  # the pods left are identical to this one: none of them fits either
            node_id = best[1]
            node_free = trial[node_id]
            for key, amount in best_demand.items:
                node_free[key] -= amount
            trial_slots[node_id] -= best_demand.slots
            shared = demand_dicts.get(best_demand.pool_id)
            if shared is None:
                shared = demand_dicts[best_demand.pool_id] = dict(best_demand.items)
            assignments.append(PodAssignment(pod_set.name, replica, node_id, shared))


def _context(free: FreeCapacity, nodes_by_pool: Mapping[str, list[Node]]) -> _Context:
    """The indexes for `free`: kept on a tracked capacity, built afresh for any other."""
    if isinstance(free, _TrackedCapacity) and free.ledger.trusted:
        ledger = free.ledger
        context = ledger.context
        if context is None or context.nodes_by_pool is not nodes_by_pool:
            ledger.dirty.clear()  # new indexes read the current values anyway
            context = ledger.context = _Context(free, nodes_by_pool, ledger)
        return context
    return _Context(free, nodes_by_pool, None)
