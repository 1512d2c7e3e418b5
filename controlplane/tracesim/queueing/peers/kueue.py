"""Kueue, modelled from its concept pages (ClusterQueue, Cohort, Preemption; kueue.sigs.k8s.io).

- Each simulated queue is a ClusterQueue with one flavor (GPUs); all of them share one cohort.
  nominalQuota = the queue's guarantee; borrowingLimit = the tree's borrowing limit (capped by its
  limit); lendingLimit = the tree's lending limit; unset means unbounded / lend everything.
- BestEffortFIFO: every cycle each ClusterQueue offers one head, its first workload (priority,
  then creation) not marked inadmissible. A head that cannot be admitted and cannot preempt is
  marked inadmissible and the next one becomes the head in a later cycle; inadmissible workloads
  are requeued when a workload in the cohort finishes or is evicted. No backfill: never more than
  one admission per queue per cycle.
- Heads are tried in Kueue's order: those that fit without borrowing first, then higher priority,
  then older. A head is admitted when its queue stays within nominal + borrowingLimit, the cohort's
  lendable quota covers what everyone borrows, and the gang fits on the nodes (the simulator's
  stand-in for kube-scheduler binding the admitted pods).
- Preemption when the quota does not fit: withinClusterQueue: LowerPriority (lower-priority
  workloads of its own queue) and reclaimWithinCohort: Any (workloads of queues that borrow), the
  latter only when the head fits inside its own nominal quota. Candidates: other queues' first,
  then lower priority, then the most recently started; taken until the head fits, then those not
  needed are given back (last-added kept). The preemptor is admitted in a later cycle, once its
  victims are gone; resources of runs evicted in this cycle are not handed to anyone else in it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

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
        if view.ended:  # capacity came back to the cohort: requeue the inadmissible workloads
            self.inadmissible.clear()
        usage = usage_by_queue(self.quotas, view.running)
        free = FreeGpus.of(view.fleet, view.running)
        heads = [head for gangs in view.pending.values() if (head := self._head(gangs)) is not None]
        heads.sort(key=lambda g: (usage[g.queue] + g.gpus > self.quotas[g.queue].nominal, g.order))
        candidates = list(view.running)
        admissions: list[Admission] = []
        evictions: list[Eviction] = []
        parked = 0
        for head in heads:
            admission = free.place(head) if self._quota_fits(head, usage) else None
            if admission is not None:
                free.take(admission.cluster_id, admission.assignments)
                usage[head.queue] += head.gpus
                admissions.append(admission)
                continue
            victims = [] if self._quota_fits(head, usage) else self._victims(head, usage, free, candidates)
            if victims:
                evictions.extend(eviction(v, _kind(v, head), head) for v in victims)
                taken = {v.run_id for v in victims}
                candidates = [c for c in candidates if c.run_id not in taken]
            else:
                self.inadmissible.add(head.id)
                parked += 1
        admitted = {a.workload_id for a in admissions}
        waiting = any(
            g.id not in self.inadmissible and g.id not in admitted for gangs in view.pending.values() for g in gangs
        )
        changed = bool(admissions or evictions or parked)
        return CycleResult(Decision(admissions=tuple(admissions), evictions=tuple(evictions)), changed and waiting)

    def _head(self, gangs: Sequence[PendingGang]) -> PendingGang | None:
        return next((gang for gang in gangs if gang.id not in self.inadmissible), None)

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
