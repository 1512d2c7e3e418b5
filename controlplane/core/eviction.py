"""Making room by stopping live runs: taking back lent reserved capacity, idle reclaim, reclaim,
preemption and rebalancing.

Every eviction is a what-if first: candidates are released on the cycle's state inside a
checkpoint, one by one, until the gang fits and the kind's rule holds; the set is then minimised
(no victim can be dropped) and the trial rolled back. Only the best set (fewest victims, over the
clusters) is then evicted for real. Victims are whole gangs; non-preemptible runs and runs younger
than their class's minimum runtime are never taken; the disruption budget bounds a cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime, timedelta

from controlplane.core.decision import Eviction, EvictionKind
from controlplane.core.fit import Fitter
from controlplane.core.gang_facts import ShapeId
from controlplane.core.ordering import FairShare
from controlplane.core.placement import Placement
from controlplane.core.prefix_search import shortest_fitting_prefix
from controlplane.core.snapshot import LiveRun, Policy, Snapshot
from controlplane.core.state import CycleState, live_key
from controlplane.domain.model import GPU_EQ, Cluster, Workload

# Kinds whose victims may be taken whatever was released before them (no rule reads the quota
# they give back): the gang's own placement, which passes every quota rule, is the whole test.
_RELEASE_ANY_ORDER = (EvictionKind.PREEMPT, EvictionKind.IDLE, EvictionKind.TAKE_BACK)


class Evictor:
    def __init__(
        self,
        snapshot: Snapshot,
        policy: Policy,
        now: datetime,
        state: CycleState,
        fitter: Fitter,
        fair_share: FairShare,
        capacity_grew: Callable[[], None],
    ) -> None:
        self.snapshot = snapshot
        self.policy = policy
        self.now = now
        self.state = state
        self.fitter = fitter
        self.fair_share = fair_share
        self.capacity_grew = capacity_grew  # told after every real eviction
        self.evictions: list[Eviction] = []
        # Attempts that found no victim set: they fail again until capacity grows.
        self.failed: set[tuple[EvictionKind, bool, str, int, ShapeId]] = set()
        # Per run (by `live_key`): its place in the victim order (kept while the run is the same
        # object) and, once a cycle, when its minimum runtime stops protecting it (`now` moves).
        self._memo = state.victim_memo
        self._order_keys = self._memo.order_keys_for(len(state.live))
        self._protection: dict[str, datetime | None] = {}
        self._protecting: bool | None = None  # see `_any_protected`
        self._sorted: dict[str, list[LiveRun]] = {}  # queue id -> its live runs in the victim order
        self._idle: list[LiveRun] | None = None  # the live runs idle enough to reclaim, in that order
        self._merges: dict[tuple[str, ...], list[LiveRun]] = {}  # see `_merged`
        self._eligible_of: dict[tuple[int, bool], tuple[list[LiveRun], list[LiveRun]]] = {}  # see `_eligible`
        # Until an eviction: candidates per what they depend on (`_candidates`), and per candidate
        # list (by identity, the list kept alive) its runs per cluster and the clusters where a
        # minimum runtime protects one of them.
        self._candidates_of: dict[tuple[object, ...], list[LiveRun]] = {}
        # Workloads with a live run at the start of the cycle: only such a gang (requeued while its
        # run still holds capacity) can find its own run among the candidates.
        self._running: set[str] | None = None
        # (the state's usage stamp, the queues whose work runs on borrowed capacity then)
        self._borrowers: tuple[int, list[str]] = (-1, [])
        self._grouped: dict[int, tuple[list[LiveRun], list[tuple[str, list[LiveRun]]], set[str] | None]] = {}

    def forget_failures(self) -> None:
        self.failed.clear()

    def rebalance_open(self) -> bool:
        policy = self.policy
        if not policy.rebalance or self.state.rebalanced >= policy.rebalance_max_per_cycle:
            return False
        last = self.snapshot.last_rebalance_at
        return last is None or (self.now - last).total_seconds() >= policy.rebalance_interval_seconds

    def make_room(self, workload: Workload, kind: EvictionKind, combined: bool = False) -> Placement | None:
        """Evict the fewest runs of `kind` that let the gang fit; its placement on the freed
        capacity, or None (nothing evicted) when no allowed set of victims makes room.

        `combined` (with kind RECLAIM): when neither preemption nor reclaim alone made room, one
        set may mix lower-priority runs of the gang's own queue (preempted) with borrowed runs of
        other queues (reclaimed); each victim keeps its kind's rules, and with any reclaimed victim
        the gang must end within its guarantee."""
        if self.state.budget <= 0:
            return None
        # Within a cycle, capacity and candidates only shrink until an eviction happens: an attempt
        # that failed for this shape, queue and priority fails again. (A queue that starts
        # borrowing through this cycle's admissions becomes reclaimable from the next cycle.)
        attempt = (kind, combined, workload.queue_id, workload.priority, self.state.facts.shape_id(workload))
        if attempt in self.failed:
            return None
        if combined:
            own = self._candidates(workload, EvictionKind.PREEMPT)
            if not self._within_guarantee_without(workload, own):
                # A set with a reclaimed victim must leave the gang within its guarantee, and even
                # with every run it may preempt gone it would not be; a set without one is the
                # preemption the cycle tried just before (`Cycle._decide`), which found no room.
                self.failed.add(attempt)
                return None
            candidates = self._memo.merged(own, self._candidates(workload, kind), self._victim_order)
        else:
            candidates = self._candidates(workload, kind)
        if not candidates or self._over_limit_without_all(workload, candidates):
            self.failed.add(attempt)
            return None
        best: list[LiveRun] | None = None
        own_queue = workload.queue_id

        def own_runs(runs: list[LiveRun]) -> list[LiveRun]:
            return [run for run in runs if run.queue_id == own_queue]

        for _, in_cluster in self._per_cluster(candidates)[0]:
            if combined and not self._within_guarantee_without(
                workload, self._memo.derived(in_cluster, ("of", own_queue), own_runs)
            ):
                continue  # as above, for the runs it may preempt in this cluster
            found = self._victims_in_cluster(workload, kind, in_cluster, combined)
            if found is not None and (best is None or len(found) < len(best)):
                best = found
                if len(best) == 1:
                    # No cluster can do with fewer: the gang did not fit before (no empty set
                    # makes room), and on a tie the first cluster found keeps its place.
                    break
        if best is None:
            self.failed.add(attempt)
            return None
        for victim in best:
            preempted = combined and victim.queue_id == workload.queue_id
            self._evict(victim, workload, EvictionKind.PREEMPT if preempted else kind)
        self.capacity_grew()  # shapes and attempts that failed may succeed now
        placement = self.fitter.place(workload)
        assert isinstance(placement, Placement), "simulated eviction must make room"
        return placement

    def _within_guarantee_without(self, workload: Workload, own: list[LiveRun]) -> bool:
        """Whether the gang's least start would be within the guarantee of its holder (its queue,
        or the team or cohort that holds one for it) with all of `own` (its queue's runs) gone:
        necessary for any victim set that reclaims. Only the holder is asked: reclaimed victims
        run outside it, so nothing but `own` lowers its usage, while an ancestor above it may get
        usage back from them. Worked out on the units `own` hold, without releasing them."""
        state = self.state
        given_back = self._memo.derived(own, "units", self._units_of)
        least = {GPU_EQ: state.facts.least(workload)}
        return state.ledger.within_shared_guarantee(workload.queue_id, least, holder_only=True, given_back=given_back)

    def _units_of(self, runs: list[LiveRun]) -> dict[str, int]:
        """The units the runs hold together, per key."""
        total: dict[str, int] = {}
        for run in runs:
            for key, amount in self.state.run_units(run).items():
                total[key] = total.get(key, 0) + amount
        return total

    def _units_per_queue(self, runs: list[LiveRun], keys: list[str]) -> dict[str, list[int]]:
        """Per queue, the units of each of `keys` the runs hold."""
        per_queue: dict[str, list[int]] = {}
        run_units = self.state.run_units
        for run in runs:
            units = run_units(run)
            totals = per_queue.setdefault(run.queue_id, [0] * len(keys))
            for i, key in enumerate(keys):
                totals[i] += units.get(key, 0)
        return per_queue

    def _over_limit_without_all(self, workload: Workload, candidates: list[LiveRun]) -> bool:
        """Whether a limit on the gang's chain blocks it even with every candidate gone: then no
        set of them can make room, and the trial placements that would show it one victim at a
        time are skipped. A queue (or team) at its limit whose runs that may be evicted are too
        few to matter is the common case in a full fleet.

        Exact, not a heuristic: a victim gives its units back on its own chain only, so a node of
        the gang's chain gets back at most what the candidates under it hold; any placement holds
        at least `least` units of gpu-eq (all of them on its one GPU model when it may use only
        one); and every trial's quota check (`Fitter.quota_block`) applies these limits."""
        state = self.state
        least = state.facts.least(workload)
        if not least:
            return False
        keys = [GPU_EQ]
        models = state.facts.allowed_models(workload)
        if len(models) == 1 and models[0] != GPU_EQ:
            keys.append(models[0])
        ledger = state.ledger
        chain = ledger.chain(workload.queue_id)
        if not any(key in ledger.limits[node.id] for node in chain for key in keys):
            return False
        per_queue = self._memo.derived(candidates, ("units", *keys), lambda runs: self._units_per_queue(runs, keys))
        freed = {node.id: [0] * len(keys) for node in chain}
        for queue_id, totals in per_queue.items():
            for node in ledger.chain(queue_id):
                into = freed.get(node.id)
                if into is not None:  # a node of both chains gets the victims' units back
                    for i, amount in enumerate(totals):
                        into[i] += amount
        for node in chain:
            limits = ledger.limits[node.id]
            for i, key in enumerate(keys):
                bound = limits.get(key)
                if bound is not None and ledger.used(node.id, key) - freed[node.id][i] + least > bound:
                    return True
        return False

    def held_by_min_runtime(
        self, workload: Workload, kinds: tuple[EvictionKind, ...]
    ) -> tuple[tuple[str, ...], datetime] | None:
        """When no allowed victim set made room but one would if minimum runtimes did not protect
        its runs: those runs (workload ids) and when the last protection ends. Nothing is evicted."""
        if self.state.budget <= 0 or not self._any_protected():
            return None
        for kind in kinds:
            candidates = self._candidates(workload, kind, ignore_min_runtime=True)
            grouped, protected = self._per_cluster(candidates, protected=True)
            for cluster_id, in_cluster in grouped:
                if cluster_id not in protected:
                    continue  # a set found there would not name a protected run
                found = self._victims_in_cluster(workload, kind, in_cluster)
                ends = [(run.workload_id, end) for run in found or () if (end := self._protected_until(run))]
                if ends:
                    return tuple(sorted(name for name, _ in ends)), max(end for _, end in ends)
        return None

    def _any_protected(self) -> bool:
        """Whether a minimum runtime protects any live run now (evictions only remove runs, so
        the answer is worked out once a cycle): if none does, none protects a victim set."""
        if self._protecting is None:
            live = self.state.live
            self._protecting = any(
                live_key(run) in live and self._protected_until(run) for run in self.state.min_runtime_runs
            )
        return self._protecting

    def _per_cluster(
        self, candidates: list[LiveRun], protected: bool = False
    ) -> tuple[list[tuple[str, list[LiveRun]]], set[str]]:
        """`_by_cluster` of a list `_candidates` returned, remembered with it until an eviction;
        with `protected`, also the clusters where a minimum runtime protects one of them."""
        found = self._grouped.get(id(candidates))
        if found is None or found[0] is not candidates:
            grouped = self._memo.derived(candidates, "by cluster", _by_cluster)
            found = self._grouped[id(candidates)] = (candidates, grouped, None)
        clusters = found[2]
        if protected and clusters is None:
            clusters = {run.cluster_id for run in candidates if self._protected_until(run)}
            self._grouped[id(candidates)] = (candidates, found[1], clusters)
        return found[1], clusters or set()

    def _protected_until(self, run: LiveRun) -> datetime | None:
        """When the run's minimum runtime ends, if it still protects the run now."""
        key = live_key(run)
        if key in self._protection:
            return self._protection[key]
        started = run.started_at or run.admitted_at
        until = None
        if run.min_runtime_seconds and started is not None:
            until = started + timedelta(seconds=run.min_runtime_seconds)
            if until <= self.now:
                until = None
        self._protection[key] = until
        return until

    def _candidates(self, workload: Workload, kind: EvictionKind, ignore_min_runtime: bool = False) -> list[LiveRun]:
        """The runs `kind` may take for the gang, in the victim order. Remembered until an
        eviction per what they depend on (queue and priority, or the set of queues they come
        from); rebalancing's are not: the fair shares they compare move with every admission."""
        ledger = self.state.ledger
        key: tuple[object, ...] | None
        sources: tuple[str, ...] = ()  # reclaim: the queues its candidates come from
        if kind is EvictionKind.PREEMPT:
            key = (kind, ignore_min_runtime, workload.queue_id, workload.priority)
        elif kind is EvictionKind.TAKE_BACK:
            key = (kind, ignore_min_runtime, workload.id)
        elif kind is EvictionKind.IDLE:
            key = (kind, ignore_min_runtime)
        elif kind is EvictionKind.REBALANCE:
            key = None
        else:
            # When a team's or cohort's limit blocks the gang, only borrowers under it can make room.
            wanted = {GPU_EQ: self.state.facts.least(workload)}
            ancestor = ledger.ancestor_limit_block(workload.queue_id, wanted)
            # A guarantee a team holds for its queues together is reclaimed from outside the team.
            depth = ledger.guarantee_holder(workload.queue_id)
            holder = ledger.chain(workload.queue_id)[depth].id if depth else None
            sources = tuple(
                queue_id
                for queue_id in self._borrowing_queues()
                if queue_id != workload.queue_id
                and (ancestor is None or ledger.under(queue_id, ancestor))
                and (holder is None or not ledger.under(queue_id, holder))
            )
            key = (kind, ignore_min_runtime, sources)
        runs = self._candidates_of.get(key) if key is not None else None
        if runs is None:
            # Kept across cycles while the runs of the queues they come from stay, if no minimum
            # runtime makes them depend on the time.
            versions: tuple[int, ...] | None = None
            if (
                key is not None
                and kind in (EvictionKind.PREEMPT, EvictionKind.RECLAIM)
                and not self.state.min_runtime_runs
            ):
                queues = (workload.queue_id,) if kind is EvictionKind.PREEMPT else sources
                versions = tuple(self.state.queue_versions.get(queue_id, 0) for queue_id in queues)
                runs = self._memo.kept_list(key, versions)
            if runs is None:
                runs = self._work_out_candidates(workload, kind, ignore_min_runtime, sources)
                if versions is not None:
                    self._memo.keep_list(key, versions, runs)
            if key is not None:
                self._candidates_of[key] = runs
        if self._running is None:
            self._running = {run.workload_id for run in self.state.live.values()}
        if workload.id in self._running:  # its own run may still be live (never a victim for itself)
            return [run for run in runs if run.workload_id != workload.id]
        return runs

    def _borrowing_queues(self) -> list[str]:
        """The queues with live runs whose work runs on borrowed capacity (`borrowing_beyond_holder`),
        in `live_by_queue`'s order; worked out again only once usage is not what it was (its stamp:
        a trial rolled back leaves it as it found it). The queues with live runs change only with
        usage: a run that ends or is evicted gives its units back."""
        state = self.state
        if self._borrowers[0] != state.usage_stamp:
            ledger = state.ledger
            queues = [queue_id for queue_id in state.live_by_queue if ledger.borrowing_beyond_holder(queue_id)]
            self._borrowers = (state.usage_stamp, queues)
        return self._borrowers[1]

    def _work_out_candidates(
        self, workload: Workload, kind: EvictionKind, ignore_min_runtime: bool, sources: tuple[str, ...]
    ) -> list[LiveRun]:
        if kind is EvictionKind.PREEMPT:
            pool = self._in_order(workload.queue_id)
        elif kind is EvictionKind.TAKE_BACK:
            pool = sorted(self.state.lent_to(workload.id), key=self._victim_order)
        elif kind is EvictionKind.IDLE:
            pool = self._idle_in_order()
        elif kind is EvictionKind.REBALANCE:
            # Only queues above their guarantee and already ahead of the preemptor's share.
            ledger, share = self.state.ledger, self.fair_share.share
            own_share = share(workload.queue_id)
            pool = self._merged(
                queue_id
                for queue_id in self.state.live_by_queue
                if queue_id != workload.queue_id and ledger.borrowing(queue_id) and share(queue_id) > own_share
            )
        else:
            pool = self._merged(sources)
        eligible = self._eligible(pool, ignore_min_runtime)
        if kind is EvictionKind.PREEMPT:
            runs = [run for run in eligible if run.priority < workload.priority]
        elif kind is EvictionKind.REBALANCE:
            runs = [run for run in eligible if run.priority <= workload.priority]
        else:
            runs = eligible
        return runs

    def _eligible(self, pool: list[LiveRun], ignore_min_runtime: bool) -> list[LiveRun]:
        """The runs of `pool` (one of the ordered lists above) that may be evicted at all: live,
        preemptible and (unless ignored) past their minimum runtime. Remembered per list until
        an eviction."""
        key = (id(pool), ignore_min_runtime)
        found = self._eligible_of.get(key)
        if found is not None and found[0] is pool:
            return found[1]
        live = self.state.live
        eligible = [
            run
            for run in pool
            if run.preemptible and live_key(run) in live and (ignore_min_runtime or self._protected_until(run) is None)
        ]
        self._eligible_of[key] = (pool, eligible)
        return eligible

    def _in_order(self, queue_id: str) -> list[LiveRun]:
        """The queue's live runs at the start of the cycle, in the victim order: sorted once a
        cycle (a run evicted since is filtered out by the caller; nothing joins `live` in a cycle)."""
        found = self._sorted.get(queue_id)
        if found is None:
            versions = (self.state.queue_versions.get(queue_id, 0),)
            found = self._memo.kept_list(("in order", queue_id), versions)
            if found is None:
                runs = self.state.live_by_queue.get(queue_id, {}).values()
                found = sorted(runs, key=self._victim_order)
                self._memo.keep_list(("in order", queue_id), versions, found)
            self._sorted[queue_id] = found
        return found

    def _idle_in_order(self) -> list[LiveRun]:
        if self._idle is None:
            idle = (run for runs in self.state.live_by_queue.values() for run in runs.values() if run.idle_reclaimable)
            self._idle = sorted(idle, key=self._victim_order)
        return self._idle

    def _merged(self, queue_ids: Iterable[str]) -> list[LiveRun]:
        """The live runs of these queues in the victim order, remembered for the cycle per set of
        queues (heads of one cohort ask for the same borrowers again and again)."""
        key = tuple(queue_ids)
        found = self._merges.get(key)
        if found is None:
            found = [run for queue_id in key for run in self._in_order(queue_id)]
            found.sort(key=self._victim_order)
            self._merges[key] = found
        return found

    def _victim_order(self, run: LiveRun) -> tuple[bool, int, float, str, str]:
        """Idle runs first, then the lowest priority, then the most recently admitted (ids settle
        ties, so the order never depends on the order runs were listed in)."""
        key = live_key(run)
        kept = self._order_keys.get(key)
        if kept is not None and kept[0] is run:
            return kept[1]
        epoch = datetime.min.replace(tzinfo=self.now.tzinfo)
        admitted = -(((run.admitted_at or epoch) - epoch).total_seconds())
        found = (not run.idle, run.priority, admitted, run.run_id, run.workload_id)
        self._order_keys[key] = (run, found)
        return found

    def _victims_in_cluster(
        self, workload: Workload, kind: EvictionKind, candidates: list[LiveRun], combined: bool = False
    ) -> list[LiveRun] | None:
        """The minimal victim set in one cluster (sorted by run id), found on the real state inside
        a checkpoint that is always rolled back."""
        state = self.state
        only = tuple(c for c in self.snapshot.clusters if c.id == candidates[0].cluster_id)
        limit = state.budget
        if kind is EvictionKind.REBALANCE:
            limit = min(limit, self.policy.rebalance_max_per_cycle - state.rebalanced)
        trial = state.checkpoint()
        try:
            chosen: list[LiveRun] | None
            if kind in _RELEASE_ANY_ORDER and not combined:
                # No victim is skipped on the way (those checks read quota the releases change), and
                # freeing more never takes room away: the shortest prefix is found by bisection,
                # once one probe with all of them released found room.
                order = (
                    candidates
                    if len(candidates) <= limit
                    else self._memo.derived(candidates, ("first", limit), lambda runs: runs[:limit])
                )
                if not self._room_without_all(workload, kind, only[0], order):
                    return None
                shortest = shortest_fitting_prefix(
                    state,
                    order,
                    lambda run: state.give_back(run.assignments, run.queue_id),
                    lambda: True if self._room(workload, kind, only, []) else None,
                )
                chosen = None if shortest is None else order[: shortest[0]]
                for run in chosen or ():
                    state.give_back(run.assignments, run.queue_id)
            else:
                chosen = self._release_until_room(workload, kind, only, candidates, limit, combined)
            if chosen is None:
                return None
            for run in reversed(list(chosen)):  # minimise: drop every victim the gang does not need
                without = state.checkpoint()
                state.take(run.assignments, run.queue_id)
                chosen.remove(run)
                if self._room(workload, kind, only, chosen, combined):
                    state.keep(without)
                else:
                    state.rollback(without)
                    chosen.append(run)
            return sorted(chosen, key=lambda r: (r.run_id, r.workload_id))
        finally:
            state.rollback(trial)

    def _room_without_all(self, workload: Workload, kind: EvictionKind, cluster: Cluster, order: list[LiveRun]) -> bool:
        """Whether the gang has room on the cluster with every run of `order` (all on it) gone. A
        head of a full fleet asks every cycle and usually finds none: when capacity alone says
        no, that is remembered with the state (`CycleState.capacity_misses`) for as long as the
        cluster's free capacity is what it was, so the trial is not made again."""
        state = self.state
        miss = (
            state.facts.shape_id(workload),
            self.policy.prefer_same_pool,
            cluster.id,
            state.stamps.get(cluster.id, 0),
            self._memo.derived(order, "keys", lambda runs: tuple(live_key(run) for run in runs)),
        )
        if miss in state.capacity_misses:
            return False
        # A limit these runs are too few to lift is told by arithmetic alone (a queue's front
        # blocked by its limit asks every cluster where it has runs, every cycle).
        if self._over_limit_without_all(workload, order):
            return False
        # Quota first (cheap: no capacity released, no placement searched): a rule that blocks
        # even the gang's least start with every run of `order` gone blocks every placement (each
        # holds at least that much, and every rule only tightens with more held).
        trial = state.checkpoint()
        try:
            state.give_back_quota(order)
            if self.fitter.quota_block(workload, {GPU_EQ: state.facts.least(workload)}) is not None:
                return False
        finally:
            state.rollback(trial)
        trial = state.checkpoint()
        try:
            for run in order:
                state.give_back(run.assignments, run.queue_id)
            if not self.fitter.has_room(workload, cluster):
                state.remember_capacity_miss(miss)
                return False
            return self._room(workload, kind, (cluster,), [])
        finally:
            state.rollback(trial)

    def _release_until_room(
        self,
        workload: Workload,
        kind: EvictionKind,
        only: tuple[Cluster, ...],
        candidates: list[LiveRun],
        limit: int,
        combined: bool,
    ) -> list[LiveRun] | None:
        """Release candidates one at a time, in order, until the gang has room (they stay released);
        None when `limit` victims or all the candidates are not enough. Whether a reclaim candidate
        is still borrowed depends on the ones released before it, so this goes one by one."""
        state = self.state
        chosen: list[LiveRun] = []
        for run in candidates:
            if len(chosen) >= limit:
                return None
            reclaimed = kind is EvictionKind.RECLAIM and not (combined and run.queue_id == workload.queue_id)
            if reclaimed and not state.ledger.borrowing_beyond_holder(run.queue_id):
                continue  # its queue is back within its guarantee: the rest is not borrowed
            if kind is EvictionKind.REBALANCE and not state.ledger.borrowing(run.queue_id):
                continue
            state.give_back(run.assignments, run.queue_id)
            chosen.append(run)
            if self._room(workload, kind, only, chosen, combined):
                return chosen
        return None

    def _room(
        self,
        workload: Workload,
        kind: EvictionKind,
        only: tuple[Cluster, ...],
        victims: list[LiveRun],
        combined: bool = False,
    ) -> bool:
        placement = self.fitter.place(workload, clusters=only)
        if not isinstance(placement, Placement):
            return False
        if combined and all(v.queue_id == workload.queue_id for v in victims):
            return True  # preemption alone: its placement already passed every quota rule
        return self._may_evict_for(workload, kind, placement, victims)

    def _may_evict_for(
        self, workload: Workload, kind: EvictionKind, placement: Placement, victims: list[LiveRun]
    ) -> bool:
        """Reclaim only restores a guarantee: with the victims gone, the gang must fit within the
        guarantee of its queue and of every ancestor that declares one. Nobody evicts to borrow."""
        if kind in _RELEASE_ANY_ORDER:
            return True  # the gang's own placement already passed every quota rule
        held = self.state.unit.usage(placement.assignments, self.state.pool_of_node)
        if kind is EvictionKind.RECLAIM:
            return self.state.ledger.within_shared_guarantee(workload.queue_id, held)
        # Rebalance: afterwards the preemptor's queue must not have a higher share than any queue
        # it takes from. Candidates come only from queues strictly ahead, so the victims' queues
        # cannot take the capacity back next cycle (no ping-pong).
        share_of = self.fair_share.share_of
        after = share_of(workload.queue_id, extra=held)
        return all(after <= share_of(queue_id) for queue_id in {v.queue_id for v in victims})

    def _evict(self, victim: LiveRun, beneficiary: Workload, kind: EvictionKind) -> None:
        state = self.state
        self._eligible_of.clear()  # it is no longer live
        self._candidates_of.clear()
        self._grouped.clear()
        state.give_back(victim.assignments, victim.queue_id)
        state.drop_live(victim)
        state.budget -= 1
        if kind is EvictionKind.REBALANCE:
            state.rebalanced += 1
        tree = self.snapshot.queue_tree
        victim_queue = tree[victim.queue_id].name if victim.queue_id in tree else victim.queue_id
        own_queue = tree[beneficiary.queue_id].name if beneficiary.queue_id in tree else beneficiary.queue_id
        self.evictions.append(
            Eviction(
                victim.workload_id,
                victim.run_id,
                kind,
                beneficiary.id,
                beneficiary_name=beneficiary.name,
                beneficiary_queue=own_queue,
                beneficiary_priority=beneficiary.priority,
                victim_queue=victim_queue,
                victim_priority=victim.priority,
            )
        )


def _by_cluster(runs: list[LiveRun]) -> list[tuple[str, list[LiveRun]]]:
    """The runs of each cluster, clusters by id, each keeping the runs' order."""
    grouped: dict[str, list[LiveRun]] = {}
    for run in runs:
        grouped.setdefault(run.cluster_id, []).append(run)
    return sorted(grouped.items())
