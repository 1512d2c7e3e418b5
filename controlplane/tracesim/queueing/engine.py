"""A discrete-event queueing simulator that drives a scheduling policy — the real scheduling core
or a peer's model — on a virtual clock.

Events are job arrivals and run completions. A scheduling cycle (the policy's `decide(view)`)
runs only when something changed since the last one (an arrival, a completion, an eviction, or
the policy asking for another cycle, e.g. when the core's per-cycle cap hid gangs), and at most once every
`cycle_seconds` of virtual time: a change at `t` is seen by a cycle at `max(t, last + cycle)`.
Idle stretches are skipped by jumping the clock to the next event. The decision is applied as the
scheduler shell (and the scenario runner) applies it: evicted runs end and their job goes back to
its queue, keeping its place (`created_seq`), to restart from scratch later; admitted gangs start
at once and end `duration` seconds later.

No wall clock drives the simulation and nothing is random but the seeded tie-break among jobs
submitted at the same instant: the same inputs and seed always give the same result.

The policy is a `SimScheduler` (scheduler.py): the real core (`fifo`, `priority`, `gpufleet`,
core_scheduler.py) or a peer's model (peers/). Each cycle it is shown every pending gang, every
live run and the runs ended since its last cycle, and it answers with the core's decision types.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta

from controlplane.core.capacity import why_never_fits
from controlplane.core.idle import IdlePolicy
from controlplane.core.snapshot import Decision, LiveRun
from controlplane.domain.model import GPU, PodSet, Workload
from controlplane.tracesim.queueing.core_scheduler import EPOCH, IDLE_RECLAIM_POLICIES, CoreLimits
from controlplane.tracesim.queueing.inputs import Fleet, Job
from controlplane.tracesim.queueing.policies import POLICY_NAMES, make_scheduler
from controlplane.tracesim.queueing.scheduler import CycleView, EndedRun, PendingGang, RunningGang, SimScheduler

ProgressHook = Callable[[int, int, float], None]  # (jobs done, jobs in all, virtual seconds)


@dataclass(frozen=True)
class SimConfig:
    cycle_seconds: float = 60.0
    heads_per_queue: int = 8
    max_pending: int = 64
    check_invariants: bool = False  # the core's own invariant checks after every cycle (slow)


@dataclass
class RunSpan:
    """One admission of a job: where it held GPUs and how it ended."""

    job: int
    start: float
    end: float | None = None
    evicted: bool = False
    # Ended by idle reclaim in the job's idle tail: its work was done, the rest of the hold returned.
    reclaimed_idle: bool = False


@dataclass
class SimResult:
    jobs: Sequence[Job]  # in simulation (submission) order
    submit: list[float]
    first_admit: list[float | None]
    finish: list[float | None]
    evictions: list[int]
    rejected: dict[int, str]
    spans: list[RunSpan]
    usage_steps: list[tuple[float, int]]  # (virtual time, GPUs held from then on)
    cycles: int
    end_time: float
    schedule_seconds: float
    pending_shown_max: int
    policy: str
    config: SimConfig
    seed: int


@dataclass
class _Live:
    gang: RunningGang
    job: int
    span: RunSpan


@dataclass
class _State:
    pending: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # queue -> sorted (-prio, seq)
    live: dict[str, _Live] = field(default_factory=dict)


class QueueingSimulation:
    def __init__(
        self,
        fleet: Fleet,
        jobs: Sequence[Job],
        policy_name: str,
        seed: int = 0,
        config: SimConfig | None = None,
        progress: ProgressHook | None = None,
        scheduler: SimScheduler | None = None,
    ) -> None:
        if policy_name not in POLICY_NAMES:
            raise ValueError(f"unknown policy {policy_name!r}; choose from {', '.join(POLICY_NAMES)}")
        self.fleet = fleet
        self.policy_name = policy_name
        self.seed = seed
        self.config = config or SimConfig()
        limits = CoreLimits(self.config.heads_per_queue, self.config.max_pending, self.config.check_invariants)
        # `scheduler` replaces the named policy's default set-up (tests pin a peer's settings).
        self.scheduler = scheduler or make_scheduler(policy_name, fleet, limits)
        self.progress = progress
        unknown = sorted({j.queue for j in jobs} - set(fleet.queue_ids))
        if unknown:
            raise ValueError(f"the workload names queues the fleet does not declare: {', '.join(unknown[:5])}")
        # Submission order; the seed breaks ties among jobs submitted at the same instant.
        rng = random.Random(seed)
        tie = [rng.random() for _ in jobs]
        order = sorted(range(len(jobs)), key=lambda i: (jobs[i].submit_time, tie[i], i))
        self.jobs: list[Job] = [jobs[i] for i in order]
        n = len(self.jobs)
        self.workloads: list[Workload | None] = [None] * n
        self.gangs: list[PendingGang | None] = [None] * n  # while pending
        self.ended: list[EndedRun] = []  # since the last cycle
        self.first_admit: list[float | None] = [None] * n
        self.finish: list[float | None] = [None] * n
        self.evictions = [0] * n
        self.rejected: dict[int, str] = {}
        self.spans: list[RunSpan] = []
        self.usage_steps: list[tuple[float, int]] = [(0.0, 0)]
        self.held_gpus = 0
        self.state = _State(pending={name: [] for name in fleet.queue_ids})
        self.completions: list[tuple[float, int, str]] = []  # (end, seq, run id); stale entries skipped
        # (when, run id, reclaimable): the idle policy's verdict on a hoarding run's idle tail.
        self.idle_marks: list[tuple[float, str, bool]] = []
        self.marks_idle = policy_name in IDLE_RECLAIM_POLICIES
        self.idle_policy = IdlePolicy()
        self.run_counter = itertools.count(1)
        self.never_fits: dict[tuple[int, int], str | None] = {}
        self.cycles = 0
        self.schedule_seconds = 0.0
        self.pending_shown_max = 0
        self.done = 0

    # -- events ----------------------------------------------------------------------------------

    def _workload(self, index: int) -> Workload:
        job = self.jobs[index]
        # A policy that ignores priorities (FIFO) queues by arrival alone.
        priority = 0 if self.scheduler.one_priority else job.priority
        return Workload(
            id=str(index),
            team_id=self.fleet.team_of[job.queue],
            queue_id=self.fleet.queue_ids[job.queue],
            name=job.id,
            priority_class="sim",
            priority=priority,
            kind=job.kind,
            # Simulated pods ask for GPUs only: CPU and memory are not what a GPU fleet runs out of.
            pod_sets=(PodSet("main", job.pods, gpus=job.gpus_per_pod, cpu_millis=0, memory_mib=0),),
            min_available=job.pods,
            requires_isolation=False,
            duration_seconds=job.duration,
            created_seq=index,
            max_runtime_seconds=job.max_runtime,
        )

    def _arrive(self, index: int) -> None:
        workload = self._workload(index)
        shape = (self.jobs[index].gpus_per_pod, self.jobs[index].pods)
        if shape not in self.never_fits:
            self.never_fits[shape] = why_never_fits(workload, self.fleet.clusters, self.fleet.nodes)
        refusal = self.never_fits[shape]
        if refusal is not None:
            self.rejected[index] = refusal
            self.done += 1
            return
        self.workloads[index] = workload
        self._enqueue(index)

    def _enqueue(self, index: int) -> None:
        workload = self.workloads[index]
        assert workload is not None
        job = self.jobs[index]
        self.gangs[index] = PendingGang(
            workload, job.queue, job.gpus_per_pod, job.pods, job.submit_time, job.max_runtime
        )
        bisect.insort(self.state.pending[job.queue], (-workload.priority, index))

    def _set_held(self, t: float, delta: int) -> None:
        self.held_gpus += delta
        if self.usage_steps[-1][0] == t:
            self.usage_steps[-1] = (t, self.held_gpus)
        else:
            self.usage_steps.append((t, self.held_gpus))

    def _complete(self, end: float, run_id: str) -> bool:
        live = self.state.live.pop(run_id, None)
        if live is None:
            return False  # the run was evicted before it could finish
        live.span.end = end
        self.finish[live.job] = end
        self.workloads[live.job] = None  # done: let it go
        self.gangs[live.job] = None
        self._set_held(end, -live.gang.gpus)
        self.ended.append(EndedRun(live.gang.queue, live.gang.gpus, live.span.start, end))
        self.done += 1
        return True

    def _mark_idle(self, run_id: str, reclaimable: bool) -> bool:
        """Set the idle flags the real idle detection would set on a live run (core/idle.py)."""
        live = self.state.live.get(run_id)
        if live is None:
            return False  # ended or evicted before its idle tail was judged
        run = replace(live.gang.run, idle=True, idle_reclaimable=reclaimable)
        live.gang = replace(live.gang, run=run)
        return reclaimable

    def _schedule_idle_marks(self, index: int, run_id: str, start: float) -> None:
        """A hoarding job idles from `idle_after` into its run. The idle policy counts consecutive
        idle windows once the grace period is over: `notify_after` windows mark the run idle (it
        is then evicted before busy runs), `reclaim_after` windows make it reclaimable."""
        job = self.jobs[index]
        if not self.marks_idle or job.idle_after is None:
            return
        rules = self.idle_policy
        counted_from = start + max(job.idle_after, rules.grace_seconds)
        end = start + job.duration
        for windows, reclaimable in ((rules.notify_after, False), (rules.reclaim_after, True)):
            at = counted_from + windows * rules.window_seconds
            if at < end:
                heapq.heappush(self.idle_marks, (at, run_id, reclaimable))

    def _reclaim_idle(self, live: _Live, t: float) -> bool:
        """Idle reclaim of a run in its idle tail: the job's work is done, so it completes now and
        the rest of its hold goes back to the fleet. False when the run was not idle yet."""
        job = self.jobs[live.job]
        if job.idle_after is None or t < live.span.start + job.idle_after:
            return False
        live.span.end = t
        live.span.reclaimed_idle = True
        self.finish[live.job] = t
        self.workloads[live.job] = None
        self.gangs[live.job] = None
        self.done += 1
        return True

    # -- the loop --------------------------------------------------------------------------------

    def run(self) -> SimResult:
        arrivals = 0
        n = len(self.jobs)
        last_cycle: float | None = None
        change_at: float | None = None  # earliest change not yet seen by a cycle
        t = 0.0

        def next_event() -> float | None:
            # The completion or idle mark of a run that already ended (evicted, idle-reclaimed) is
            # no event: dropped here so it does not move the clock (nor the end of the run).
            live = self.state.live
            while self.completions and self.completions[0][2] not in live:
                heapq.heappop(self.completions)
            while self.idle_marks and self.idle_marks[0][1] not in live:
                heapq.heappop(self.idle_marks)
            candidates = []
            if arrivals < n:
                candidates.append(self.jobs[arrivals].submit_time)
            if self.completions:
                candidates.append(self.completions[0][0])
            if self.idle_marks:
                candidates.append(self.idle_marks[0][0])
            return min(candidates) if candidates else None

        def process_until(limit: float) -> bool:
            nonlocal arrivals
            changed = False
            while True:
                # Completions before arrivals at the same instant: freed GPUs are there for newcomers.
                if self.completions and self.completions[0][0] <= limit:
                    end, _, run_id = heapq.heappop(self.completions)
                    changed = self._complete(end, run_id) or changed
                elif arrivals < n and self.jobs[arrivals].submit_time <= limit:
                    self._arrive(arrivals)
                    arrivals += 1
                    changed = True
                elif self.idle_marks and self.idle_marks[0][0] <= limit:
                    _, run_id, reclaimable = heapq.heappop(self.idle_marks)
                    # Only a reclaimable mark can let a waiting gang in: that one asks for a cycle.
                    changed = self._mark_idle(run_id, reclaimable) or changed
                else:
                    return changed

        while True:
            if change_at is None:
                nxt = next_event()
                if nxt is None:
                    break
                if process_until(nxt):
                    change_at = nxt
                t = max(t, nxt)
                continue
            cycle_at = change_at if last_cycle is None else max(change_at, last_cycle + self.config.cycle_seconds)
            process_until(cycle_at)
            t = cycle_at
            more = self._cycle(t)
            last_cycle = t
            change_at = t if more else None
            if self.progress is not None:
                self.progress(self.done, n, t)
        end_time = max([t, *(f for f in self.finish if f is not None)])
        return SimResult(
            jobs=self.jobs,
            submit=[j.submit_time for j in self.jobs],
            first_admit=self.first_admit,
            finish=self.finish,
            evictions=self.evictions,
            rejected=self.rejected,
            spans=self.spans,
            usage_steps=self.usage_steps,
            cycles=self.cycles,
            end_time=end_time,
            schedule_seconds=self.schedule_seconds,
            pending_shown_max=self.pending_shown_max,
            policy=self.policy_name,
            config=self.config,
            seed=self.seed,
        )

    def _cycle(self, t: float) -> bool:
        """One scheduling cycle at virtual time t; True when another cycle should follow."""
        pending = {
            name: [gang for _, index in items if (gang := self.gangs[index]) is not None]
            for name, items in self.state.pending.items()
        }
        total = sum(len(gangs) for gangs in pending.values())
        if not total:
            return False
        view = CycleView(t, self.fleet, pending, [live.gang for live in self.state.live.values()], self.ended)
        self.ended = []
        began = time.perf_counter()  # measures the policy's cost only; never drives the simulation
        result = self.scheduler.decide(view)
        self.schedule_seconds += time.perf_counter() - began
        self.cycles += 1
        self.pending_shown_max = max(self.pending_shown_max, total if result.examined is None else result.examined)
        self._apply(result.decision, t)
        if self.config.check_invariants:
            self._check_capacity()
        return bool(result.decision.evictions) or result.more

    def _check_capacity(self) -> None:
        """Whatever the policy, no node holds more GPUs than it has."""
        per_pool = {pool.id: pool.gpus_per_node for cluster in self.fleet.clusters for pool in cluster.pools}
        capacity = {node.id: per_pool[node.pool_id] for node in self.fleet.nodes}
        held: dict[str, int] = {}
        for live in self.state.live.values():
            for a in live.gang.run.assignments:
                held[a.node_id] = held.get(a.node_id, 0) + a.demand.get(GPU, 0)
        over = sorted(node for node, gpus in held.items() if gpus > capacity.get(node, 0))
        if over:
            raise AssertionError(f"{self.policy_name}: nodes over capacity: {', '.join(over[:5])}")

    def _apply(self, decision: Decision, t: float) -> None:
        for eviction in decision.evictions:
            live = self.state.live.pop(eviction.run_id)
            if eviction.kind == "idle" and self._reclaim_idle(live, t):
                self._set_held(t, -live.gang.gpus)
                self.ended.append(EndedRun(live.gang.queue, live.gang.gpus, live.span.start, t))
                continue
            live.span.end = t
            live.span.evicted = True
            self.evictions[live.job] += 1
            self._set_held(t, -live.gang.gpus)
            self.ended.append(EndedRun(live.gang.queue, live.gang.gpus, live.span.start, t))
            workload = self.workloads[live.job]
            assert workload is not None
            if eviction.kind == "idle":  # as the scheduler shell does (a run idle before its tail)
                self.workloads[live.job] = replace(workload, may_evict=False)
            self._enqueue(live.job)
        now = EPOCH + timedelta(seconds=t)
        for admission in decision.admissions:
            index = int(admission.workload_id)
            job = self.jobs[index]
            workload = self.workloads[index]
            assert workload is not None
            queue = self.state.pending[job.queue]
            queue.pop(bisect.bisect_left(queue, (-workload.priority, index)))
            run_id = f"{index}#{next(self.run_counter)}"
            run = LiveRun(
                workload_id=workload.id,
                queue_id=workload.queue_id,
                cluster_id=admission.cluster_id,
                priority=workload.priority,
                assignments=admission.assignments,
                run_id=run_id,
                preemptible=workload.preemptible,
                started_at=now,
                admitted_at=now,
                max_runtime_seconds=workload.max_runtime_seconds,
                lent_to=admission.lent_to,
            )
            span = RunSpan(index, t)
            self.spans.append(span)
            self.gangs[index] = None
            self.state.live[run_id] = _Live(RunningGang(run, job.queue, job.gpus, t, job.max_runtime), index, span)
            self._set_held(t, job.gpus)
            if self.first_admit[index] is None:
                self.first_admit[index] = t
            heapq.heappush(self.completions, (t + job.duration, index, run_id))
            self._schedule_idle_marks(index, run_id, t)


def simulate(
    fleet: Fleet,
    jobs: Sequence[Job],
    policy: str,
    seed: int = 0,
    config: SimConfig | None = None,
    progress: ProgressHook | None = None,
    scheduler: SimScheduler | None = None,
) -> SimResult:
    return QueueingSimulation(fleet, jobs, policy, seed, config, progress, scheduler).run()
