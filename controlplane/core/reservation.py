"""Reservations: the head of a queue that finds no room holds the nodes that free up first.

Work behind it backfills there only if its declared `max_runtime_seconds` ends before the
reservation is due, so a stream of small jobs cannot starve a large gang. The rest of the time the
held capacity is lent, not left idle: a preemptible gang whose minimum runtime ends by then may
run there (`Admission.lent_to`), and the owner takes it back (eviction kind `take-back`) when
that makes room for it; its later searches count what it lent as free. Nothing is held waiting
for a run that has no declared end and may not be evicted (non-preemptible): it may never end.
Nor does a gang that would borrow hold capacity other queues' unused guarantees need: that idle
guarantee is lent to borrowers (reclaimable later), unless `Policy.reserve_idle_guarantee`. Finding the nodes is a
what-if on the cycle's state (live runs released in the order they are due, inside a checkpoint
that is rolled back); holding them takes their free capacity out of circulation for the cycle.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from controlplane.core.decision import ReservationNote
from controlplane.core.fit import Fitter
from controlplane.core.placement import FreeCapacity, Placement, copy_capacity
from controlplane.core.prefix_search import shortest_fitting_prefix
from controlplane.core.snapshot import LiveRun, Policy, Snapshot
from controlplane.core.state import CycleState, live_key
from controlplane.domain.model import GPU_EQ, Cluster, Workload


@dataclass
class Reservation:
    owner: str
    cluster_id: str
    held: dict[str, dict[str, int]]  # node id -> the free capacity taken out of circulation
    due: datetime | None  # when the work it waits for has declared it will be gone


# cluster id -> its live runs in the order they are due to end, and the declared ends of the first
DueOrder = dict[str, tuple[list[LiveRun], list[datetime]]]
RoomKey = tuple[object, ...]


class Reservations:
    def __init__(self, snapshot: Snapshot, policy: Policy, now: datetime, state: CycleState, fitter: Fitter) -> None:
        self.clusters = snapshot.clusters
        self.by_id = {cluster.id: cluster for cluster in snapshot.clusters}
        # (the state's listing of live runs, the order then), and (its live changes, the order
        # of the runs still live then)
        self._order: tuple[int, DueOrder] | None = None
        self._live_order: tuple[int, DueOrder] = (-1, {})
        self.policy = policy
        self.now = now
        self.state = state
        self.fitter = fitter
        self.held: list[Reservation] = []
        self.by_queue: dict[str, ReservationNote] = {}  # queue id -> the reservation its head holds
        # owner id -> (its cluster's stamp then, that cluster's nodes, their free capacity with what
        # it holds put back)
        self._held_views: dict[str, tuple[int, list[str], FreeCapacity]] = {}

    def reserve(self, workload: Workload) -> ReservationNote | None:
        """The reservation the gang holds (or its queue's head holds) after this, if any.

        The nodes held are those of the cluster where the gang fits soonest as runs end in the
        order they are due: the earliest declared end; failing that (it waits for runs with no
        declared end too), the fewest runs waited for; then the cluster id. Clusters are searched
        by branch and bound: once one answers, another is asked only with the runs that could
        still beat it released, and one probe with all of those says whether it can."""
        if workload.queue_id in self.by_queue:
            return self.by_queue[workload.queue_id]
        if len(self.held) >= self.policy.max_reservations:
            return None
        state = self.state
        # What it lent in earlier cycles it takes back whenever it needs: that capacity counts as
        # free for its search (and those runs not among those it waits for).
        lent = state.lent_to(workload.id)
        mark = state.checkpoint()
        try:
            for run in lent:
                state.give_back(run.assignments, run.queue_id, quota=False)
            best = self._soonest(workload, _without_runs(self._due_order(), lent))
        finally:
            state.rollback(mark)
        if best is None:
            return None
        unknown, due, _, cluster_id, placement = best
        state.reservation_clusters[state.facts.shape_id(workload)] = cluster_id
        nodes = sorted({a.node_id for a in placement.assignments})
        if self._would_hold_idle_guarantee(workload, nodes):
            return None
        # Held: nobody else may take what is free there now.
        held = {node_id: state.hold_node(node_id) for node_id in nodes}
        self.held.append(Reservation(workload.id, cluster_id, held, None if unknown else due))
        cluster_name = next((c.name for c in self.clusters if c.id == cluster_id), cluster_id)
        note = ReservationNote(len(nodes), cluster_name, workload.name, None if unknown else due)
        self.by_queue[workload.queue_id] = note
        return note

    def _soonest(self, workload: Workload, order: DueOrder) -> tuple[bool, datetime, int, str, Placement] | None:
        """(whether it waits for runs with no declared end, when it fits, the runs waited for, the
        cluster, the placement then) where the gang fits soonest, or None."""
        state = self.state
        shape = state.facts.shape_id(workload)
        # The answer does not depend on the order clusters are searched in (ties go by cluster
        # id), but the bound prunes more once a good one is found: the cluster where this shape's
        # last search ended is asked first.
        last = state.reservation_clusters.get(shape)
        clusters = sorted(self.clusters, key=lambda cluster: cluster.id != last) if last else self.clusters
        best: tuple[bool, datetime, int, str, Placement] | None = None
        for cluster in clusters:
            runs, ends = order.get(cluster.id, ([], []))
            if best is not None:
                unknown, due, count, cluster_id, _ = best
                if not unknown:
                    runs = runs[: bisect_right(ends, due)]  # only those due by then may beat it
                else:  # any declared end beats it, or fewer runs waited for (the same: a lower id)
                    runs = runs[: max(len(ends), count if cluster.id < cluster_id else count - 1)]

            # Once one answered, most clusters cannot beat it: one probe says so.
            shortest = self._shortest(workload, cluster, runs, all_first=best is not None)
            if shortest is None:
                continue
            count, found = shortest
            unknown = count > len(ends)
            candidate = (unknown, self.now if unknown else ends[count - 1], count, cluster.id, found)
            if best is None or candidate[:4] < best[:4]:
                best = candidate
        return best

    def _shortest(
        self, workload: Workload, cluster: Cluster, runs: list[LiveRun], all_first: bool
    ) -> tuple[int, Placement] | None:
        """The fewest of `runs` (a prefix) that must end before the gang has a placement on the
        cluster that passes every quota rule, with that placement; None when all are not enough.

        Capacity first: the shortest prefix after which the cluster has room at all is kept with
        the state (`CycleState.room_after`) under the cluster's capacity stamp and the runs, so a
        head that asks every cycle on a cluster that did not change releases nothing there (most
        clusters cannot beat the best one found, and say so from the memo). No placement passes
        quota on less capacity, so when the one found at that prefix passes, that prefix is the
        answer; when quota blocks it there, the search is made again with quota in every probe."""
        state = self.state

        def release(run: LiveRun) -> None:
            state.give_back(run.assignments, run.queue_id, quota=False)

        def probe() -> Placement | None:
            found = self.fitter.place(workload, clusters=(cluster,))
            return found if isinstance(found, Placement) else None

        def has_room() -> bool | None:
            return True if self.fitter.has_room(workload, cluster) else None

        key = self._room_key(workload, cluster, runs, all_first)
        if key in state.room_after:
            fits_at = state.room_after[key]
        else:
            found = shortest_fitting_prefix(state, runs, release, has_room, all_first)
            fits_at = None if found is None else found[0]
            state.remember_room_after(key, fits_at)
        if fits_at is None:
            return None
        mark = state.checkpoint()
        try:
            for run in runs[:fits_at]:
                release(run)
            placed = probe()
        finally:
            state.rollback(mark)
        if placed is not None:
            return fits_at, placed
        return shortest_fitting_prefix(state, runs, release, probe, all_first)

    def _room_key(self, workload: Workload, cluster: Cluster, runs: list[LiveRun], all_first: bool) -> RoomKey:
        """What the capacity part of `_shortest` reads: the shape, the cluster's capacity (its
        stamp) and the runs released, in order."""
        state = self.state
        return (
            state.facts.shape_id(workload),
            self.policy.prefer_same_pool,
            cluster.id,
            state.stamps.get(cluster.id, 0),
            tuple(live_key(run) for run in runs),
            all_first,
        )

    def _due_order(self) -> DueOrder:
        """Each cluster's live runs in the order they are due to end, with the declared ends of
        those that have one (they come first, ascending). A run with no declared end that nothing
        may evict may hold its capacity forever: nodes are never held waiting for it.

        Sorted once per listing of the live runs (a cycle); a run evicted since (nothing joins
        them within a cycle) is left out on the way."""
        state = self.state
        if self._order is None or self._order[0] != state.live_listed:
            self._order = (state.live_listed, self._sorted_due_order())
            self._live_order = (state.live_changes, self._order[1])
        if self._live_order[0] != state.live_changes:
            live, kept = state.live, {}
            for cluster_id, (runs, ends) in self._order[1].items():
                known = [(run, end) for run, end in zip(runs, ends, strict=False) if live_key(run) in live]
                rest = [run for run in runs[len(ends) :] if live_key(run) in live]
                kept[cluster_id] = ([run for run, _ in known] + rest, [end for _, end in known])
            self._live_order = (state.live_changes, kept)
        return self._live_order[1]

    def _sorted_due_order(self) -> DueOrder:
        known: dict[str, list[tuple[datetime, str, str, LiveRun]]] = {}
        endless: dict[str, list[tuple[str, str, LiveRun]]] = {}
        for run in self.state.live.values():
            if run.cluster_id not in self.by_id:
                continue
            end = run.ends_by()
            if end is not None:
                known.setdefault(run.cluster_id, []).append((end, run.run_id, run.workload_id, run))
            elif run.preemptible:
                endless.setdefault(run.cluster_id, []).append((run.run_id, run.workload_id, run))
        per_cluster: DueOrder = {}
        for cluster_id in known.keys() | endless.keys():
            due = sorted(known.get(cluster_id, ()), key=lambda item: item[:3])
            rest = sorted(endless.get(cluster_id, ()), key=lambda item: item[:2])
            runs = [item[3] for item in due] + [item[2] for item in rest]
            per_cluster[cluster_id] = (runs, [item[0] for item in due])
        return per_cluster

    def _would_hold_idle_guarantee(self, workload: Workload, nodes: list[str]) -> bool:
        """Whether holding the free capacity of `nodes` for a gang that would borrow leaves less
        free than other queues' unused guarantees: that idle guarantee is lent to borrowers
        instead (reclaimable later), unless the policy reserves it."""
        state = self.state
        ledger = state.ledger
        if self.policy.reserve_idle_guarantee:
            return False
        if ledger.within_shared_guarantee(workload.queue_id, {GPU_EQ: state.facts.least(workload)}):
            return False
        idle = ledger.idle_guarantee(excluding=workload.queue_id)
        if not idle:
            return False
        held: dict[str, int] = {}
        for node_id in nodes:
            pool = state.pool_of_node[node_id]
            amount = state.unit.of_demand(state.free[node_id], pool)
            held[GPU_EQ] = held.get(GPU_EQ, 0) + amount
            held[pool.gpu_model] = held.get(pool.gpu_model, 0) + amount
        return any(state.free_eq.get(key, 0) - held.get(key, 0) < amount for key, amount in idle.items())

    def backfill(self, workload: Workload, admit: Callable[[Workload, Placement, str | None], None]) -> bool:
        """Admit a gang on reserved nodes: when its declared runtime ends before they are due;
        failing that, lent (`_may_borrow`), to be taken back by the gang they are held for."""
        if workload.max_runtime_seconds is not None:
            ends = self.now + timedelta(seconds=workload.max_runtime_seconds)
            ending = [r for r in self.held if r.due is not None and ends <= r.due]
            if self._backfill_on(workload, ending, admit, lent=False):
                return True
        return self._backfill_on(workload, [r for r in self.held if self._may_borrow(workload, r)], admit, lent=True)

    def _may_borrow(self, workload: Workload, reservation: Reservation) -> bool:
        """Whether the gang may run on what the reservation holds until its owner takes it back:
        it may be evicted (preemptible), and its minimum runtime, counted from now, ends by the
        time the reservation is due (none at all when that time is unknown)."""
        if not self.policy.lend_reserved or not workload.preemptible:
            return False
        if not workload.min_runtime_seconds:
            return True
        due = reservation.due
        return due is not None and self.now + timedelta(seconds=workload.min_runtime_seconds) <= due

    def _with_held(self, reservation: Reservation) -> FreeCapacity:
        """The free capacity of the reservation's cluster with what it holds put back: a tracked
        copy kept for the cycle, so a shape's answer there is searched once while that cluster's
        capacity stays as it was (its stamp); when it moves, the nodes that differ are brought up
        to date in place (a few, after an admission or a new hold)."""
        state = self.state
        stamp = state.stamps.get(reservation.cluster_id, 0)
        found = self._held_views.get(reservation.owner)
        if found is not None and found[0] == stamp:
            return found[2]
        if found is None:
            cluster = self.by_id[reservation.cluster_id]
            nodes = [node.id for pool in cluster.pools for node in state.nodes_by_pool.get(pool.id, ())]
            view = copy_capacity(state.free, nodes)
        else:
            nodes, view = found[1], found[2]
        held = reservation.held
        for node_id in nodes:
            want = state.free[node_id]
            if node_id in held:
                extra = held[node_id]
                want = {key: want.get(key, 0) + extra.get(key, 0) for key in want.keys() | extra.keys()}
            have = view[node_id]
            if have != want:
                for key in [key for key in have if key not in want]:
                    del have[key]
                for key, value in want.items():
                    if have.get(key) != value:
                        have[key] = value
        self._held_views[reservation.owner] = (stamp, nodes, view)
        return view

    def _backfill_on(
        self,
        workload: Workload,
        reservations: list[Reservation],
        admit: Callable[[Workload, Placement, str | None], None],
        lent: bool,
    ) -> bool:
        state = self.state
        for reservation in reservations:
            # The gang found no room anywhere: only what the reservation holds can make some, on
            # its cluster. Asked on a copy first, so a trial that fails leaves the cycle's own
            # capacity (and the placements remembered on it) untouched.
            only = (self.by_id[reservation.cluster_id],)
            if not isinstance(self.fitter.place(workload, self._with_held(reservation), only, False), Placement):
                continue
            trial = state.checkpoint()
            try:
                for node_id, amounts in reservation.held.items():
                    state.unhold_node(node_id, amounts)
                placement = self.fitter.place(workload, clusters=only, use_cache=False)
            except BaseException:
                state.rollback(trial)
                raise
            if not isinstance(placement, Placement):
                state.rollback(trial)
                continue
            admit(workload, placement, reservation.owner if lent else None)
            for node_id in reservation.held:  # hold again what is still free there
                reservation.held[node_id] = state.hold_node(node_id)
            state.keep(trial)
            return True
        return False


def _without_runs(order: DueOrder, runs: list[LiveRun]) -> DueOrder:
    """The due order without these runs (each cluster's declared ends kept aligned with its runs)."""
    if not runs:
        return order
    gone = {live_key(run) for run in runs}
    kept = dict(order)
    for cluster_id in {run.cluster_id for run in runs} & order.keys():
        in_order, ends = order[cluster_id]
        staying = [i for i, run in enumerate(in_order) if live_key(run) not in gone]
        kept[cluster_id] = ([in_order[i] for i in staying], [ends[i] for i in staying if i < len(ends)])
    return kept
