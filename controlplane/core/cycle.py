"""One scheduling cycle: park what the fleet's state blocks, then the rest in fair-share order,
the least disruptive action first.

First every pending gang that a limit (or its guarantee) blocks for the whole cycle, with no
eviction open to it, is parked (`parking.py`): left pending with that reason, outside the order.
Then the candidates, in fair-share order; the actions, in their fixed order, for one gang:
1. admit it where a placement on free nodes passes every quota rule (or backfill a reservation,
   or borrow the capacity one holds: `reservation.py`); else take back what its own reservation
   lent, when that makes room;
2. reclaim GPUs the idle policy marked reclaimable (any queue);
3. reclaim capacity other queues borrowed, if its queue stays within its guarantee;
4. preempt lower-priority gangs of its own queue;
5. rebalance toward a queue below its fair share (opt-in, rate-limited);
6. reserve the nodes that free up first (head of its queue), and leave it pending with a reason.

Within a cycle free capacity only shrinks and usage only grows until an eviction, so answers are
remembered per shape (and per queue, priority and flags) until capacity grows (`_capacity_grew`,
the one place those memos are forgotten).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime

from controlplane.core.decision import (
    Admission,
    BehindHeads,
    EvictionKind,
    FairShareTurn,
    NeverFits,
    NoFit,
    PendingKind,
    PendingReason,
    QuotaLimit,
    ReservationNote,
    Why,
)
from controlplane.core.eviction import Evictor
from controlplane.core.fit import Fitter
from controlplane.core.fragmentation import WorkloadMix, workload_mix
from controlplane.core.gang_facts import ShapeId
from controlplane.core.ordering import FairShare
from controlplane.core.parking import Parked, ParkingClass, class_of, park, queue_order, split_queue
from controlplane.core.placement import FreeCapacity, Placement, copy_capacity
from controlplane.core.reservation import Reservations
from controlplane.core.scoring import Scorer
from controlplane.core.snapshot import Policy, Snapshot
from controlplane.core.state import CycleState
from controlplane.domain.model import GPU_EQ, Workload

# The expected next pod (for fragmentation) is estimated from the oldest pending gangs; a deep
# backlog adds nothing the first few thousand do not already say.
MIX_SAMPLE = 5000

# Why a gang waits, and the reservation it holds or waits behind (if any).
Verdict = tuple[Why, ReservationNote | None]


class Cycle:
    def __init__(
        self,
        snapshot: Snapshot,
        policy: Policy,
        now: datetime,
        state: CycleState | None = None,
        candidates: Sequence[Workload] | None = None,
        mix_of: Callable[[Sequence[Workload]], WorkloadMix | None] = workload_mix,
    ) -> None:
        """`state` is the fleet state kept across cycles (`incremental.py`), already matching the
        snapshot; by default a fresh one is built from the snapshot. `candidates`: the pending
        gangs not parked, when the caller parked the rest itself (and keeps their reasons);
        by default the cycle parks every pending gang of the snapshot first. `mix_of`: how the
        expected next pod is worked out from the oldest pending gangs (a kept `KeptMix.of`)."""
        self.snapshot = snapshot
        self.policy = policy
        if state is None:
            state = CycleState(snapshot, policy)
        else:
            state.begin_cycle(policy)
        self.state = state
        self.fair_share = FairShare(snapshot, policy, now, self.state)
        scorer = Scorer(policy, self.state, mix_of(snapshot.pending[:MIX_SAMPLE]))
        self.fitter = Fitter(snapshot, policy, self.state, scorer)
        self.evictor = Evictor(snapshot, policy, now, self.state, self.fitter, self.fair_share, self._capacity_grew)
        self.reservations = Reservations(snapshot, policy, now, self.state, self.fitter)
        self.candidates = candidates
        self.admissions: list[Admission] = []
        self.pending: list[PendingReason] = []
        self.positions: dict[str, int] = {}  # queue id -> candidates of it left pending so far
        # (queue, priority, flags, runtimes, shape) -> the verdict of a gang exactly like it
        self.verdicts: dict[tuple[object, ...], Verdict] = {}
        # Free capacity as the cycle found it: a gang that would have fit there but not after this
        # cycle's admissions waits on fair share, not on the fleet (`_fair_share_reason`).
        self.initial_free: FreeCapacity = copy_capacity(self.state.free)
        self.fit_at_start: dict[ShapeId, bool] = {}
        self.admitted_queues: list[str] = []
        self.awaiting: set[str] = set()  # queues with a gang within guarantee left waiting for room

    def _capacity_grew(self) -> None:
        """An eviction freed capacity: shapes, verdicts and eviction attempts that failed may succeed now."""
        self.fitter.capacity_grew()
        self.verdicts.clear()
        self.evictor.forget_failures()

    def run(self) -> tuple[Workload, Exception] | None:
        """Decide every pending gang in order; on the first gang that raises, undo what it added
        to the decision and return it with the exception (the working state is then unreliable)."""
        evictions = self.evictor.evictions
        candidates = self.candidates
        if candidates is None:
            candidates = self.candidates = self.park_all()
        for workload in self.fair_share.order(candidates):
            marks = (len(self.admissions), len(self.pending), len(evictions))
            try:
                verdict = self.try_admit(workload)
                if verdict is not None:
                    self.leave_pending(workload, verdict)
            except Exception as exc:  # one gang must never fail the cycle for the fleet
                del self.admissions[marks[0] :], self.pending[marks[1] :], evictions[marks[2] :]
                return workload, exc
        return None

    def park_all(self) -> list[Workload]:
        """Leave every gang parked at the start of the cycle pending (`parking.py`; asked once
        per class); the rest, the candidates. A gang whose class cannot be worked out is a
        candidate: the ordered pass sets it aside with its error."""
        answers: dict[ParkingClass, Parked] = {}
        candidates: list[Workload] = []
        by_queue: dict[str, list[tuple[Workload, Parked]]] = {}
        for workload in self.snapshot.pending:
            try:
                gang = class_of(self.state, workload)
                answer = answers.get(gang)
                if answer is None:
                    answer = answers[gang] = park(self.state, self.policy, gang)
            except Exception:
                candidates.append(workload)
                continue
            by_queue.setdefault(workload.queue_id, []).append((workload, answer))
        heads = self.policy.heads_per_queue
        for queue_id in sorted(by_queue):
            gangs = sorted(by_queue[queue_id], key=lambda item: queue_order(item[0]))
            split = split_queue(gangs, heads)
            candidates.extend(split.candidates)
            self.pending.extend(PendingReason(workload.id, why) for workload, why in split.parked)
            if split.behind:
                behind = BehindHeads(self._queue_name(queue_id), heads)
                self.pending.extend(PendingReason(workload.id, behind) for workload in split.behind)
        return candidates

    def _queue_name(self, queue_id: str) -> str:
        tree = self.snapshot.queue_tree
        return tree[queue_id].name if queue_id in tree else queue_id

    def leave_pending(self, workload: Workload, verdict: Verdict) -> None:
        self.positions[workload.queue_id] = self.positions.get(workload.queue_id, 0) + 1
        self.pending.append(PendingReason(workload.id, verdict[0], verdict[1]))

    def try_admit(self, workload: Workload) -> Verdict | None:
        """Admit the gang (maybe after evictions); the pending reason when it cannot be.

        A gang exactly like one already left pending (same queue, priority, flags, runtimes and shape) is
        left pending for the same reason without trying again: deep backlogs of look-alike gangs
        cost a dictionary lookup each.
        """
        key = (
            workload.queue_id,
            workload.priority,
            workload.preemptible,
            workload.may_evict,
            workload.max_runtime_seconds,
            workload.min_runtime_seconds,  # whether it may borrow reserved capacity
            self.state.facts.shape_id(workload),
        )
        known = self.verdicts.get(key)
        if known is not None:
            return known
        verdict = self._decide(workload)
        # A fair-share reason names the queues that went ahead, which grow during the cycle.
        if verdict is not None and verdict[0].kind is not PendingKind.FAIR_SHARE:
            self.verdicts[key] = verdict
        return verdict

    def _decide(self, workload: Workload) -> Verdict | None:
        ledger = self.state.ledger
        wanted = {GPU_EQ: self.state.facts.least(workload)}
        # The limits and guarantee that block it now: the rule parking reads at the cycle's start.
        blocked = park(self.state, self.policy, class_of(self.state, workload)).why
        if isinstance(blocked, QuotaLimit) and blocked.never:
            return blocked, None  # nothing that ends or is evicted lifts a limit it exceeds alone
        if blocked is None:
            outcome = self.fitter.place(workload)
            if isinstance(outcome, Placement):
                self._admit(workload, outcome)
                return None
            if self.reservations.backfill(workload, self._admit):
                return None
            reason = outcome
        else:
            reason = blocked
        if isinstance(reason, NeverFits):
            return reason, None  # no eviction or reservation can make room the fleet does not have
        no_fit = blocked is None and isinstance(reason, NoFit)
        if not workload.may_evict:
            return (reason, self.reservations.reserve(workload)) if no_fit else (reason, None)
        # Ancestors are checked with the victims gone (their usage counts there too). A queue under
        # its guarantee may reclaim even when a team's or cohort's limit blocks it: borrowers under
        # that ancestor use up the limit, and evicting them lowers it (its own limit still holds).
        past_limit = isinstance(blocked, QuotaLimit) and ledger.ancestor_limit_block(workload.queue_id, wanted)
        # A queue without a guarantee of its own reclaims the one its team (or cohort) holds.
        reclaimable = (blocked is None or bool(past_limit)) and ledger.within_shared_guarantee(
            workload.queue_id, wanted, holder_only=True
        )
        tried: list[EvictionKind] = []
        # Preempting its own lower-priority runs may bring the queue back within its guarantee:
        # then a set mixing both kinds is tried when neither alone made room.
        combinable = (
            self.policy.reclaim
            and self.policy.preemption
            and (blocked is None or bool(past_limit))
            and ledger.guarantee_holder(workload.queue_id) is not None
        )
        for kind, allowed, combined in (
            (EvictionKind.TAKE_BACK, blocked is None and bool(self.state.lent_to(workload.id)), False),
            (EvictionKind.IDLE, blocked is None, False),
            (EvictionKind.RECLAIM, self.policy.reclaim and reclaimable, False),
            (EvictionKind.PREEMPT, self.policy.preemption, False),
            (EvictionKind.RECLAIM, combinable, True),
            (EvictionKind.REBALANCE, blocked is None and self.evictor.rebalance_open(), False),
        ):
            if allowed:
                if kind not in tried:
                    tried.append(kind)
                placement = self.evictor.make_room(workload, kind, combined)
                if placement is not None:
                    self._admit(workload, placement)
                    return None
        if no_fit:
            if reclaimable:
                self._await_guarantee(workload, wanted[GPU_EQ])
            why = self._fair_share_reason(workload) or self._protected_note(workload, reason, tuple(tried))
            return why, self.reservations.reserve(workload)
        return reason, None

    def _await_guarantee(self, workload: Workload, amount: int) -> None:
        """A gang within its (team's) guarantee waits for room: that much of the guarantee is not
        lent to borrowers for the rest of the cycle, so nothing is admitted there only to be
        reclaimed for it next cycle. One gang per queue (its first to wait) counts."""
        if workload.queue_id in self.awaiting:
            return
        self.awaiting.add(workload.queue_id)
        ledger, awaited = self.state.ledger, self.state.awaited
        depth = ledger.guarantee_holder(workload.queue_id)
        if depth is None:
            return
        holder = ledger.chain(workload.queue_id)[depth].id
        # Kept only on the GPU models it can use: capacity it could never take is still lent.
        for model in self.fitter.gpu_models(workload):
            awaited[(holder, model)] = awaited.get((holder, model), 0) + amount

    def _protected_note(self, workload: Workload, reason: Why, kinds: tuple[EvictionKind, ...]) -> Why:
        """The no-room reason, naming the runs a minimum runtime protects when evicting them would
        have made room (the gang waits for that protection to end, not for work to end)."""
        if not isinstance(reason, NoFit) or not kinds:
            return reason
        held = self.evictor.held_by_min_runtime(workload, kinds)
        if held is None:
            return reason
        return replace(reason, protected=held[0], protected_until=held[1])

    def _fair_share_reason(self, workload: Workload) -> FairShareTurn | None:
        """When the gang fitted the free capacity at the start of the cycle and queues ordered ahead
        of it by fair share took that capacity, say so: it waits its turn, the fleet is not too small."""
        others = [q for q in dict.fromkeys(self.admitted_queues) if q != workload.queue_id]
        if not self.policy.fair_share or not others:
            return None
        shape = self.state.facts.shape_id(workload)
        if shape not in self.fit_at_start:
            # Trying the start-of-cycle capacity costs a placement: only for the head of a queue
            # (the one whose turn it is); behind it a gang waits on its queue anyway.
            if self.positions.get(workload.queue_id, 0):
                return None
            placed = self.fitter.place(workload, self.initial_free, use_cache=False)
            self.fit_at_start[shape] = isinstance(placed, Placement)
        if not self.fit_at_start[shape]:
            return None
        tree = self.snapshot.queue_tree
        names = tuple(tree[q].name if q in tree else q for q in others[:3])
        own = tree[workload.queue_id].name if workload.queue_id in tree else workload.queue_id
        share = float(self.fair_share.share(workload.queue_id))
        return FairShareTurn(own, share, names, max(0, len(others) - 3))

    def _admit(self, workload: Workload, placement: Placement, lent_to: str | None = None) -> None:
        self.state.take(placement.assignments, workload.queue_id)
        self.admitted_queues.append(workload.queue_id)
        self.fit_at_start.setdefault(
            self.state.facts.shape_id(workload), True
        )  # it fitted with less free than at the start
        self.admissions.append(Admission(workload.id, placement.cluster_id, placement.assignments, lent_to))
