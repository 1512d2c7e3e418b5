"""Slurm, modelled from its documentation (slurm.schedmd.com: Multifactor Priority Plugin, Classic
Fairshare Algorithm, Scheduling Configuration Guide, sched/backfill).

- One partition holds the fleet; each simulated queue is an account whose normalized shares are
  its guarantee over all guarantees (its tree weight when nobody has one).
- Usage: GPU-seconds charged to the account, decayed with `PriorityDecayHalfLife` (default 7
  days) — a GPU-second consumed `a` seconds ago counts 2^(-a / half-life). Integrated exactly
  between cycles, for runs still going and for runs that ended (completed or preempted).
- Fair-share factor, classic algorithm: F = 2^(-U / S) with U the account's share of all decayed
  usage and S its normalized shares (no usage anywhere: F = 1).
- Job priority = PriorityWeightAge * min(age / PriorityMaxAge, 1) + PriorityWeightFairshare * F
  + PriorityWeightJobSize * (job GPUs / fleet GPUs) (PriorityFavorSmall=NO) + PriorityWeightQOS *
  (job priority / highest pending priority); the job's own priority plays the part of its QOS.
- Main scheduler: jobs in priority order (then submit time) start while they fit; the first that
  does not fit stops it (Slurm leaves a partition once a job in it is left pending).
- EASY backfill on declared time limits (`max_runtime`; a job without one gets the partition's
  default of 7 days): the first blocked job gets a reservation at the earliest instant enough GPUs
  are free, found by releasing running jobs at their declared ends (start + limit), and the nodes
  it would use then. A lower-priority job starts now only if it fits now and either its own limit
  ends before that instant, or it fits on what the reservation leaves on each node at that instant.
- Not modelled: time-limit kills (the generator's limits are never below the run time), the
  Fair Tree algorithm (Slurm's default since 19.05), reservations for more than one job
  (`bf_max_job_test`), QOS preemption, nice, partitions, TRES weights other than GPUs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from controlplane.core.snapshot import Admission, Decision
from controlplane.domain.model import GPU, PodAssignment
from controlplane.tracesim.queueing.inputs import Fleet
from controlplane.tracesim.queueing.peers.common import FreeGpus, queue_quotas
from controlplane.tracesim.queueing.scheduler import CycleResult, CycleView, PendingGang

DAY = 86_400.0


@dataclass(frozen=True)
class SlurmConfig:
    weight_age: float = 1_000.0
    weight_fairshare: float = 10_000.0
    weight_job_size: float = 1_000.0
    weight_qos: float = 10_000.0
    max_age_seconds: float = 7 * DAY  # PriorityMaxAge
    decay_half_life_seconds: float = 7 * DAY  # PriorityDecayHalfLife
    default_time_limit_seconds: float = 7 * DAY  # the partition's DefaultTime
    backfill: bool = True


@dataclass(frozen=True)
class Reservation:
    start: float
    after_release: FreeGpus  # free GPUs per node at `start`, before the reserved job takes its own
    held: dict[str, int]  # node -> GPUs the reserved job will use there


class SlurmScheduler:
    def __init__(self, fleet: Fleet, config: SlurmConfig | None = None) -> None:
        self.config = config or SlurmConfig()
        quotas = queue_quotas(fleet)
        guaranteed = any(q.nominal > 0 for q in quotas.values())
        raw = {name: (q.nominal if guaranteed else q.weight) for name, q in quotas.items()}
        total = sum(raw.values()) or 1.0
        self.shares = {name: value / total for name, value in raw.items()}
        self.usage = dict.fromkeys(quotas, 0.0)  # decayed GPU-seconds as of `self.at`
        self.at = 0.0  # virtual time starts at 0: nothing was used before
        self.capacity = float(fleet.capacity_gpus)

    @property
    def name(self) -> str:
        return "slurm"

    @property
    def one_priority(self) -> bool:
        return False

    # -- fair share ------------------------------------------------------------------------------

    def account(self, view: CycleView) -> None:
        """Bring the decayed usage up to `view.now`."""
        now = view.now
        since = self.at
        half_life = self.config.decay_half_life_seconds
        decay = 2.0 ** (-(now - since) / half_life)
        for name in self.usage:
            self.usage[name] *= decay

        def charged(start: float, end: float) -> float:
            # ∫ 2^(-(now - s) / h) ds over [start, end]: the decayed weight of each second used.
            low, high = max(start, since), end
            if high <= low:
                return 0.0
            # = h/ln2 * 2^(-(now - high)/h) * (1 - 2^(-(high - low)/h)), with expm1 for precision.
            rate = math.log(2) / half_life
            return math.exp(-(now - high) * rate) * -math.expm1(-(high - low) * rate) / rate

        for ended in view.ended:
            self.usage[ended.queue] += ended.gpus * charged(ended.start, ended.end)
        for gang in view.running:
            self.usage[gang.queue] += gang.gpus * charged(gang.start, now)
        self.at = now

    def fairshare_factor(self, queue: str) -> float:
        total = sum(self.usage.values())
        share = self.shares[queue]
        if share <= 0:
            return 0.0
        used = self.usage[queue] / total if total > 0 else 0.0
        return float(2.0 ** (-used / share))

    def priority(self, gang: PendingGang, now: float, top_priority: int) -> float:
        c = self.config
        age = min(max(now - gang.submit, 0.0) / c.max_age_seconds, 1.0)
        qos = gang.priority / top_priority if top_priority > 0 else 0.0
        return (
            c.weight_age * age
            + c.weight_fairshare * self.fairshare_factor(gang.queue)
            + c.weight_job_size * gang.gpus / self.capacity
            + c.weight_qos * qos
        )

    # -- scheduling ------------------------------------------------------------------------------

    def decide(self, view: CycleView) -> CycleResult:
        self.account(view)
        pending = [g for gangs in view.pending.values() for g in gangs]
        top = max((g.priority for g in pending), default=0)
        ranked = sorted(pending, key=lambda g: (-self.priority(g, view.now, top), g.submit, g.order[1]))
        free = FreeGpus.of(view.fleet, view.running)
        admissions: list[Admission] = []
        started: list[tuple[float, str, Admission]] = []  # (declared end, id, admission) this cycle
        reservation: Reservation | None = None
        for gang in ranked:
            limit = gang.max_runtime or self.config.default_time_limit_seconds
            if reservation is None:
                admission = free.place_and_take(gang)
                if admission is None:
                    if not self.config.backfill:
                        break
                    reservation = self.reserve(gang, view, free, started)
                    continue
                started.append((view.now + limit, gang.id, admission))
                admissions.append(admission)
                continue
            if view.now + limit <= reservation.start:  # done before the reserved job starts
                admission = free.place_and_take(gang)
            else:
                admission = _room_beside(reservation, free).place(gang)
                if admission is not None:
                    free.take(admission.cluster_id, admission.assignments)
                    reservation.after_release.take(admission.cluster_id, admission.assignments)
            if admission is not None:
                admissions.append(admission)
        return CycleResult(Decision(admissions=tuple(admissions)))

    def reserve(
        self,
        gang: PendingGang,
        view: CycleView,
        free: FreeGpus,
        started: Iterable[tuple[float, str, Admission]],
    ) -> Reservation:
        """The earliest instant the gang fits if running jobs end at their declared limits."""
        releases: list[tuple[float, str, str, tuple[PodAssignment, ...]]] = []
        default = self.config.default_time_limit_seconds
        for run in view.running:
            end = max(view.now, run.start + (run.max_runtime or default))
            releases.append((end, run.run_id, run.run.cluster_id, run.run.assignments))
        for end, gang_id, admission in started:
            releases.append((end, gang_id, admission.cluster_id, admission.assignments))
        releases.sort(key=lambda r: (r[0], r[1]))
        scratch = free.copy()
        for end, _, cluster, assignments in releases:
            scratch.give(cluster, assignments)
            if scratch.total() < gang.gpus:
                continue
            placed = scratch.place(gang)
            if placed is not None:
                return Reservation(end, scratch, _per_node(placed.assignments))
        return Reservation(math.inf, scratch, {})  # cannot happen for a gang the fleet can hold


def _per_node(assignments: Iterable[PodAssignment]) -> dict[str, int]:
    held: dict[str, int] = {}
    for a in assignments:
        held[a.node_id] = held.get(a.node_id, 0) + a.demand.get(GPU, 0)
    return held


def _room_beside(reservation: Reservation, free: FreeGpus) -> FreeGpus:
    """Per node, what a job running past the reservation may use: free now, and still free at the
    reservation's start once the reserved job has its GPUs."""
    room: dict[str, dict[str, int]] = {}
    for cluster, nodes in free.by_cluster.items():
        later: Mapping[str, int] = reservation.after_release.by_cluster[cluster]
        room[cluster] = {
            node: max(0, min(now_free, later[node] - reservation.held.get(node, 0))) for node, now_free in nodes.items()
        }
    return FreeGpus(room)
