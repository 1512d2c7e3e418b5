"""Volcano, modelled from its documentation (volcano.sh: Queue, PodGroup, the proportion and gang
plugins, the allocate / preempt / reclaim actions; the capacity-plugin user guide).

- Each simulated queue is a Volcano Queue. proportion plugin: a queue's `deserved` share is the
  fleet divided by weight among the queues that ask for something, no queue above its request
  (what it holds plus what it has pending) or its capability, and what a capped queue leaves going
  to the others. Weight = the queue's guarantee (its weight in the tree when nobody has one), so
  `deserved` follows the same entitlements as everyone else; capability = the tree's limit.
- allocate: queues are served lowest share first (allocated / deserved), one job at a time, the
  share recomputed after each; a queue whose allocation has reached its deserved share is
  overused and gets nothing more this session. Jobs in a queue: priority, then creation. gang:
  a job starts only with all its pods placed (minAvailable = all), else it stays pending and the
  queue's next job is tried (no reservation: smaller jobs pass a big one).
- preempt: a starving job may evict lower-priority jobs of its own queue.
- reclaim: a starving job of a queue that stays within its deserved share with it (the capacity
  plugin's preemptive check) may evict jobs of queues whose allocation is above their deserved
  share, lowest priority and newest first, each only while its queue is still above; whole jobs
  are evicted (gang: never below minAvailable; whole-gang eviction as in Volcano 1.15's gang-aware
  preemption). The preemptor is pipelined onto the room its victims leave and starts in the same
  session (the simulator ends evicted runs at once).
- Not modelled: enqueue (jobs are Inqueue at once), the backfill action (best-effort pods only),
  hierarchical queues, node-order plugins beyond the shared best-fit placement.
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
    victims_until_fits,
)
from controlplane.tracesim.queueing.scheduler import CycleResult, CycleView, PendingGang, RunningGang
from controlplane.tracesim.queueing.water_filling import shares_by_weight


@dataclass(frozen=True)
class VolcanoConfig:
    preempt: bool = True
    reclaim: bool = True


class VolcanoScheduler:
    def __init__(self, fleet: Fleet, config: VolcanoConfig | None = None) -> None:
        self.config = config or VolcanoConfig()
        self.quotas = queue_quotas(fleet)
        guaranteed = any(q.nominal > 0 for q in self.quotas.values())
        self.weights = {name: (q.nominal if guaranteed else q.weight) for name, q in self.quotas.items()}
        self.capability = {name: (float("inf") if q.limit is None else q.limit) for name, q in self.quotas.items()}
        self.capacity = float(fleet.capacity_gpus)
        self.pipelined: list[Admission] = []  # this session's preemptors, started on their victims' room

    @property
    def name(self) -> str:
        return "volcano"

    @property
    def one_priority(self) -> bool:
        return False

    def deserved(self, view: CycleView, allocated: Mapping[str, float]) -> dict[str, float]:
        request = {
            name: min(self.capability[name], allocated[name] + sum(g.gpus for g in view.pending.get(name, ())))
            for name in self.quotas
        }
        return shares_by_weight(self.weights, request, self.capacity)

    def decide(self, view: CycleView) -> CycleResult:
        allocated = usage_by_queue(self.quotas, view.running)
        deserved = self.deserved(view, allocated)
        free = FreeGpus.of(view.fleet, view.running)
        admissions = self._allocate(view, allocated, deserved, free)
        started = {a.workload_id for a in admissions}
        starving = {name: [g for g in gangs if g.id not in started] for name, gangs in view.pending.items()}
        candidates = list(view.running)
        evictions: list[Eviction] = []
        self.pipelined = []
        if self.config.preempt:
            evictions += self._preempt(starving, candidates, allocated, free)
        if self.config.reclaim:
            placed = {a.workload_id for a in self.pipelined}
            starving = {name: [g for g in gangs if g.id not in placed] for name, gangs in starving.items()}
            evicted = {e.run_id for e in evictions}
            candidates = [c for c in candidates if c.run_id not in evicted]
            evictions += self._reclaim(starving, candidates, allocated, deserved, free)
        admissions += self.pipelined
        return CycleResult(Decision(admissions=tuple(admissions), evictions=tuple(evictions)))

    def _overused(self, name: str, allocated: Mapping[str, float], deserved: Mapping[str, float]) -> bool:
        return allocated[name] >= deserved[name] - 1e-9

    def _allocate(
        self, view: CycleView, allocated: dict[str, float], deserved: Mapping[str, float], free: FreeGpus
    ) -> list[Admission]:
        admissions: list[Admission] = []
        next_job = {name: 0 for name, gangs in view.pending.items() if gangs}
        while next_job:
            name = min(next_job, key=lambda q: (allocated[q] / deserved[q] if deserved[q] > 0 else float("inf"), q))
            gangs = view.pending[name]
            if self._overused(name, allocated, deserved) or next_job[name] >= len(gangs):
                del next_job[name]
                continue
            gang = gangs[next_job[name]]
            next_job[name] += 1
            if allocated[name] + gang.gpus > self.capability[name]:
                continue
            admission = free.place_and_take(gang)
            if admission is not None:
                allocated[name] += gang.gpus
                admissions.append(admission)
        return admissions

    def _preempt(
        self,
        starving: Mapping[str, list[PendingGang]],
        candidates: list[RunningGang],
        allocated: dict[str, float],
        free: FreeGpus,
    ) -> list[Eviction]:
        evictions: list[Eviction] = []
        failed: set[tuple[str, int, int, int]] = set()  # (queue, GPUs per pod, pods, priority) with no victims
        for name in sorted(starving):
            for gang in starving[name]:
                key = (name, gang.gpus_per_pod, gang.pods, gang.priority)
                if key in failed:
                    continue  # nothing changed since the same ask found no victims
                pool = [c for c in _victim_order(candidates) if c.queue == name and c.priority < gang.priority]
                victims = victims_until_fits(gang, pool, free, allocated, lambda _c, _u: True, lambda _u: True)
                if victims:
                    evictions += self._pipeline(gang, victims, EvictionKind.PREEMPT, candidates, allocated, free)
                    failed.clear()
                else:
                    failed.add(key)
        return evictions

    def _reclaim(
        self,
        starving: Mapping[str, list[PendingGang]],
        candidates: list[RunningGang],
        allocated: dict[str, float],
        deserved: Mapping[str, float],
        free: FreeGpus,
    ) -> list[Eviction]:
        evictions: list[Eviction] = []

        def above_deserved(candidate: RunningGang, left: Mapping[str, float]) -> bool:
            return left[candidate.queue] > deserved[candidate.queue] + 1e-9

        failed: set[tuple[str, int, int]] = set()  # (queue, GPUs per pod, pods) with no victims
        order = sorted(starving, key=lambda q: (allocated[q] / deserved[q] if deserved[q] > 0 else float("inf"), q))
        for name in order:
            for gang in starving[name]:
                if not any(above_deserved(c, allocated) for c in candidates):
                    return evictions  # no queue holds more than it deserves: nothing to reclaim
                if allocated[name] + gang.gpus > deserved[name] + 1e-9:
                    break  # this queue would go over its deserved share: it reclaims no more
                key = (name, gang.gpus_per_pod, gang.pods)
                if key in failed:
                    continue
                pool = [c for c in _victim_order(candidates) if c.queue != name]
                victims = victims_until_fits(gang, pool, free, allocated, above_deserved, lambda _u: True)
                if victims:
                    evictions += self._pipeline(gang, victims, EvictionKind.RECLAIM, candidates, allocated, free)
                    failed.clear()
                else:
                    failed.add(key)
        return evictions

    def _pipeline(
        self,
        gang: PendingGang,
        victims: list[RunningGang],
        kind: EvictionKind,
        candidates: list[RunningGang],
        allocated: dict[str, float],
        free: FreeGpus,
    ) -> list[Eviction]:
        """Evict the victims and start the preemptor on the room they leave, in this session."""
        for victim in victims:
            free.give(victim.run.cluster_id, victim.run.assignments)
            allocated[victim.queue] -= victim.gpus
        admission = free.place_and_take(gang)
        assert admission is not None, "victims were chosen until the gang fits"
        self.pipelined.append(admission)
        allocated[gang.queue] += gang.gpus
        taken = {v.run_id for v in victims}
        candidates[:] = [c for c in candidates if c.run_id not in taken]
        return [eviction(v, kind, gang) for v in victims]


def _victim_order(candidates: list[RunningGang]) -> list[RunningGang]:
    """Volcano's victim order: lowest priority first, then the most recently started."""
    return sorted(candidates, key=lambda c: (c.priority, -c.start, c.run_id))
