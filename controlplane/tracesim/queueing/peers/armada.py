"""Armada, modelled from its documentation (armadaproject.io: core concepts — queues, priority
factor, fair share over active queues; the scheduler's preemption and rate-limit settings).

- Fair share: a queue is active when it has jobs queued or running; each active queue's fair
  share is its weight over the active queues' weights (weight = the queue's guarantee, so the
  inverse of Armada's priority factor follows the same entitlements as the other policies; no
  guarantee is reserved). The demand-capped (adjusted) fair share gives what a queue that asks
  for less leaves to the others. With one resource (GPUs) the dominant-resource share is the GPU
  share.
- Each cycle is a round: the queue to serve next is the one whose cost (share of the fleet after
  its next job, over its weight) is lowest; within a queue, priority then submission. A gang is
  placed whole or not at all; a job that does not fit is skipped for the round and the queue's
  next is tried (up to `max_queue_lookback` misses per queue).
- Fair-share preemption: every running job of a queue holding more than
  `protected_fraction_of_fair_share` * its adjusted fair share is evicted for the round and
  offered again, ahead of its queue's queued jobs, but only on the nodes it ran on; until every
  evicted job has been offered, only queued jobs that keep their queue within its fair share are
  offered. The evicted jobs not placed back (such queued work took their room) are preempted.
- Rate limits: token buckets for the whole scheduler (`maximum_scheduling_rate` jobs/s, burst
  `maximum_scheduling_burst`) and per queue; each newly scheduled job takes a token, jobs put back
  where they ran take none. Armada has no separate preemption rate: since a job is preempted only
  to make room for a newly scheduled one, the scheduling rate bounds it.
- Not modelled: several pools/executors, priority classes with their own preemption rules,
  per-round resource caps (`maximumResourceFractionToSchedule`), gang node uniformity labels.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from controlplane.core.decision import EvictionKind
from controlplane.core.snapshot import Admission, Decision, Eviction
from controlplane.tracesim.queueing.inputs import Fleet
from controlplane.tracesim.queueing.peers.common import (
    FreeGpus,
    eviction,
    queue_quotas,
    usage_by_queue,
)
from controlplane.tracesim.queueing.scheduler import CycleResult, CycleView, PendingGang, RunningGang
from controlplane.tracesim.queueing.water_filling import shares_by_weight


@dataclass(frozen=True)
class ArmadaConfig:
    protected_fraction_of_fair_share: float = 1.0
    maximum_scheduling_rate: float = 100.0  # jobs per second, whole scheduler
    maximum_scheduling_burst: float = 1000.0
    maximum_per_queue_scheduling_rate: float = 50.0
    maximum_per_queue_scheduling_burst: float = 1000.0
    max_queue_lookback: int = 1000
    preemption: bool = True


class TokenBucket:
    def __init__(self, rate: float, burst: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.at: float | None = None

    def refill(self, now: float) -> None:
        if self.at is not None:
            self.tokens = min(self.burst, self.tokens + self.rate * (now - self.at))
        self.at = now


class ArmadaScheduler:
    def __init__(self, fleet: Fleet, config: ArmadaConfig | None = None) -> None:
        self.config = config or ArmadaConfig()
        self.quotas = queue_quotas(fleet)
        guaranteed = any(q.nominal > 0 for q in self.quotas.values())
        self.weights = {name: (q.nominal if guaranteed else q.weight) for name, q in self.quotas.items()}
        self.capacity = float(fleet.capacity_gpus)
        self.bucket = TokenBucket(self.config.maximum_scheduling_rate, self.config.maximum_scheduling_burst)
        self.queue_buckets = {
            name: TokenBucket(
                self.config.maximum_per_queue_scheduling_rate, self.config.maximum_per_queue_scheduling_burst
            )
            for name in self.quotas
        }

    @property
    def name(self) -> str:
        return "armada"

    @property
    def one_priority(self) -> bool:
        return False

    def adjusted_fair_share(self, view: CycleView, allocated: Mapping[str, float]) -> dict[str, float]:
        demand = {name: allocated[name] + sum(g.gpus for g in view.pending.get(name, ())) for name in self.quotas}
        active = {name: self.weights[name] for name in self.quotas if demand[name] > 0}
        return shares_by_weight(active, demand, self.capacity)

    def decide(self, view: CycleView) -> CycleResult:
        self.bucket.refill(view.now)
        for bucket in self.queue_buckets.values():
            bucket.refill(view.now)
        allocated = usage_by_queue(self.quotas, view.running)
        fair = self.adjusted_fair_share(view, allocated)
        free = FreeGpus.of(view.fleet, view.running)
        evicted: dict[str, list[RunningGang]] = {name: [] for name in self.quotas}
        if self.config.preemption:
            over = {
                q
                for q in self.quotas
                if allocated[q] > self.config.protected_fraction_of_fair_share * fair.get(q, 0.0) + 1e-9
            }
            for gang in sorted(view.running, key=lambda g: (g.start, g.run_id)):
                if gang.queue in over:
                    evicted[gang.queue].append(gang)
            for gangs in evicted.values():
                for gang in gangs:
                    free.give(gang.run.cluster_id, gang.run.assignments)
                    allocated[gang.queue] -= gang.gpus
        queued = {name: list(view.pending.get(name, ())) for name in self.quotas}
        misses = dict.fromkeys(self.quotas, 0)
        admissions: list[Admission] = []
        preempted: list[RunningGang] = []
        first_new: PendingGang | None = None

        def next_of(name: str) -> RunningGang | PendingGang | None:
            if evicted[name]:
                return evicted[name][0]
            if queued[name] and misses[name] < self.config.max_queue_lookback and self._has_token(name):
                job = queued[name][0]
                # Room of evicted jobs goes only to queues that stay within their fair share.
                within = allocated[name] + job.gpus <= fair.get(name, 0.0) + 1e-9
                if within or not any(evicted.values()):
                    return job
            return None

        while True:
            offers = [(name, job) for name in self.quotas if (job := next_of(name)) is not None]
            if not offers:
                break
            name, job = min(offers, key=lambda o: (self._cost(o[0], allocated, o[1].gpus), o[0]))
            if isinstance(job, RunningGang):
                evicted[name].pop(0)
                if free.holds(job.run.cluster_id, job.run.assignments):
                    free.take(job.run.cluster_id, job.run.assignments)
                    allocated[name] += job.gpus
                else:
                    preempted.append(job)
                continue
            queued[name].pop(0)
            admission = free.place_and_take(job)
            if admission is None:
                misses[name] += 1
                continue
            allocated[name] += job.gpus
            self.bucket.tokens -= 1
            self.queue_buckets[name].tokens -= 1
            admissions.append(admission)
            first_new = first_new or job
        rate_limited = any(queued[name] and not self._has_token(name) for name in self.quotas)
        evictions: list[Eviction] = [eviction(v, EvictionKind.REBALANCE, first_new) for v in preempted]
        return CycleResult(Decision(admissions=tuple(admissions), evictions=tuple(evictions)), more=rate_limited)

    def _has_token(self, name: str) -> bool:
        return self.bucket.tokens >= 1 and self.queue_buckets[name].tokens >= 1

    def _cost(self, name: str, allocated: Mapping[str, float], gpus: int) -> float:
        weight = self.weights[name]
        share = (allocated[name] + gpus) / self.capacity
        return share / weight if weight > 0 else float("inf")
