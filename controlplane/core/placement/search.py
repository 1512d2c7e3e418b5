"""Best-fit gang search over the indexes, with answers remembered per shape until a pool changes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from controlplane.core.placement.index import Demand, GangShape, Plan, PoolIndex
from controlplane.core.placement.tracking import Changes, TrackedCapacity
from controlplane.core.placement.types import FreeCapacity, Miss, Placement, candidate_pools
from controlplane.domain.model import Cluster, Node, NodePool, PodAssignment, PodSet, Workload

MemoKey = tuple[object, ...]


class SearchContext:
    """Indexes over one `FreeCapacity` and one nodes-by-pool layout, plus remembered results.

    Results are remembered per gang shape (per cluster, per pool of a cluster, per fleet) with
    the pools they read; a change to a node of a pool forgets every result that read the pool,
    so an admission in one pool keeps what was found for shapes that pool cannot serve (MIG
    requests and whole-GPU pools, say), and a remembered answer costs one look-up.
    """

    def __init__(self, free: FreeCapacity, nodes_by_pool: Mapping[str, list[Node]], ledger: Changes | None) -> None:
        self.free = free
        self.nodes_by_pool = nodes_by_pool
        self.ledger = ledger  # None for untracked capacity: nothing is kept past one call
        self.pools: dict[str, PoolIndex] = {}
        self.pool_of_node: dict[str, PoolIndex] = {}
        self.known: dict[str, dict[str, int]] = {}  # node id -> free capacity its index last saw
        self.shape_ids: dict[GangShape, int] = {}
        self.workload_shapes: dict[int, tuple[Workload, GangShape, int]] = {}
        self.plans: dict[tuple[int, int], Plan] = {}
        self.demands: dict[tuple[int, str], tuple[Demand | None, ...]] = {}
        # Remembered results; each entry starts with the object it was found for (a cluster or a
        # sequence of clusters), checked by identity since keys hold only its id.
        self.memo: dict[MemoKey, tuple[object, list[Placement] | Miss]] = {}
        self.fleet_memo: dict[MemoKey, tuple[object, list[Placement], Miss | None]] = {}
        self.singles: dict[MemoKey, tuple[object, Placement | Miss]] = {}
        # pool id -> the remembered entries that read it: (store, key), forgotten when it changes
        self.readers: dict[str, list[tuple[dict[MemoKey, Any], MemoKey]]] = {}
        self.fleet_readers: dict[str, list[MemoKey]] = {}  # cluster id -> fleet_memo keys
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

    def remember(self, store: dict[MemoKey, Any], key: MemoKey, value: object, pool_ids: Iterable[str]) -> None:
        if self.ledger is None:
            return  # untracked capacity may change unseen: nothing outlives the call
        store[key] = value
        for pool_id in pool_ids:
            self.readers.setdefault(pool_id, []).append((store, key))

    def index(self, pool: NodePool) -> PoolIndex:
        nodes = self.nodes_by_pool.get(pool.id, [])
        found = self.pools.get(pool.id)
        if found is not None and found.nodes is nodes and found.size == len(nodes):
            return found
        if found is not None:
            self.forget(pool.id)  # the caller's layout of the pool changed
        found = self.pools[pool.id] = PoolIndex(pool, nodes, self.free)
        if self.ledger is not None:
            for node in nodes:
                self.pool_of_node[node.id] = found
                self.known[node.id] = dict(found.free_of[node.id])
        return found

    def shape(self, workload: Workload) -> tuple[GangShape, int]:
        entry = self.workload_shapes.get(id(workload))
        if entry is not None and entry[0] is workload:
            return entry[1], entry[2]
        shape = GangShape.of(workload)
        shape_id = self.shape_ids.setdefault(shape, len(self.shape_ids))
        if self.ledger is not None:
            self.workload_shapes[id(workload)] = (workload, shape, shape_id)
        return shape, shape_id

    def pod_demands(self, shape: GangShape, shape_id: int, pool: NodePool) -> tuple[Demand | None, ...]:
        """What one pod of each pod set takes from a node of `pool` (None: the pool cannot serve it)."""
        found = self.demands.get((shape_id, pool.id))
        if found is None:
            found = self.demands[(shape_id, pool.id)] = tuple(Demand.of(ps, pool) for ps in shape.pod_sets)
        return found

    def plan(self, workload: Workload, shape: GangShape, shape_id: int, cluster: Cluster) -> Plan:
        found = self.plans.get((id(cluster), shape_id))
        if found is None or found.cluster is not cluster:
            pools = candidate_pools(workload, cluster)
            relevant = tuple(
                pool.id for pool in pools if any(d is not None for d in self.pod_demands(shape, shape_id, pool))
            )
            found = self.plans[(id(cluster), shape_id)] = Plan(cluster, pools, relevant)
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

    def _placements(
        self, shape: GangShape, shape_id: int, plan: Plan, prefer_same_pool: bool
    ) -> list[Placement] | Miss:
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
        if isinstance(spread, Miss) and not fits:
            spread = self._gpu_pods_first(shape, cluster, pools) or spread
        if isinstance(spread, Miss):
            return fits or spread
        if not fits:
            return [spread]
        if not any(p.assignments == spread.assignments for p in fits):
            fits.append(replace(spread, spread=True))
        return fits

    def _gpu_pods_first(self, shape: GangShape, cluster: Cluster, pools: list[NodePool]) -> Placement | None:
        """Best fit pod by pod is greedy: a CPU-only launcher placed first may take the CPU its own
        GPU workers need on the only node with their GPUs, when another pool's node had room for it.
        After such a miss, the GPU pod sets go first (assignments keep the gang's pod-set order)."""
        order = sorted(range(len(shape.pod_sets)), key=lambda i: not _needs_gpu(shape.pod_sets[i]))
        if order == sorted(order):
            return None  # already GPU pods first: the same attempt again would miss again
        reordered = replace(shape, pod_sets=tuple(shape.pod_sets[i] for i in order))
        reordered_id = self.shape_ids.setdefault(reordered, len(self.shape_ids))
        found = self._place(reordered, reordered_id, cluster, pools, exact=True)
        if isinstance(found, Miss):
            return None
        rank = {ps.name: i for i, ps in enumerate(shape.pod_sets)}
        return replace(found, assignments=tuple(sorted(found.assignments, key=lambda a: (rank[a.pod_set], a.index))))

    def _single(self, shape: GangShape, shape_id: int, cluster: Cluster, pool: NodePool) -> Placement | Miss:
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
        self, shape: GangShape, shape_id: int, cluster: Cluster, pools: list[NodePool], exact: bool
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
            options: list[tuple[PoolIndex, Demand]] = []
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
        if len(assignments) < shape.min_available or not _meets_minimums(shape, assignments):
            return Miss(cluster.id, len(assignments), cluster.name)
        leftover = sum(trial_slots.values())
        return Placement(cluster.id, tuple(assignments), leftover)

    @staticmethod
    def _short(shape: GangShape, serving: list[tuple[PoolIndex, tuple[Demand | None, ...]]]) -> bool:
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

    def _place_one(self, shape: GangShape, shape_id: int, cluster: Cluster, pools: list[NodePool]) -> Placement | Miss:
        """`_place` for a gang of one pod, without the trial bookkeeping a gang needs."""
        best: tuple[int, str, Demand] | None = None
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
        options: list[tuple[PoolIndex, Demand]],
        by_pool: Mapping[str, Demand],
        trial: dict[str, dict[str, int]],
        trial_slots: dict[str, int],
        trial_pool: dict[str, str],
        assignments: list[PodAssignment],
    ) -> None:
        demand_dicts: dict[str, dict[str, int]] = {}  # one dict per pool, shared by the set's pods
        untouched: tuple[int, str, PoolIndex, Demand] | None = None
        stale = True  # whether `untouched` must be looked up again
        for replica in range(pod_set.replicas):
            best: tuple[int, str] | None = None
            best_demand: Demand | None = None
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


def search_context(free: FreeCapacity, nodes_by_pool: Mapping[str, list[Node]]) -> SearchContext:
    """The indexes for `free`: kept on a tracked capacity, built afresh for any other."""
    if isinstance(free, TrackedCapacity) and free.ledger.trusted:
        ledger = free.ledger
        context = ledger.context
        if not isinstance(context, SearchContext) or context.nodes_by_pool is not nodes_by_pool:
            ledger.dirty.clear()  # new indexes read the current values anyway
            context = ledger.context = SearchContext(free, nodes_by_pool, ledger)
        return context
    return SearchContext(free, nodes_by_pool, None)


def _meets_minimums(shape: GangShape, assignments: list[PodAssignment]) -> bool:
    """Whether every pod set got its minimum, for a gang asked as it is with pod-set minimums (a
    set without one needs all its replicas); `capacity.fits` asks at fixed counts instead, see
    partial.py. A gang without minimums only needs `min_available` pods in all."""
    if all(ps.min_replicas is None for ps in shape.pod_sets):
        return True
    placed = Counter(a.pod_set for a in assignments)
    return all(placed[ps.name] >= ps.least for ps in shape.pod_sets)


def _needs_gpu(pod_set: PodSet) -> bool:
    return bool(pod_set.gpus or pod_set.mig_profile or pod_set.gpu_fraction)
