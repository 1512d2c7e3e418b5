"""A discrete-event queueing simulator that drives the real scheduling core on a virtual clock.

Events are job arrivals and run completions. A scheduling cycle (`schedule(snapshot, policy,
now)`) runs only when something changed since the last one (an arrival, a completion, an
eviction, or heads left unseen by the per-cycle cap below), and at most once every
`cycle_seconds` of virtual time: a change at `t` is seen by a cycle at `max(t, last + cycle)`.
Idle stretches are skipped by jumping the clock to the next event. The decision is applied as the
scheduler shell (and the scenario runner) applies it: evicted runs end and their job goes back to
its queue, keeping its place (`created_seq`), to restart from scratch later; admitted gangs start
at once and end `duration` seconds later.

No wall clock drives the simulation and nothing is random but the seeded tie-break among jobs
submitted at the same instant: the same inputs and seed always give the same result.

Bounded pending set. The core examines every pending gang it is shown, so a backlog of thousands
would make each cycle cost seconds. Like Kueue, which looks at the heads of its queues each
cycle, the simulator shows the core at most `heads_per_queue` gangs of each queue (in the
queue's own order: priority, then arrival) and at most `max_pending` in all. Without fair share
the order is one global priority/arrival order and the cap takes its first `max_pending`.
When the cap hid gangs and the cycle admitted something, another cycle follows (new heads).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from controlplane.core.capacity import why_never_fits
from controlplane.core.invariants import check_decision
from controlplane.core.schedule import schedule
from controlplane.core.snapshot import Decision, LiveRun, Policy, Snapshot
from controlplane.domain.model import PodAssignment, PodSet, Workload
from controlplane.tracesim.queueing.inputs import Fleet, Job

# Virtual time zero; the core only compares instants.
EPOCH = datetime(2030, 1, 1, tzinfo=UTC)

POLICIES: dict[str, Policy] = {
    # One priority for everyone (the simulator flattens it), global arrival order, no fair share,
    # no preemption or reclaim, no reservations: the gangs shown are tried oldest first and any
    # that fits starts.
    "fifo": Policy(name="fifo", fair_share=False, preemption=False, reclaim=False, max_reservations=0),
    # Strict priority, then arrival, over all queues; the rest of the default policy stays on.
    "priority": Policy(name="priority", fair_share=False),
    # The default policy: fair share above guarantees, reclaim, preemption, reservations/backfill.
    "gpufleet": Policy(),
}

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
    run: LiveRun
    job: int
    span: RunSpan
    gpus: int


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
    ) -> None:
        if policy_name not in POLICIES:
            raise ValueError(f"unknown policy {policy_name!r}; choose from {', '.join(POLICIES)}")
        self.fleet = fleet
        self.policy = POLICIES[policy_name]
        self.policy_name = policy_name
        self.seed = seed
        self.config = config or SimConfig()
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
        self.first_admit: list[float | None] = [None] * n
        self.finish: list[float | None] = [None] * n
        self.evictions = [0] * n
        self.rejected: dict[int, str] = {}
        self.spans: list[RunSpan] = []
        self.usage_steps: list[tuple[float, int]] = [(0.0, 0)]
        self.held_gpus = 0
        self.state = _State(pending={name: [] for name in fleet.queue_ids})
        self.completions: list[tuple[float, int, str]] = []  # (end, seq, run id); stale entries skipped
        self.run_counter = itertools.count(1)
        self.never_fits: dict[tuple[int, int], str | None] = {}
        self.cycles = 0
        self.schedule_seconds = 0.0
        self.pending_shown_max = 0
        self.done = 0

    # -- events ----------------------------------------------------------------------------------

    def _workload(self, index: int) -> Workload:
        job = self.jobs[index]
        # FIFO means one priority for all: arrival order alone decides.
        priority = 0 if self.policy_name == "fifo" else job.priority
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
        bisect.insort(self.state.pending[self.jobs[index].queue], (-workload.priority, index))

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
        self._set_held(end, -live.gpus)
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
            candidates = []
            if arrivals < n:
                candidates.append(self.jobs[arrivals].submit_time)
            if self.completions:
                candidates.append(self.completions[0][0])
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

    def _shown(self) -> tuple[list[int], bool]:
        """The pending gangs this cycle shows the core, and whether the cap hid any."""
        cap = self.config.max_pending
        queues = self.state.pending
        total = sum(len(q) for q in queues.values())
        if not self.policy.fair_share:
            merged = heapq.merge(*queues.values())
            chosen = [index for _, index in itertools.islice(merged, cap)]
            return chosen, total > len(chosen)
        heads = self.config.heads_per_queue
        chosen = []
        # Round-robin by rank (every queue's first, then every queue's second, ...) so the overall
        # cap never starves a queue of its head.
        names = sorted(name for name, items in queues.items() if items)
        for rank in range(heads):
            for name in names:
                items = queues[name]
                if rank < len(items) and len(chosen) < cap:
                    chosen.append(items[rank][1])
        return chosen, total > len(chosen)

    def _cycle(self, t: float) -> bool:
        """One scheduling cycle at virtual time t; True when another cycle should follow."""
        shown, hidden = self._shown()
        if not shown:
            return False
        now = EPOCH + timedelta(seconds=t)
        pending = tuple(w for w in (self.workloads[i] for i in shown) if w is not None)
        snapshot = Snapshot(
            clusters=self.fleet.clusters,
            nodes=self.fleet.nodes,
            queue_tree=self.fleet.tree,
            pending=pending,
            live_runs=self._live_runs(),
        )
        self.pending_shown_max = max(self.pending_shown_max, len(pending))
        began = time.perf_counter()  # measures the core's cost only; never drives the simulation
        decision = schedule(snapshot, self.policy, now)
        self.schedule_seconds += time.perf_counter() - began
        self.cycles += 1
        if self.config.check_invariants:
            check_decision(snapshot, decision)
        self._apply(decision, t)
        return bool(decision.evictions) or (hidden and bool(decision.admissions))

    def _live_runs(self) -> tuple[LiveRun, ...]:
        """The live runs as the core sees them. A policy that never evicts and plans no reservations
        uses live runs only for the capacity and quota they hold, so their sum per queue and
        cluster (one assignment per node) decides exactly the same, and the core's per-run setup
        cost (most of a cycle with a thousand runs) drops to a few dozen runs."""
        runs = [live.run for live in self.state.live.values()]
        policy = self.policy
        if policy.preemption or policy.reclaim or policy.rebalance or policy.max_reservations:
            return tuple(runs)
        merged: dict[tuple[str, str], dict[str, dict[str, int]]] = {}
        for run in runs:
            per_node = merged.setdefault((run.queue_id, run.cluster_id), {})
            for a in run.assignments:
                held = per_node.setdefault(a.node_id, {})
                for key, amount in a.demand.items():
                    held[key] = held.get(key, 0) + amount
        return tuple(
            LiveRun(
                workload_id=f"merged:{queue_id}:{cluster_id}",
                queue_id=queue_id,
                cluster_id=cluster_id,
                priority=0,
                assignments=tuple(
                    PodAssignment("merged", i, node_id, demand)
                    for i, (node_id, demand) in enumerate(sorted(nodes.items()))
                ),
                run_id=f"merged:{queue_id}:{cluster_id}",
            )
            for (queue_id, cluster_id), nodes in sorted(merged.items())
        )

    def _apply(self, decision: Decision, t: float) -> None:
        for eviction in decision.evictions:
            live = self.state.live.pop(eviction.run_id)
            live.span.end = t
            live.span.evicted = True
            self.evictions[live.job] += 1
            self._set_held(t, -live.gpus)
            workload = self.workloads[live.job]
            assert workload is not None
            if eviction.kind == "idle":  # as the scheduler shell does; the simulator marks nothing idle
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
            gpus = job.gpus
            self.state.live[run_id] = _Live(run, index, span, gpus)
            self._set_held(t, gpus)
            if self.first_admit[index] is None:
                self.first_admit[index] = t
            heapq.heappush(self.completions, (t + job.duration, index, run_id))


def simulate(
    fleet: Fleet,
    jobs: Sequence[Job],
    policy: str,
    seed: int = 0,
    config: SimConfig | None = None,
    progress: ProgressHook | None = None,
) -> SimResult:
    return QueueingSimulation(fleet, jobs, policy, seed, config, progress).run()
