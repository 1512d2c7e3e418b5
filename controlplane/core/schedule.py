"""The pure scheduling core: `schedule(snapshot, policy, now) -> Decision`.

No I/O, no clock reads, no globals: the same snapshot gives the same decision.

One cycle, least disruptive action first, for each pending gang in fair-share order:
1. admit it if a placement on real free nodes of one cluster passes the quota rules;
1b. else take GPUs from runs the idle policy marked reclaimable (measured idle), any queue;
2. else, if its queue stays within its guarantee, reclaim capacity that other queues run on
   borrowed quota (idle runs first, then lowest priority, newest first), whatever their priority;
3. else preempt lower-priority preemptible gangs of its own queue;
4. else, only when the policy opts in and at a bounded rate, evict equal- or lower-priority work of
   queues above their fair share to rebalance toward a queue below it;
5. else leave it pending with one precise reason.
Every disruptive step is simulated first (victims released on a trial copy of the free
capacity) and applied only if the gang then fits; the victim set is minimised; a budget bounds
evictions per cycle.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from fractions import Fraction

from controlplane.core.decision import (
    Admission,
    Decision,
    Eviction,
    EvictionKind,
    FairShareTurn,
    IsolationOnlyTimeSliced,
    NoFit,
    NotConsidered,
    NotLent,
    OutsideGuarantee,
    PendingKind,
    PendingReason,
    ReservationNote,
    SchedulingFailed,
    UnusableQuota,
    Why,
)
from controlplane.core.fragmentation import gang_fragmentation_cost, workload_mix
from controlplane.core.history import decayed_gpu_hours, history_shares
from controlplane.core.placement import (
    FreeCapacity,
    Miss,
    Placement,
    candidate_pools,
    copy_capacity,
    empty_capacity,
    gpu_slots,
    place_gang,
    placements_in_cluster,
)
from controlplane.core.quota import ZERO, Ledger, Usage
from controlplane.core.snapshot import LiveRun, Policy, Snapshot, gpu_eq_of_demand, usage_of
from controlplane.domain.limits import MAX_QUOTA_AMOUNT
from controlplane.domain.model import GPU_EQ, Cluster, Node, NodePool, PodAssignment, QueueNode, Quota, Workload
from controlplane.domain.sharing import mig_gpu_eq

# A gang whose scheduling raises is set aside with a reason and the cycle starts again without
# it (the cycle's working state may be half-updated by then); after this many such gangs in one
# cycle, the cycle keeps what it decided before the last failure and the rest wait for the next.
MAX_FAILED_GANGS_PER_CYCLE = 3

# Why a gang waits, and the reservation it holds or waits behind (if any).
Verdict = tuple[Why, ReservationNote | None]


def schedule(snapshot: Snapshot, policy: Policy, now: datetime) -> Decision:
    """One cycle. One bad gang or queue never fails it for the whole fleet: a queue whose quota
    holds a value no arithmetic can use (an infinity, NaN, negative or beyond MAX_QUOTA_AMOUNT)
    keeps its gangs pending with that reason, and a gang whose scheduling raises gets an `error:`
    reason while the rest of the fleet is scheduled."""
    snapshot, held = _quarantine_queues(snapshot)
    failed: dict[str, tuple[Workload, Why]] = {}
    while True:
        todo = tuple(w for w in snapshot.pending if w.id not in failed)
        cycle = _Cycle(replace(snapshot, pending=todo), policy, now)
        failure = cycle.run()
        if failure is None:
            break
        workload, exc = failure
        failed[workload.id] = (workload, SchedulingFailed(type(exc).__name__, str(exc)[:200]))
        if len(failed) >= MAX_FAILED_GANGS_PER_CYCLE:
            decided = {a.workload_id for a in cycle.admissions} | {p.workload_id for p in cycle.pending}
            for rest in todo:
                if rest.id not in decided and rest.id not in failed:
                    cycle.leave_pending(rest, (NotConsidered(len(failed)), None))
            break
    for workload, why in [*failed.values(), *held]:
        cycle.leave_pending(workload, (why, None))
    return Decision(
        admissions=tuple(cycle.admissions),
        pending=tuple(cycle.pending),
        evictions=tuple(cycle.evictions),
        stats={
            "pending": len(snapshot.pending) + len(held),
            "admitted": len(cycle.admissions),
            "evicted": len(cycle.evictions),
            **({"failed": len(failed)} if failed else {}),
        },
    )


def _usable(value: object, positive: bool = False) -> bool:
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    return (value > 0 if positive else value >= 0) and value <= MAX_QUOTA_AMOUNT


def _harmless(quota: Quota) -> Quota:
    return Quota({key: value if _usable(value) else 0.0 for key, value in quota.amounts.items()})


def _unusable(node: QueueNode) -> UnusableQuota | None:
    """What in the node's quota no arithmetic can use, or None."""
    if not _usable(node.weight, positive=True):
        return UnusableQuota(node.name, "weight", None, repr(node.weight))
    for name in ("guaranteed", "limit", "borrowing_limit", "lending_limit"):
        quota: Quota = getattr(node, name)
        for key, value in quota.amounts.items():
            if not _usable(value):
                return UnusableQuota(node.name, name, key, repr(value))
    return None


def _quarantine_queues(snapshot: Snapshot) -> tuple[Snapshot, list[tuple[Workload, Why]]]:
    """Set aside the pending gangs of queues under a node with an unusable quota (it got into the
    database before the API bounded it, or by hand), and make that node's quota harmless for the
    cycle: unusable amounts become 0, so its live runs still count and nothing more is admitted."""
    problems = {node_id: p for node_id, node in snapshot.queue_tree.items() if (p := _unusable(node)) is not None}
    if not problems:
        return snapshot, []
    tree = dict(snapshot.queue_tree)
    for node_id in problems:
        node = tree[node_id]
        tree[node_id] = replace(
            node,
            weight=node.weight if _usable(node.weight, positive=True) else 1.0,
            guaranteed=_harmless(node.guaranteed),
            limit=_harmless(node.limit),
            borrowing_limit=_harmless(node.borrowing_limit),
            lending_limit=_harmless(node.lending_limit),
        )

    def culprit(queue_id: str) -> str | None:
        current: str | None = queue_id
        while current is not None and current in tree:
            if current in problems:
                return current
            current = tree[current].parent_id
        return None

    held: list[tuple[Workload, Why]] = []
    pending: list[Workload] = []
    for workload in snapshot.pending:
        found = culprit(workload.queue_id)
        if found is None:
            pending.append(workload)
            continue
        held.append((workload, problems[found]))
    return replace(snapshot, queue_tree=tree, pending=tuple(pending)), held


# The expected next pod (for fragmentation) is estimated from the oldest pending gangs; a deep
# backlog adds nothing the first few thousand do not already say.
MIX_SAMPLE = 5000

# How many of the best placements by the cheap terms also get the fragmentation term.
FRAGMENTATION_CANDIDATES = 6

# Node labels that name a failure or network domain; the scorer keeps a gang inside one of each.
TOPOLOGY_LABELS = ("topology.kubernetes.io/zone", "topology.kubernetes.io/rack", "cloud.google.com/gke-placement-group")


def _gpu_eq_float(demand: Mapping[str, int], pool: NodePool) -> float:
    """`gpu_eq_of_demand` in floating point, for scores (quota maths stays exact)."""
    total = float(demand.get("gpu", 0))
    shares = demand.get("share")
    if shares:
        total += shares / pool.sharing.replicas
    for key, count in demand.items():
        if key.startswith("mig:"):
            total += float(mig_gpu_eq(key[4:])) * count
    return total


def _least_gpu_eq(workload: Workload) -> Fraction:
    """The gpu-eq of the cheapest `min_available` pods: what the gang needs at the very least."""
    per_pod = sorted(ps.gpu_eq_per_pod() for ps in workload.pod_sets for _ in range(ps.replicas))
    return sum(per_pod[: workload.min_available], ZERO)


def _shape(workload: Workload) -> tuple[object, ...]:
    """What placement depends on: gangs of one shape fit or fail alike on the same capacity."""
    return (
        workload.pod_sets,
        workload.min_available,
        workload.requires_isolation,
        workload.tolerations,
        workload.spot,
        workload.same_pool,
    )


@dataclass
class _Reservation:
    owner: str
    cluster_id: str
    held: dict[str, dict[str, int]]  # node id -> the free capacity taken out of circulation
    due: datetime | None  # when the work it waits for has declared it will be gone


@dataclass
class _Cycle:
    snapshot: Snapshot
    policy: Policy
    now: datetime
    admissions: list[Admission] = field(default_factory=list)
    pending: list[PendingReason] = field(default_factory=list)
    evictions: list[Eviction] = field(default_factory=list)

    def __post_init__(self) -> None:
        snapshot = self.snapshot
        self.pools: dict[str, NodePool] = snapshot.pools_by_id()
        self.pool_of_node = {node.id: self.pools[node.pool_id] for node in snapshot.nodes}
        schedulable = [node for node in snapshot.nodes if node.schedulable]
        self.nodes_by_pool: dict[str, list[Node]] = {}
        for node in schedulable:
            self.nodes_by_pool.setdefault(node.pool_id, []).append(node)
        self.nodes_by_cluster: dict[str, list[str]] = {}
        for node in schedulable:
            self.nodes_by_cluster.setdefault(node.cluster_id, []).append(node.id)
        self.free: FreeCapacity = empty_capacity(schedulable, self.pools)
        self.capacity: Usage = {}
        for node in schedulable:
            pool = self.pools[node.pool_id]
            amount = gpu_eq_of_demand(pool.node_capacity(), pool)
            self.capacity[GPU_EQ] = self.capacity.get(GPU_EQ, ZERO) + amount
            self.capacity[pool.gpu_model] = self.capacity.get(pool.gpu_model, ZERO) + amount
        self.free_eq: Usage = dict(self.capacity)
        self.ledger = Ledger(snapshot.queue_tree)
        self.live: dict[str, LiveRun] = {}
        self.live_by_queue: dict[str, dict[str, LiveRun]] = {}
        for run in snapshot.live_runs:
            self.live[run.run_id or run.workload_id] = run
            self.live_by_queue.setdefault(run.queue_id, {})[run.run_id or run.workload_id] = run
        self._hold_live(snapshot.live_runs)
        parents = {node.parent_id for node in snapshot.queue_tree.values()}
        # Leaf queues that keep part of their guarantee back from borrowers.
        self.lenders = sorted(
            node.id for node in snapshot.queue_tree.values() if node.id not in parents and node.lending_limit.amounts
        )
        self.budget = self.policy.disruption_budget
        # Shapes that found no room this cycle, with the reason: room only shrinks until an eviction.
        self.unplaceable: dict[tuple[object, ...], Why] = {}
        self.positions: dict[str, int] = {}
        self.failed_evictions: set[tuple[object, ...]] = set()
        self.shares: dict[str, tuple[int, Fraction]] = {}
        self.history: dict[str, Fraction] = {}
        if self.policy.usage_history_weight > 0 and snapshot.usage_history:
            decayed = decayed_gpu_hours(snapshot.usage_history, self.now, self.policy.usage_half_life_seconds)
            weight = Fraction(self.policy.usage_history_weight).limit_denominator(1000)
            self.history = {
                queue_id: weight * Fraction(part).limit_denominator(10**6)
                for queue_id, part in history_shares(decayed).items()
            }
        self.rebalanced = 0
        self.pending_memo: dict[tuple[object, ...], Verdict] = {}
        self.mix = workload_mix(snapshot.pending[:MIX_SAMPLE])
        self.fragmentation_memo: dict[tuple[object, ...], tuple[float, int]] = {}
        # Free capacity as the cycle found it: a gang that would have fit there but not after this
        # cycle's admissions waits on fair share, not on the fleet (`_fair_share_reason`).
        self.initial_free: FreeCapacity = copy_capacity(self.free)
        self.fit_at_start: dict[tuple[object, ...], bool] = {}
        self.admitted_queues: list[str] = []
        self.reservations: list[_Reservation] = []
        self.reserved_queues: dict[str, ReservationNote] = {}

    # -- bookkeeping ---------------------------------------------------------------------------

    def _hold(
        self, assignments: tuple[PodAssignment, ...], queue_id: str, sign: int, free: FreeCapacity | None = None
    ) -> Usage:
        """Take (+1) or give back (-1) capacity, and with the real free capacity also quota."""
        target = self.free if free is None else free
        for a in assignments:
            node_free = target.get(a.node_id)
            if node_free is not None:
                for key, amount in a.demand.items():
                    node_free[key] = node_free.get(key, 0) - sign * amount
        held = usage_of(assignments, self.pool_of_node)
        if free is None:
            self.ledger.charge(queue_id, held, sign)
            for key, value in held.items():
                self.free_eq[key] = self.free_eq.get(key, ZERO) - sign * value
        return held

    def _hold_live(self, runs: tuple[LiveRun, ...]) -> None:
        """`_hold` for every live run at once: capacity per node, then quota once per queue.

        Every cycle starts here, so it avoids per-run Fraction arithmetic: a demand's gpu-eq is
        worked out once per (pool, demand) and summed as an int while it is whole.
        """
        free, pool_of_node = self.free, self.pool_of_node
        eq_of: dict[tuple[str, tuple[tuple[str, int], ...]], int | Fraction] = {}
        per_queue: dict[str, dict[str, int | Fraction]] = {}
        for run in runs:
            totals = per_queue.setdefault(run.queue_id, {})
            for a in run.assignments:
                demand = a.demand
                node_free = free.get(a.node_id)
                if node_free is not None:
                    for key, amount in demand.items():
                        node_free[key] = node_free.get(key, 0) - amount
                pool = pool_of_node[a.node_id]
                whole = demand.get("gpu", 0)
                if whole and len(demand) == 3:  # cpu, mem and whole GPUs: the common case
                    amount_eq: int | Fraction | None = whole
                else:
                    signature = (pool.id, tuple(demand.items()))
                    amount_eq = eq_of.get(signature)
                    if amount_eq is None:
                        exact = gpu_eq_of_demand(demand, pool)
                        amount_eq = eq_of[signature] = exact.numerator if exact.denominator == 1 else exact
                if amount_eq:
                    totals[GPU_EQ] = totals.get(GPU_EQ, 0) + amount_eq
                    totals[pool.gpu_model] = totals.get(pool.gpu_model, 0) + amount_eq
        for queue_id, totals in per_queue.items():
            held = {key: Fraction(value) for key, value in totals.items()}
            if held:
                self.ledger.charge(queue_id, held, +1)
            for key, value in held.items():
                self.free_eq[key] = self.free_eq.get(key, ZERO) - value

    def run(self) -> tuple[Workload, Exception] | None:
        """Decide every pending gang in order; on the first gang that raises, undo what it added
        to the decision and return it with the exception (the working state is then unreliable)."""
        for workload in self.order():
            marks = (len(self.admissions), len(self.pending), len(self.evictions))
            try:
                verdict = self.try_admit(workload)
                if verdict is not None:
                    self.leave_pending(workload, verdict)
            except Exception as exc:  # one gang must never fail the cycle for the fleet
                del self.admissions[marks[0] :], self.pending[marks[1] :], self.evictions[marks[2] :]
                return workload, exc
        return None

    def leave_pending(self, workload: Workload, verdict: Verdict) -> None:
        position = self.positions[workload.queue_id] = self.positions.get(workload.queue_id, 0) + 1
        self.pending.append(PendingReason(workload.id, verdict[0], position, verdict[1]))

    # -- order ---------------------------------------------------------------------------------

    def order(self) -> Iterator[Workload]:
        """Within a queue: priority, then FIFO. Across queues: the lowest weighted dominant share
        above guarantee goes first (or, without fair share, one global priority/FIFO order)."""
        by_priority = sorted(self.snapshot.pending, key=lambda w: (-w.priority, w.created_seq, w.id))
        if not self.policy.fair_share:
            yield from by_priority
            return
        queues: dict[str, list[Workload]] = {}
        for workload in by_priority:
            queues.setdefault(workload.queue_id, []).append(workload)
        heads = dict.fromkeys(queues, 0)
        heap = [self._queue_key(queue_id, items[0]) for queue_id, items in queues.items()]
        heapq.heapify(heap)
        while heap:
            *_, queue_id = heapq.heappop(heap)
            items = queues[queue_id]
            yield items[heads[queue_id]]
            heads[queue_id] += 1
            if heads[queue_id] < len(items):
                heapq.heappush(heap, self._queue_key(queue_id, items[heads[queue_id]]))

    def _queue_key(self, queue_id: str, head: Workload) -> tuple[int, Fraction, int, int, str]:
        return (int(self.ledger.borrowing(queue_id)), self._share(queue_id), -head.priority, head.created_seq, queue_id)

    def _share(self, queue_id: str) -> Fraction:
        """Weighted dominant share of what the queue uses above its guarantee (DRF over keys),
        recomputed only when the queue's usage changed."""
        version = self.ledger.versions.get(queue_id, 0)
        cached = self.shares.get(queue_id)
        if cached is not None and cached[0] == version:
            return cached[1]
        share = self._compute_share(queue_id)
        self.shares[queue_id] = (version, share)
        return share

    def _compute_share(self, queue_id: str, extra: Usage | None = None) -> Fraction:
        """The queue's weighted dominant share, plus its weighted part of recent consumption when
        the policy keeps history; `extra` is usage it would add (for rebalancing trials)."""
        node = self.snapshot.queue_tree.get(queue_id)
        weight = Fraction(node.weight).limit_denominator(1000) if node else Fraction(1)
        guaranteed = self.ledger.guarantees.get(queue_id, {})
        usage = self.ledger.usage.get(queue_id, {})
        if extra:
            usage = {key: usage.get(key, ZERO) + extra.get(key, ZERO) for key in usage.keys() | extra.keys()}
        # Shares are compared on the keys the guarantee speaks of: per GPU model (DRF over models)
        # when it names models or names nothing, on gpu-eq when it is model-agnostic.
        model_keys = [k for k in usage if k != GPU_EQ]
        if GPU_EQ in guaranteed and not any(k in guaranteed for k in model_keys):
            keys = [GPU_EQ]
        else:
            keys = model_keys or [GPU_EQ]
        dominant = ZERO
        for key in keys:
            used = usage.get(key, ZERO)
            total = self.capacity.get(key)
            if not total:
                continue
            above = used - guaranteed.get(key, ZERO)
            if above > 0:
                dominant = max(dominant, above / total)
        return (dominant + self.history.get(queue_id, ZERO)) / weight

    # -- admission -----------------------------------------------------------------------------

    def try_admit(self, workload: Workload) -> Verdict | None:
        """Admit the gang (maybe after evictions); the pending reason when it cannot be.

        Within a cycle free capacity only shrinks and usage only grows until an eviction, so a
        gang exactly like one already left pending (same queue, priority, flags and shape) is left
        pending for the same reason without trying again: deep backlogs of look-alike gangs cost
        a dictionary lookup each.
        """
        key = (
            workload.queue_id,
            workload.priority,
            workload.preemptible,
            workload.may_evict,
            workload.max_runtime_seconds,
            _shape(workload),
        )
        known = self.pending_memo.get(key)
        if known is not None:
            return known
        verdict = self._try_admit(workload)
        # A fair-share reason names the queues that went ahead, which grow during the cycle.
        if verdict is not None and verdict[0].kind is not PendingKind.FAIR_SHARE:
            self.pending_memo[key] = verdict
        return verdict

    def _try_admit(self, workload: Workload) -> Verdict | None:
        wanted = {GPU_EQ: _least_gpu_eq(workload)}
        blocked: Why | None = self.ledger.limit_block(workload.queue_id, wanted)
        if not workload.preemptible and not self.ledger.within_guarantee(workload.queue_id, wanted):
            blocked = blocked or OutsideGuarantee(float(wanted[GPU_EQ]))
        if blocked is None:
            outcome = self._place(workload, self.free)
            if isinstance(outcome, Placement):
                self._admit(workload, outcome)
                return None
            if self._backfill(workload):
                return None
            reason = outcome
        else:
            reason = blocked
        no_fit = blocked is None and isinstance(reason, NoFit)
        if not workload.may_evict:
            return self._reserve(workload, reason) if no_fit else (reason, None)
        if blocked is None and self._evict_for(workload, EvictionKind.IDLE):
            return None
        # Ancestors are checked with the victims gone (their usage counts there too).
        reclaimable = blocked is None and self.ledger.within_guarantee(workload.queue_id, wanted, queue_only=True)
        if self.policy.reclaim and reclaimable and self._evict_for(workload, EvictionKind.RECLAIM):
            return None
        if self.policy.preemption and self._evict_for(workload, EvictionKind.PREEMPT):
            return None
        if blocked is None and self._rebalance_open() and self._evict_for(workload, EvictionKind.REBALANCE):
            return None
        if no_fit:
            return self._reserve(workload, self._fair_share_reason(workload) or reason)
        return reason, None

    def _fair_share_reason(self, workload: Workload) -> FairShareTurn | None:
        """When the gang fitted the free capacity at the start of the cycle and queues ordered ahead
        of it by fair share took that capacity, say so: it waits its turn, the fleet is not too small."""
        others = [q for q in dict.fromkeys(self.admitted_queues) if q != workload.queue_id]
        if not self.policy.fair_share or not others:
            return None
        shape = _shape(workload)
        if shape not in self.fit_at_start:
            # Trying the start-of-cycle capacity costs a placement: only for the head of a queue
            # (the one whose turn it is); behind it a gang waits on its queue anyway.
            if self.positions.get(workload.queue_id, 0):
                return None
            self.fit_at_start[shape] = isinstance(self._place(workload, self.initial_free, use_cache=False), Placement)
        if not self.fit_at_start[shape]:
            return None
        tree = self.snapshot.queue_tree
        names = tuple(tree[q].name if q in tree else q for q in others[:3])
        own = tree[workload.queue_id].name if workload.queue_id in tree else workload.queue_id
        return FairShareTurn(own, float(self._share(workload.queue_id)), names, max(0, len(others) - 3))

    # -- reservations --------------------------------------------------------------------------

    def _reserve(self, workload: Workload, reason: Why) -> Verdict:
        """Let the head-of-line gang of a queue hold the nodes it waits for (those that free up
        first); work behind it backfills there only if it declares it will be gone in time."""
        if workload.queue_id in self.reserved_queues:
            return reason, self.reserved_queues[workload.queue_id]
        if len(self.reservations) >= self.policy.max_reservations:
            return reason, None
        best: tuple[bool, datetime, int, str, Placement] | None = None
        for cluster in self.snapshot.clusters:
            runs = sorted(
                (r for r in self.live.values() if r.cluster_id == cluster.id),
                key=lambda r: (r.ends_by() is None, r.ends_by() or self.now, r.run_id),
            )
            trial: FreeCapacity = {n: dict(self.free[n]) for n in self.nodes_by_cluster.get(cluster.id, [])}
            released: list[LiveRun] = []
            found: Placement | Why | None = None
            for run in runs:
                self._hold(run.assignments, run.queue_id, -1, free=trial)
                released.append(run)
                found = self._place(workload, trial, (cluster,))
                if isinstance(found, Placement):
                    break
            if not isinstance(found, Placement):
                continue
            ends = [r.ends_by() for r in released]
            unknown = any(end is None for end in ends)
            due = max((end for end in ends if end is not None), default=self.now)
            candidate = (unknown, due, len(released), cluster.id, found)
            if best is None or candidate[:4] < best[:4]:
                best = candidate
        if best is None:
            return reason, None
        unknown, due, _, cluster_id, placement = best
        nodes = sorted({a.node_id for a in placement.assignments})
        held = {node_id: dict(self.free[node_id]) for node_id in nodes}
        for node_id in nodes:  # held: nobody else may take what is free there now
            for key in held[node_id]:
                self.free[node_id][key] = 0
        self.reservations.append(_Reservation(workload.id, cluster_id, held, None if unknown else due))
        cluster_name = next((c.name for c in self.snapshot.clusters if c.id == cluster_id), cluster_id)
        note = ReservationNote(len(nodes), cluster_name, workload.name, None if unknown else due)
        self.reserved_queues[workload.queue_id] = note
        return reason, note

    def _backfill(self, workload: Workload) -> bool:
        """Place a gang on reserved nodes when its declared runtime ends before they are due."""
        if workload.max_runtime_seconds is None:
            return False
        ends = self.now + timedelta(seconds=workload.max_runtime_seconds)
        for reservation in self.reservations:
            if reservation.due is None or ends > reservation.due:
                continue
            for node_id, amounts in reservation.held.items():
                for key, amount in amounts.items():
                    self.free[node_id][key] += amount
            placement = self._place(workload, self.free, use_cache=False)
            if isinstance(placement, Placement):
                self._admit(workload, placement)
            for node_id in reservation.held:  # hold again what is still free there
                reservation.held[node_id] = dict(self.free[node_id])
                for key in reservation.held[node_id]:
                    self.free[node_id][key] = 0
            if isinstance(placement, Placement):
                return True
        return False

    def _place(
        self,
        workload: Workload,
        free: FreeCapacity,
        clusters: tuple[Cluster, ...] | None = None,
        use_cache: bool = True,
    ) -> Placement | Why:
        """The best placement that also passes every quota rule, or why there is none."""
        shape = _shape(workload)
        use_cache = use_cache and free is self.free and clusters is None
        if use_cache and shape in self.unplaceable:
            return self.unplaceable[shape]
        placements: list[Placement] = []
        best_miss: Miss | None = None
        for cluster in self.snapshot.clusters if clusters is None else clusters:
            found = placements_in_cluster(workload, cluster, self.nodes_by_pool, free, self.policy.prefer_same_pool)
            if isinstance(found, Miss):
                if best_miss is None or found.placed > best_miss.placed:
                    best_miss = found
            elif workload.same_pool == "required":
                placements.extend(p for p in found if self._pools_used(p) == 1)
            else:
                placements.extend(found)
                if all(self._pools_used(p) > 1 for p in found):
                    placements.extend(self._zone_placements(workload, cluster, free))
        if not placements:
            no_fit = self._no_fit(workload, best_miss)
            if use_cache:
                self.unplaceable[shape] = no_fit
            return no_fit
        first_reason: Why | None = None
        for placement in self._ranked(placements, workload):
            assignments = placement.assignments
            while True:
                blocked = self._quota_block(workload, usage_of(assignments, self.pool_of_node))
                if blocked is None:
                    return replace(placement, assignments=assignments)
                if len(assignments) <= workload.min_available:
                    break
                # An elastic gang may start with fewer pods: drop the last one and ask again.
                assignments = assignments[:-1]
            first_reason = first_reason or blocked
        assert first_reason is not None
        return first_reason

    def _ranked(self, placements: list[Placement], workload: Workload) -> list[Placement]:
        """Best first. Every placement gets the cheap terms (fit, price, topology, spot); the
        fragmentation term, which simulates the gang pod by pod, only the best few of them."""
        base = {id(p): self._score(p, workload, fragmentation=False) for p in placements}
        ranked = sorted(placements, key=lambda p: (p.spread, base[id(p)], p.cluster_id))
        if self.mix is None or len(ranked) < 2:
            return ranked
        head, tail = ranked[:FRAGMENTATION_CANDIDATES], ranked[FRAGMENTATION_CANDIDATES:]
        weight = self.policy.fragmentation_weight
        head.sort(key=lambda p: (p.spread, base[id(p)] + weight * self._fragmentation(p, workload), p.cluster_id))
        return head + tail

    def _fragmentation(self, placement: Placement, workload: Workload) -> float:
        assert self.mix is not None
        # FGD-style: how much the gang grows the fleet's fragmentation against the expected
        # workload (the score `gpufleet sim placement` measures on the openb trace).
        return gang_fragmentation_cost(
            self.mix, workload, placement.assignments, self.free, self.pool_of_node, self.fragmentation_memo
        )

    def _pools_used(self, placement: Placement) -> int:
        return len({self.pool_of_node[a.node_id].id for a in placement.assignments})

    def _zone_placements(self, workload: Workload, cluster: Cluster, free: FreeCapacity) -> list[Placement]:
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
                    placed = place_gang(workload, cluster, group, self.nodes_by_pool, free)
                    if isinstance(placed, Placement):
                        found.append(replace(placed, spread=False))
        return found

    def _score(self, placement: Placement, workload: Workload | None = None, fragmentation: bool = True) -> float:
        """Lower is better: free GPU slots left on the nodes it touches (fit), nodes it leaves
        partly used (fragmentation) and what its GPUs cost per hour (price), weighted by the policy."""
        touched: dict[str, int] = {}
        price = 0.0
        for a in placement.assignments:
            slots = gpu_slots(a.demand)
            touched[a.node_id] = touched.get(a.node_id, 0) + slots
            pool = self.pool_of_node[a.node_id]
            if slots and pool.price_per_gpu_hour:
                price += _gpu_eq_float(a.demand, pool) * pool.price_per_gpu_hour
        if not fragmentation:
            fragments = 0.0
        elif self.mix is not None and workload is not None:
            fragments = self._fragmentation(placement, workload)
        else:
            fragments = sum(1 for node_id, taken in touched.items() if gpu_slots(self.free[node_id]) > taken)
        pools = list({self.pool_of_node[node_id].id: self.pool_of_node[node_id] for node_id in touched}.values())
        # Topology: a gang spread over pools in different zones or racks talks across them.
        domains = sum(len({p.labels.get(label) for p in pools}) - 1 for label in TOPOLOGY_LABELS)
        spot = 0.0
        if workload is not None and workload.spot in ("prefer", "avoid"):
            on_spot = sum(1 for p in pools if p.spot) / len(pools) if pools else 0.0
            spot = on_spot if workload.spot == "avoid" else 1.0 - on_spot
        policy = self.policy
        return (
            policy.fit_weight * placement.leftover_gpu_slots
            + policy.fragmentation_weight * fragments
            + policy.price_weight * price
            + policy.topology_weight * domains
            + policy.spot_weight * spot
        )

    def _no_fit(self, workload: Workload, miss: Miss | None) -> Why:
        if workload.requires_isolation and self._only_time_sliced(workload):
            return IsolationOnlyTimeSliced()
        if miss is None:
            return NoFit(workload.min_available, None)
        return NoFit(workload.min_available, miss.detail, miss.placed)

    def _only_time_sliced(self, workload: Workload) -> bool:
        """Whether some pod set could be served by time-sliced pools and by nothing else."""
        pools = list(self.pools.values())
        for pod_set in workload.pod_sets:
            serving = [p for p in pools if pod_set.demand_on(p) is not None]
            if serving and all(not p.sharing.isolated for p in serving):
                return True
        return False

    def _quota_block(self, workload: Workload, held: Usage) -> Why | None:
        reason: Why | None = self.ledger.limit_block(workload.queue_id, held) or self.ledger.borrowing_block(
            workload.queue_id, held
        )
        if reason is not None:
            return reason
        if self.ledger.within_guarantee(workload.queue_id, held):
            return None
        if not workload.preemptible:
            return OutsideGuarantee()
        protected = self.ledger.protected(self.lenders, excluding=workload.queue_id)
        for key, keep in protected.items():
            want = held.get(key, ZERO)
            if want and self.free_eq.get(key, ZERO) - want < keep:
                return NotLent(key)
        return None

    def _admit(self, workload: Workload, placement: Placement) -> None:
        self._hold(placement.assignments, workload.queue_id, +1)
        self.admitted_queues.append(workload.queue_id)
        self.fit_at_start.setdefault(_shape(workload), True)  # it fitted with less free than at the start
        self.admissions.append(Admission(workload.id, placement.cluster_id, placement.assignments))

    # -- eviction ------------------------------------------------------------------------------

    def _protected_by_runtime(self, run: LiveRun) -> bool:
        started = run.started_at or run.admitted_at
        if not run.min_runtime_seconds or started is None:
            return False
        return started + timedelta(seconds=run.min_runtime_seconds) > self.now

    def _rebalance_open(self) -> bool:
        policy = self.policy
        if not policy.rebalance or self.rebalanced >= policy.rebalance_max_per_cycle:
            return False
        last = self.snapshot.last_rebalance_at
        return last is None or (self.now - last).total_seconds() >= policy.rebalance_interval_seconds

    def _candidates(self, workload: Workload, kind: EvictionKind) -> list[LiveRun]:
        if kind == "preempt":
            pool = list(self.live_by_queue.get(workload.queue_id, {}).values())
        elif kind == "idle":
            pool = [run for runs in self.live_by_queue.values() for run in runs.values() if run.idle_reclaimable]
        elif kind == "rebalance":
            # Only queues above their guarantee and already ahead of the preemptor's share.
            own_share = self._share(workload.queue_id)
            pool = [
                run
                for queue_id, runs in self.live_by_queue.items()
                if queue_id != workload.queue_id
                and self.ledger.borrowing(queue_id)
                and self._share(queue_id) > own_share
                for run in runs.values()
                if run.priority <= workload.priority
            ]
        else:
            pool = [
                run
                for queue_id, runs in self.live_by_queue.items()
                if queue_id != workload.queue_id and self.ledger.borrowing(queue_id)
                for run in runs.values()
            ]
        runs = []
        for run in pool:
            if not run.preemptible or self._protected_by_runtime(run) or run.workload_id == workload.id:
                continue
            if kind == "preempt" and run.priority >= workload.priority:
                continue
            runs.append(run)
        # Idle runs first, then the lowest priority, then the most recently admitted.
        epoch = datetime.min.replace(tzinfo=self.now.tzinfo)
        runs.sort(
            key=lambda r: (not r.idle, r.priority, -(((r.admitted_at or epoch) - epoch).total_seconds()), r.run_id)
        )
        return runs

    def _evict_for(self, workload: Workload, kind: EvictionKind) -> bool:
        if self.budget <= 0:
            return False
        # Within a cycle, capacity and candidates only shrink until an eviction happens: an attempt
        # that failed for this shape, queue and priority fails again. (A queue that starts
        # borrowing through this cycle's admissions becomes reclaimable from the next cycle.)
        attempt = (kind, workload.queue_id, workload.priority, _shape(workload))
        if attempt in self.failed_evictions:
            return False
        candidates = self._candidates(workload, kind)
        if not candidates:
            self.failed_evictions.add(attempt)
            return False
        best: tuple[list[LiveRun], Placement] | None = None
        for cluster_id in sorted({run.cluster_id for run in candidates}):
            found = self._victims_in_cluster(workload, kind, [r for r in candidates if r.cluster_id == cluster_id])
            if found is not None and (best is None or len(found[0]) < len(best[0])):
                best = found
        if best is None:
            self.failed_evictions.add(attempt)
            return False
        victims, _ = best
        for victim in victims:
            self._evict(victim, workload, kind)
        self.unplaceable.clear()  # capacity grew: shapes that failed may fit now
        self.pending_memo.clear()
        self.failed_evictions.clear()
        placement = self._place(workload, self.free)
        assert isinstance(placement, Placement), "simulated eviction must make room"
        self._admit(workload, placement)
        return True

    def _victims_in_cluster(
        self, workload: Workload, kind: EvictionKind, candidates: list[LiveRun]
    ) -> tuple[list[LiveRun], Placement] | None:
        cluster_id = candidates[0].cluster_id
        trial: FreeCapacity = {
            node_id: dict(self.free[node_id]) for node_id in self.nodes_by_cluster.get(cluster_id, [])
        }
        only = tuple(c for c in self.snapshot.clusters if c.id == cluster_id)
        chosen: list[LiveRun] = []
        placement: Placement | Why | None = None
        limit = self.budget
        if kind == "rebalance":
            limit = min(limit, self.policy.rebalance_max_per_cycle - self.rebalanced)
        try:
            for run in candidates:
                if len(chosen) >= limit:
                    return None
                if kind in ("reclaim", "rebalance") and not self.ledger.borrowing(run.queue_id):
                    continue  # its queue is back within its guarantee: the rest is not borrowed
                self._release_trial(run, trial)
                chosen.append(run)
                placement = self._place(workload, trial, only)
                if isinstance(placement, Placement) and self._may_evict_for(workload, kind, placement, chosen):
                    break
            else:
                return None
            for run in reversed(list(chosen)):  # minimise: drop every victim the gang does not need
                self._restore_trial(run, trial)
                chosen.remove(run)
                again = self._place(workload, trial, only)
                if isinstance(again, Placement) and self._may_evict_for(workload, kind, again, chosen):
                    placement = again
                else:
                    self._release_trial(run, trial)
                    chosen.append(run)
            assert isinstance(placement, Placement)
            return sorted(chosen, key=lambda r: r.run_id), placement
        finally:
            for run in chosen:
                self._restore_trial(run, trial)

    def _may_evict_for(
        self, workload: Workload, kind: EvictionKind, placement: Placement, victims: list[LiveRun]
    ) -> bool:
        """Reclaim only restores a guarantee: with the victims gone, the gang must fit within the
        guarantee of its queue and of every ancestor that declares one. Nobody evicts to borrow."""
        if kind in ("preempt", "idle"):
            return True  # the gang's own placement already passed every quota rule
        held = usage_of(placement.assignments, self.pool_of_node)
        if kind == "reclaim":
            return self.ledger.within_guarantee(workload.queue_id, held)
        # Rebalance: afterwards the preemptor's queue must not have a higher share than any queue
        # it takes from. Candidates come only from queues strictly ahead, so the victims' queues
        # cannot take the capacity back next cycle (no ping-pong).
        after = self._compute_share(workload.queue_id, extra=held)
        return all(after <= self._compute_share(queue_id) for queue_id in {v.queue_id for v in victims})

    def _release_trial(self, run: LiveRun, trial: FreeCapacity) -> None:
        self._hold(run.assignments, run.queue_id, -1, free=trial)
        self.ledger.charge(run.queue_id, usage_of(run.assignments, self.pool_of_node), -1)

    def _restore_trial(self, run: LiveRun, trial: FreeCapacity) -> None:
        self._hold(run.assignments, run.queue_id, +1, free=trial)
        self.ledger.charge(run.queue_id, usage_of(run.assignments, self.pool_of_node), +1)

    def _evict(self, victim: LiveRun, beneficiary: Workload, kind: EvictionKind) -> None:
        self._hold(victim.assignments, victim.queue_id, -1)
        del self.live[victim.run_id or victim.workload_id]
        del self.live_by_queue[victim.queue_id][victim.run_id or victim.workload_id]
        self.budget -= 1
        if kind is EvictionKind.REBALANCE:
            self.rebalanced += 1
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
