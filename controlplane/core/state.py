"""The state one scheduling cycle decides on, with its mutation points and a journal.

Free capacity per node (with the placement indexes following it), free gpu-eq, the quota ledger
and the live runs change only through `take` / `give_back` / `hold_live` / `drop_live` and the
reservation holds (`hold_node` / `unhold_node`). Between `checkpoint()` and `rollback()` every such
change is journaled and undone exactly: what-if trials (victim sets, reservations, backfill) run
on the real state and leave nothing behind, instead of on copies restored by hand.

A scheduler that keeps this state across cycles applies its changes through the same points.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Generic, TypeVar

from controlplane.core.capacity import FleetCapacity
from controlplane.core.decision import NeverFits
from controlplane.core.gang_facts import GangFacts, ShapeId
from controlplane.core.gpu_eq import GpuEqUnit, quota_amounts
from controlplane.core.placement import FreeCapacity
from controlplane.core.quota import ZERO, Ledger, Usage
from controlplane.core.snapshot import LiveRun, Policy, Snapshot
from controlplane.core.victim_memo import VictimMemo
from controlplane.domain.model import GPU_EQ, Node, NodePool, PodAssignment

# Journal entries: undo data, replayed newest first.
_FREE = 0  # (_FREE, node dict, key, previous value or None when the key was absent)
_QUOTA = 1  # (_QUOTA, queue id, usage, sign charged)
_LIVE = 2  # (_LIVE, run, None, None): the run was dropped
_STAMP = 3  # (_STAMP, cluster id, its stamp before, None)
_USAGE = 4  # (_USAGE, the usage stamp before, None, None)

# Capacity misses remembered (`CycleState.capacity_misses`) before the memo starts again.
CAPACITY_MISSES_LIMIT = 100_000
# Stamp transitions remembered (`CycleState._stamp`) before they start again.
TRANSITIONS_LIMIT = 200_000
_Entry = tuple[int, Any, Any, Any]


def live_key(run: LiveRun) -> str:
    return run.run_id or run.workload_id


MemoKey = TypeVar("MemoKey")
MemoValue = TypeVar("MemoValue")


class PolicyMemo(Generic[MemoKey, MemoValue]):
    """Answers worked out under one policy (its weights, its preferences), bounded by a reset:
    each cluster's ranked placements of a shape (`fit_parts`, `Fitter.parts_of`) and the cheap
    placement scores (`cheap_scores`, `scoring.py`; their entries keep the placement alive, so
    an id is never reused while remembered)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.policy: object | None = None
        self.entries: dict[MemoKey, MemoValue] = {}

    def reset(self, policy: object) -> None:
        self.policy, self.entries = policy, {}

    def remember(self, key: MemoKey, value: MemoValue) -> None:
        if len(self.entries) >= self.limit:
            self.entries = {}
        self.entries[key] = value


class CycleState:
    """Capacity, quota and live runs of the fleet, as admissions and evictions change them."""

    def __init__(self, snapshot: Snapshot, policy: Policy) -> None:
        self._journal: list[_Entry] = []
        self._open = 0  # checkpoints open: changes are journaled while > 0
        # The one capacity model (capacity.py), shared with submit validation and the autoscaler.
        fleet = self.fleet = FleetCapacity(snapshot.clusters, snapshot.nodes)
        self.pools: dict[str, NodePool] = fleet.pools
        self.pool_of_node = fleet.pool_of_node
        self.nodes_by_pool: dict[str, list[Node]] = fleet.nodes_by_pool
        self.nodes_by_cluster: dict[str, list[str]] = fleet.nodes_by_cluster
        self.free: FreeCapacity = fleet.free
        self.cluster_of_node = {node_id: pool.cluster_id for node_id, pool in fleet.pool_of_node.items()}
        # cluster id -> the stamp of its free capacity: on every change the stamp that change gave
        # the same stamp before, else one never given before (`_stamp`); the one before restored
        # with a rollback; so a stamp names one content of the cluster's free capacity for the
        # state's lifetime, and what was worked out from that content alone holds while the
        # stamp is the same (`capacity_misses`, `fit_parts`).
        self.stamps: dict[str, int] = {}
        self._stamps_given = 0
        # (cluster id, stamp before, change) -> the stamp after (`_stamp`), and the assignment
        # tuples whose ids those changes name (`_run_change`)
        self._transitions: dict[tuple[str, int, tuple[object, ...]], int] = {}
        self._changed: dict[int, tuple[PodAssignment, ...]] = {}
        # The same for the quota ledger's usage as a whole (`usage_stamp`): what is worked out from
        # every queue's usage holds while it is the same.
        self.usage_stamp = 0
        # (shape id, prefer same pool, cluster id, its stamp, live keys of the runs released) of
        # victim sets after whose release the gang still has no room on that cluster's capacity,
        # whatever quota says: asked again, such a trial is skipped (`Evictor`). Kept across
        # cycles with the state; started again past CAPACITY_MISSES_LIMIT.
        self.capacity_misses: set[tuple[object, ...]] = set()
        # (shape id, prefer same pool, cluster id, its stamp, live keys of a due order, whether all
        # were released first) -> how many of those runs must end before the shape has room there
        # (None: not even all): capacity alone, for reservations (`Reservations._shortest`).
        self.room_after: dict[tuple[object, ...], int | None] = {}
        # shape id -> the cluster its last reservation was found on: asked first next time.
        self.reservation_clusters: dict[ShapeId, str] = {}
        self._clusters, self._nodes = snapshot.clusters, snapshot.nodes
        self._empty: FleetCapacity | None = None
        # prefer_same_pool -> shape id -> why no cluster could hold it empty (None: one could); for `Fitter`.
        self.never_fits_memo: dict[bool, dict[ShapeId, NeverFits | None]] = {}
        # (id of a placement, the gang's spot wish) -> (the placement, its cheap score)
        self.cheap_scores: PolicyMemo[tuple[int, str], tuple[object, float]] = PolicyMemo(200_000)
        # (shape id, cluster id, the cluster's capacity stamp) -> its ranked placements, or its Miss
        self.fit_parts: PolicyMemo[tuple[int, str, int], Any] = PolicyMemo(50_000)
        # id(run) -> (run, the units it holds): asked for every eviction attempt's candidates; the
        # run is kept so its id is not reused while remembered (bounded by the state's lifetime).
        self._run_units: dict[int, tuple[LiveRun, Usage]] = {}
        schedulable = [node for nodes in fleet.nodes_by_pool.values() for node in nodes]
        # Quota amounts are integers in this unit (see gpu_eq.py).
        self.unit = GpuEqUnit.for_fleet(self.pools.values(), quota_amounts(snapshot.queue_tree))
        per_pool = {pool.id: self.unit.of_demand(pool.node_capacity(), pool) for pool in self.pools.values()}
        self.capacity: Usage = {}
        for node in schedulable:
            pool = self.pools[node.pool_id]
            amount = per_pool[pool.id]
            self.capacity[GPU_EQ] = self.capacity.get(GPU_EQ, ZERO) + amount
            self.capacity[pool.gpu_model] = self.capacity.get(pool.gpu_model, ZERO) + amount
        self.free_eq: Usage = dict(self.capacity)
        self.facts = GangFacts(self.unit, frozenset(key for key in self.capacity if key != GPU_EQ))
        self.ledger = Ledger(snapshot.queue_tree, self.unit)
        self.live: dict[str, LiveRun] = {}
        self.live_by_queue: dict[str, dict[str, LiveRun]] = {}
        # Bumped whenever the set of live runs changes: what is worked out from it (the order runs
        # are due in, for reservations) holds while it stays.
        self.live_changes = 0
        self.live_listed = 0  # bumped when the live runs are listed anew (`relist_live`): once a cycle
        # (the listing it was worked out from, waiting gang id -> the runs lent its reserved capacity)
        self._lent: tuple[int, dict[str, list[LiveRun]]] = (-1, {})
        # The live runs that declare a minimum runtime (listed with them): only these can be
        # protected from eviction, and in most fleets they are few or none.
        self.min_runtime_runs: list[LiveRun] = []
        # queue id -> bumped whenever a live run of the queue starts, ends, changes or is evicted
        # (never undone: a rollback only makes what was kept for the queue be worked out again).
        self.queue_versions: dict[str, int] = {}
        self.victim_memo = VictimMemo()
        self._list_live(snapshot.live_runs)
        self.hold_live(snapshot.live_runs)
        parents = {node.parent_id for node in snapshot.queue_tree.values()}
        # Leaf queues that keep part of their guarantee back from borrowers.
        self.lenders = sorted(
            node.id for node in snapshot.queue_tree.values() if node.id not in parents and node.lending_limit.amounts
        )
        # (guarantee holder id, GPU model) -> units gangs within that guarantee wait for this
        # cycle on that model: not lent to borrowers until the next cycle (no admit-then-churn).
        self.awaited: dict[tuple[str, str], int] = {}
        self.budget = policy.disruption_budget  # evictions left this cycle
        self.rebalanced = 0  # rebalancing evictions made this cycle

    def empty_fleet(self) -> FleetCapacity:
        """The fleet with nothing running (cordoned nodes left out), built when first asked for."""
        if self._empty is None:
            self._empty = FleetCapacity(self._clusters, self._nodes)
        return self._empty

    def run_units(self, run: LiveRun) -> Usage:
        """The quota units a live run holds (gpu-eq and per GPU model), worked out once per run."""
        found = self._run_units.get(id(run))
        if found is None or found[0] is not run:
            found = self._run_units[id(run)] = (run, self.unit.usage(run.assignments, self.pool_of_node))
        return found[1]

    def begin_cycle(self, policy: Policy) -> None:
        """Reset what one cycle counts, for a state kept across cycles."""
        self.awaited = {}
        self.budget = policy.disruption_budget
        self.rebalanced = 0

    def release_live(self, runs: Iterable[LiveRun]) -> None:
        """Undo `hold_live` for runs that ended (or changed) between cycles: their capacity and
        quota are given back (`relist_live` then forgets them). Usage that drops to zero is removed,
        so the ledger is what a fresh build from the next snapshot would hold (`Ledger.charge`)."""
        per_queue: dict[str, Usage] = {}
        free = self.free
        for run in runs:
            self._bump_queue(run.queue_id)
            stamped = None
            change = self._run_change(run.assignments, -1)
            for a in run.assignments:
                node_free = free.get(a.node_id)
                if node_free is not None:
                    stamped = self._stamp_once(a.node_id, stamped, change)
                    for resource, amount in a.demand.items():
                        node_free[resource] = node_free.get(resource, 0) + amount
            totals = per_queue.setdefault(run.queue_id, {})
            for resource, amount in self.unit.usage(run.assignments, self.pool_of_node).items():
                totals[resource] = totals.get(resource, 0) + amount
        for queue_id, totals in per_queue.items():
            if any(totals.values()):
                self._charge(queue_id, totals, -1)

    def relist_live(self, runs: Iterable[LiveRun]) -> None:
        """List the live runs in this order (the snapshot's), as a fresh build does."""
        self.live = {}
        self.live_by_queue = {}
        self.live_changes += 1
        self.live_listed += 1
        self._list_live(runs)

    def _list_live(self, runs: Iterable[LiveRun]) -> None:
        live, by_queue = self.live, self.live_by_queue
        with_min_runtime: list[LiveRun] = []
        self.min_runtime_runs = with_min_runtime
        for run in runs:
            key = live_key(run)
            live[key] = run
            by_queue.setdefault(run.queue_id, {})[key] = run
            if run.min_runtime_seconds:
                with_min_runtime.append(run)

    def lent_to(self, owner: str) -> list[LiveRun]:
        """The live runs admitted on capacity a reservation held for the waiting gang `owner`
        (`LiveRun.lent_to`): it may take them back. Indexed once per listing of the live runs."""
        if self._lent[0] != self.live_listed:
            lent: dict[str, list[LiveRun]] = {}
            for run in self.live.values():
                if run.lent_to is not None:
                    lent.setdefault(run.lent_to, []).append(run)
            self._lent = (self.live_listed, lent)
        runs = self._lent[1].get(owner)
        return [run for run in runs if live_key(run) in self.live] if runs else []

    # -- mutation points -----------------------------------------------------------------------

    def take(self, assignments: tuple[PodAssignment, ...], queue_id: str, quota: bool = True) -> Usage:
        """Take the capacity of `assignments` (and charge their gpu-eq to the queue's quota: the
        units charged; none without `quota`)."""
        return self._hold(assignments, queue_id, +1, quota)

    def give_back(self, assignments: tuple[PodAssignment, ...], queue_id: str, quota: bool = True) -> Usage:
        """Free the capacity of `assignments` (and refund their gpu-eq to the queue's quota)."""
        return self._hold(assignments, queue_id, -1, quota)

    def give_back_quota(self, runs: Iterable[LiveRun]) -> None:
        """Refund the runs' units to their queues' quota, their capacity left held: the quota half
        of `give_back`, for a what-if that asks quota alone (inside a checkpoint)."""
        per_queue: dict[str, Usage] = {}
        for run in runs:
            totals = per_queue.setdefault(run.queue_id, {})
            for key, amount in self.run_units(run).items():
                totals[key] = totals.get(key, 0) + amount
        for queue_id, totals in per_queue.items():
            if any(totals.values()):
                self._charge(queue_id, totals, -1)

    def drop_live(self, run: LiveRun) -> None:
        """Forget a live run (its capacity is given back separately)."""
        del self.live[live_key(run)]
        del self.live_by_queue[run.queue_id][live_key(run)]
        self.live_changes += 1
        self._bump_queue(run.queue_id)
        if self._open:
            self._journal.append((_LIVE, run, None, None))

    def _bump_queue(self, queue_id: str) -> None:
        self.queue_versions[queue_id] = self.queue_versions.get(queue_id, 0) + 1

    def hold_node(self, node_id: str) -> dict[str, int]:
        """Take everything free on a node out of circulation (a reservation); returns what was taken."""
        node_free = self.free[node_id]
        self._stamp(self.cluster_of_node[node_id], ("hold", node_id))
        held = dict(node_free)
        for key in held:
            self._set(node_free, key, 0)
        return held

    def unhold_node(self, node_id: str, held: dict[str, int]) -> None:
        """Put what a reservation held on a node back into circulation."""
        node_free = self.free[node_id]
        self._stamp(self.cluster_of_node[node_id], ("unhold", node_id, tuple(held.items())))
        for key, amount in held.items():
            self._set(node_free, key, node_free[key] + amount)

    def _stamp(self, cluster_id: str, change: tuple[object, ...]) -> None:
        """The stamp of the cluster's free capacity after `change` (journaled: a rollback restores
        the one before). The same change made to the same stamp leads to the same content, so it
        gets the stamp that change gave before (`_transitions`): a reservation held again on the
        same nodes each cycle, or a trial made again on a cluster, names content already seen,
        and what was worked out for it still serves. Any other change gets a new stamp."""
        before = self.stamps.get(cluster_id, 0)
        if self._open:
            self._journal.append((_STAMP, cluster_id, before, None))
        key = (cluster_id, before, change)
        after = self._transitions.get(key)
        if after is None:
            if len(self._transitions) >= TRANSITIONS_LIMIT:
                self._transitions = {}
            after = self._transitions[key] = self._new_stamp()
        self.stamps[cluster_id] = after

    def _run_change(self, assignments: tuple[PodAssignment, ...], sign: int) -> tuple[object, ...]:
        """A change key for taking (+1) or giving back (-1) these assignments: by identity, the
        tuple kept alive with its key (`_changed`) so its id is never reused while remembered."""
        key = id(assignments)
        kept = self._changed.get(key)
        if kept is not assignments:
            if len(self._changed) >= TRANSITIONS_LIMIT:
                self._changed = {}
                self._transitions = {}  # their keys name ids no longer pinned
            self._changed[key] = assignments
        return (sign, key)

    def _new_stamp(self) -> int:
        """A number never given before, for a cluster's capacity or for the usage."""
        self._stamps_given += 1
        return self._stamps_given

    def _stamp_once(self, node_id: str, stamped: str | None, change: tuple[object, ...]) -> str:
        """Stamp the node's cluster unless it is `stamped` already (a run's pods share one
        cluster: one stamp per run); returns the cluster stamped."""
        cluster_id = self.cluster_of_node[node_id]
        if cluster_id != stamped:
            self._stamp(cluster_id, change)
        return cluster_id

    def remember_room_after(self, key: tuple[object, ...], runs: int | None) -> None:
        if len(self.room_after) >= CAPACITY_MISSES_LIMIT:
            self.room_after = {}
        self.room_after[key] = runs

    def remember_capacity_miss(self, key: tuple[object, ...]) -> None:
        if len(self.capacity_misses) >= CAPACITY_MISSES_LIMIT:
            self.capacity_misses = set()
        self.capacity_misses.add(key)

    def _set(self, node_free: dict[str, int], key: str, value: int) -> None:
        if self._open:
            self._journal.append((_FREE, node_free, key, node_free.get(key)))
        node_free[key] = value

    def _hold(self, assignments: tuple[PodAssignment, ...], queue_id: str, sign: int, quota: bool) -> Usage:
        journal = self._journal if self._open else None
        free = self.free
        stamped = None
        change = self._run_change(assignments, sign)
        for a in assignments:
            node_free = free.get(a.node_id)
            if node_free is not None:
                stamped = self._stamp_once(a.node_id, stamped, change)
                for key, amount in a.demand.items():
                    before = node_free.get(key)
                    if journal is not None:
                        journal.append((_FREE, node_free, key, before))
                    node_free[key] = (before or 0) - sign * amount
        if not quota:
            return {}  # capacity only (a what-if of a reservation): no units to work out
        held = self.unit.usage(assignments, self.pool_of_node)
        self._charge(queue_id, held, sign)
        return held

    def _charge(self, queue_id: str, held: Usage, sign: int) -> None:
        self.ledger.charge(queue_id, held, sign)
        for key, value in held.items():
            self.free_eq[key] = self.free_eq.get(key, ZERO) - sign * value
        if self._open:
            self._journal.append((_QUOTA, queue_id, held, sign))
            self._journal.append((_USAGE, self.usage_stamp, None, None))
        self.usage_stamp = self._new_stamp()

    def hold_live(self, runs: Iterable[LiveRun]) -> None:
        """`take` for every live run at once: capacity per node, then quota once per queue.

        Every cycle starts here: a demand's units are worked out once per (pool, demand)."""
        free, pool_of_node, unit = self.free, self.pool_of_node, self.unit
        whole_gpu = unit.per_gpu
        units_of: dict[tuple[str, tuple[tuple[str, int], ...]], int] = {}
        per_queue: dict[str, Usage] = {}
        for run in runs:
            self._bump_queue(run.queue_id)
            totals = per_queue.setdefault(run.queue_id, {})
            stamped = None
            change = self._run_change(run.assignments, +1)
            for a in run.assignments:
                demand = a.demand
                node_free = free.get(a.node_id)
                if node_free is not None:
                    stamped = self._stamp_once(a.node_id, stamped, change)
                    for key, amount in demand.items():
                        node_free[key] = node_free.get(key, 0) - amount
                pool = pool_of_node[a.node_id]
                whole = demand.get("gpu", 0)
                if whole and len(demand) == 3:  # cpu, mem and whole GPUs: the common case
                    amount_eq = whole * whole_gpu
                else:
                    signature = (pool.id, tuple(demand.items()))
                    found = units_of.get(signature)
                    if found is None:
                        found = units_of[signature] = unit.of_demand(demand, pool)
                    amount_eq = found
                if amount_eq:
                    totals[GPU_EQ] = totals.get(GPU_EQ, 0) + amount_eq
                    totals[pool.gpu_model] = totals.get(pool.gpu_model, 0) + amount_eq
        for queue_id, totals in per_queue.items():
            if totals:
                self._charge(queue_id, totals, +1)

    # -- journal -------------------------------------------------------------------------------

    def checkpoint(self) -> int:
        """Start journaling; the mark to roll back (or keep) up to. Checkpoints nest."""
        self._open += 1
        return len(self._journal)

    def rollback(self, mark: int) -> None:
        """Undo every change since `mark` and close its checkpoint."""
        journal = self._journal
        while len(journal) > mark:
            what, first, second, third = journal.pop()
            if what == _FREE:
                if third is None:
                    del first[second]
                else:
                    first[second] = third
            elif what == _QUOTA:
                self.ledger.charge(first, second, -third)
                for key, value in second.items():
                    self.free_eq[key] = self.free_eq.get(key, ZERO) + third * value
            elif what == _STAMP:
                self.stamps[first] = second
            elif what == _USAGE:
                self.usage_stamp = first
            else:
                run: LiveRun = first
                self.live_changes += 1
                self.live[live_key(run)] = run
                self.live_by_queue.setdefault(run.queue_id, {})[live_key(run)] = run
        self._close()

    def keep(self, mark: int) -> None:
        """Close the checkpoint at `mark`, keeping its changes (an enclosing one may still undo them)."""
        self._close()
        if not self._open:
            del self._journal[mark:]

    def _close(self) -> None:
        assert self._open > 0, "no checkpoint open"
        self._open -= 1
        if not self._open:
            self._journal.clear()
