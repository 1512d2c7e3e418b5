"""Kueue, modelled from its concept pages (ClusterQueue, Cohort, Preemption; kueue.sigs.k8s.io).

- Each simulated queue is a ClusterQueue with one flavor (GPUs); all of them share one cohort.
  nominalQuota = the queue's guarantee; borrowingLimit = the tree's borrowing limit (capped by its
  limit); lendingLimit = the tree's lending limit; unset means unbounded / lend everything.
- BestEffortFIFO: every cycle each ClusterQueue offers one head, its first workload (priority,
  then creation) not marked inadmissible. A head that can neither be admitted nor preempt is
  marked inadmissible and the next one becomes the head in a later cycle; inadmissible workloads
  are requeued when a workload in the cohort finishes or is evicted. No backfill: never more than
  one admission per queue per Kueue cycle, and no room held for a blocked head. Kueue runs its
  cycles back to back, so one simulator cycle runs Kueue cycles until one makes no progress
  (`cycles_per_decision` bounds them).
- Heads are tried in Kueue's order: those that fit without borrowing first, then higher priority,
  then older. A head is admitted when its queue stays within nominal + borrowingLimit, the cohort's
  lendable quota covers what everyone borrows, and the gang fits on the nodes (the simulator's
  stand-in for kube-scheduler binding the admitted pods).
- Preemption when the quota does not fit: withinClusterQueue: LowerPriority (lower-priority
  workloads of its own queue) and reclaimWithinCohort: Any (workloads of queues that borrow), the
  latter only when the head fits inside its own nominal quota. Candidates: other queues' first,
  then lower priority, then the most recently started; taken until the head fits, then those not
  needed are given back (last-added kept). Kueue admits the preemptor once its victims are gone;
  the simulator ends evicted runs at once, so the preemptor starts on their room in the same cycle
  (admitting it a cycle later let other heads take that room and the preemptor evict again).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from controlplane.core.decision import EvictionKind
from controlplane.core.snapshot import Admission, Decision, Eviction
from controlplane.tracesim.queueing.inputs import Fleet
from controlplane.tracesim.queueing.peers.common import (
    FreeGpus,
    QueueQuota,
    eviction,
    queue_quotas,
    usage_by_queue,
    victims_until_fits,
)
from controlplane.tracesim.queueing.scheduler import CycleResult, CycleView, PendingGang, RunningGang


@dataclass(frozen=True)
class KueueConfig:
    reclaim_within_cohort: bool = True  # reclaimWithinCohort: Any
    within_cluster_queue: bool = True  # withinClusterQueue: LowerPriority
    # Kueue runs its cycles back to back; the simulator's cycle cadence is not Kueue's. 1 = one
    # Kueue cycle per simulator cycle (the tests use it to pin one head per queue per cycle).
    cycles_per_decision: int = 10_000


@dataclass
class _Tick:
    """What the cycles run at one instant share."""

    usage: dict[str, float]
    free: FreeGpus
    candidates: list[RunningGang]  # runs not yet chosen as victims
    admissions: list[Admission] = field(default_factory=list)
    evictions: list[Eviction] = field(default_factory=list)
    decided: set[str] = field(default_factory=set)  # admitted at this instant
    cursor: dict[str, int] = field(default_factory=dict)  # queue -> where its head search stopped


class KueueScheduler:
    def __init__(self, fleet: Fleet, config: KueueConfig | None = None) -> None:
        self.config = config or KueueConfig()
        self.quotas = queue_quotas(fleet)
        self.inadmissible: set[str] = set()

    @property
    def name(self) -> str:
        return "kueue"

    @property
    def one_priority(self) -> bool:
        return False

    def decide(self, view: CycleView) -> CycleResult:
        """Kueue's cycles at this instant: back to back (Kueue does not wait between them) until one
        makes no progress, or `cycles_per_decision` of them."""
        if view.ended:  # capacity came back to the cohort: requeue the inadmissible workloads
            self.inadmissible.clear()
        tick = _Tick(
            usage_by_queue(self.quotas, view.running), FreeGpus.of(view.fleet, view.running), list(view.running)
        )
        for _ in range(self.config.cycles_per_decision):
            heads = [head for gangs in view.pending.values() if (head := self._head(gangs, tick)) is not None]
            if not heads or not self._cycle(heads, tick):
                break
        decision = Decision(admissions=tuple(tick.admissions), evictions=tuple(tick.evictions))
        return CycleResult(decision, more=any(self._head(gangs, tick) for gangs in view.pending.values()))

    def _cycle(self, heads: list[PendingGang], tick: _Tick) -> bool:
        """One Kueue cycle over the queues' heads; True when it admitted or set aside a workload."""
        usage = tick.usage
        heads.sort(key=lambda g: (usage[g.queue] + g.gpus > self.quotas[g.queue].nominal, g.order))
        progress = False
        for head in heads:
            admission = tick.free.place(head) if self._quota_fits(head, usage) else None
            if admission is not None:
                tick.free.take(admission.cluster_id, admission.assignments)
                usage[head.queue] += head.gpus
                tick.admissions.append(admission)
                tick.decided.add(head.id)
                progress = True
                continue
            victims = [] if self._quota_fits(head, usage) else self._victims(head, usage, tick.free, tick.candidates)
            if victims:
                # Kueue admits the preemptor once its victims are gone; here they end at once, so it
                # starts on their room in this cycle (else another head could take that room first).
                tick.evictions.extend(eviction(v, _kind(v, head), head) for v in victims)
                for victim in victims:
                    tick.free.give(victim.run.cluster_id, victim.run.assignments)
                    usage[victim.queue] -= victim.gpus
                taken = {v.run_id for v in victims}
                tick.candidates = [c for c in tick.candidates if c.run_id not in taken]
                admission = tick.free.place(head)
                assert admission is not None, "victims were chosen until the head fits"
                tick.free.take(admission.cluster_id, admission.assignments)
                usage[head.queue] += head.gpus
                tick.admissions.append(admission)
                tick.decided.add(head.id)
                progress = True
            else:
                self.inadmissible.add(head.id)
                progress = True
        return progress

    def _head(self, gangs: Sequence[PendingGang], tick: _Tick) -> PendingGang | None:
        """The queue's first workload neither admitted at this instant nor set aside. Both sets only
        grow within an instant, so the search resumes where it stopped (one pass per instant)."""
        if not gangs:
            return None
        queue = gangs[0].queue
        at = tick.cursor.get(queue, 0)
        while at < len(gangs) and (gangs[at].id in self.inadmissible or gangs[at].id in tick.decided):
            at += 1
        tick.cursor[queue] = at
        return gangs[at] if at < len(gangs) else None

    def _ceiling(self, quota: QueueQuota) -> float:
        ceiling = float("inf") if quota.borrowing_limit is None else quota.nominal + quota.borrowing_limit
        return ceiling if quota.limit is None else min(ceiling, quota.limit)

    def _quota_fits(self, gang: PendingGang, usage: Mapping[str, float]) -> bool:
        quota = self.quotas[gang.queue]
        if usage[gang.queue] + gang.gpus > self._ceiling(quota):
            return False
        lendable = 0.0
        borrowed = 0.0
        for name, q in self.quotas.items():
            lends = q.nominal if q.lending_limit is None else min(q.nominal, q.lending_limit)
            lendable += lends
            used = usage[name] + (gang.gpus if name == gang.queue else 0)
            borrowed += max(0.0, used - (q.nominal - lends))  # beyond what it keeps for itself
        return borrowed <= lendable + 1e-9

    def _victims(
        self, head: PendingGang, usage: dict[str, float], free: FreeGpus, candidates: list[RunningGang]
    ) -> list[RunningGang]:
        quota = self.quotas[head.queue]
        within_nominal = usage[head.queue] + head.gpus <= quota.nominal
        pool = [
            c
            for c in candidates
            if (c.queue == head.queue and self.config.within_cluster_queue and c.priority < head.priority)
            or (
                c.queue != head.queue
                and self.config.reclaim_within_cohort
                and within_nominal
                and usage[c.queue] > self.quotas[c.queue].nominal
            )
        ]
        pool.sort(key=lambda c: (c.queue == head.queue, c.priority, -c.start, c.run_id))

        def still_eligible(candidate: RunningGang, left: Mapping[str, float]) -> bool:
            # A victim of another queue only while that queue still borrows.
            return candidate.queue == head.queue or left[candidate.queue] > self.quotas[candidate.queue].nominal

        return victims_until_fits(head, pool, free, usage, still_eligible, lambda left: self._quota_fits(head, left))


def _kind(victim: RunningGang, head: PendingGang) -> EvictionKind:
    return EvictionKind.PREEMPT if victim.queue == head.queue else EvictionKind.RECLAIM
