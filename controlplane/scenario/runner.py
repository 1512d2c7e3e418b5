"""Run a scenario through the real scheduling core on a virtual clock.

Every `cycle_seconds` of virtual time: finished runs free their capacity, due steps and
submissions happen, then one `schedule(snapshot, policy, now)` call decides and its decision is
applied as the scheduler shell would (evictions requeue the workload, which later restarts from
scratch). No wall clock, no sleeps, no I/O: the same document always gives the same result.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from controlplane.core.capacity import why_never_fits
from controlplane.core.gpu_eq import GpuEqUnit
from controlplane.core.history import UsageInterval
from controlplane.core.invariants import InvariantViolation, check_decision
from controlplane.core.parking import queue_order
from controlplane.core.schedule import schedule
from controlplane.core.snapshot import Decision, LiveRun, Policy, Snapshot
from controlplane.domain.model import GPU_EQ, Node, NodePool, PodAssignment, Workload
from controlplane.scenario.build import World, build_world, change_quota, tree_id
from controlplane.scenario.format import ScenarioDoc, StepDoc
from controlplane.scenario.result import (
    Preemption,
    ReasonAt,
    RunRecord,
    ScenarioResult,
    Seconds,
    UsageAt,
    WorkloadResult,
)
from controlplane.scenario.validate import ScenarioInvalid, reference_problems
from controlplane.service.wording import eviction_text, pending_text

# Virtual time zero. Any fixed instant would do; the core only compares instants.
EPOCH = datetime(2030, 1, 1, tzinfo=UTC)


class ScenarioFailure(AssertionError):
    """The core broke one of its own rules (an invariant) or the scheduler shell's expectations."""


def run_scenario(doc: ScenarioDoc) -> ScenarioResult:
    problems = reference_problems(doc)
    if problems:
        raise ScenarioInvalid(problems)
    return _Simulation(doc, build_world(doc), doc.policy_value()).run()


@dataclass
class _Live:
    run_id: str
    admitted_at: Seconds
    cluster_id: str
    assignments: tuple[PodAssignment, ...]
    ends_at: Seconds | None
    lent_to: str | None = None  # the waiting gang whose reserved capacity it borrowed


@dataclass
class _Track:
    """Everything that happens to one workload, as it happens."""

    workload: Workload
    queue: str
    submit_at: Seconds
    idle_after: Seconds | None
    idle_reclaim_after: Seconds | None
    state: str = "unsubmitted"
    submitted_at: Seconds | None = None
    admitted_at: Seconds | None = None
    finished_at: Seconds | None = None
    live: _Live | None = None
    runs: list[RunRecord] = field(default_factory=list)
    preemptions: list[Preemption] = field(default_factory=list)
    preempted_others: int = 0
    reasons: list[ReasonAt] = field(default_factory=list)
    last_reason: str | None = None
    queue_position: int | None = None
    reason: str | None = None

    def end_run(self, at: Seconds, end: str) -> None:
        assert self.live is not None
        self.runs[-1] = replace(self.runs[-1], ended_at=at, end=end)
        self.live = None

    def result(self) -> WorkloadResult:
        return WorkloadResult(
            name=self.workload.name,
            queue=self.queue,
            priority_class=self.workload.priority_class,
            state=self.state,
            submitted_at=self.submitted_at,
            admitted_at=self.admitted_at,
            finished_at=self.finished_at,
            runs=tuple(self.runs),
            preemptions=tuple(self.preemptions),
            preempted_others=self.preempted_others,
            pending_reasons=tuple(self.reasons),
            queue_position=self.queue_position if self.state == "queued" else None,
            reason=self.reason,
        )


TERMINAL = ("succeeded", "cancelled", "rejected")


class _Simulation:
    def __init__(self, doc: ScenarioDoc, world: World, policy: Policy) -> None:
        self.doc = doc
        self.world = world
        self.policy = policy
        self.nodes: dict[str, Node] = {node.id: node for node in world.nodes}
        self.tree = dict(world.tree)
        self.pools: dict[str, NodePool] = {pool.id: pool for c in world.clusters for pool in c.pools}
        specs = {w.name: w for w in doc.workloads}
        self.tracks: dict[str, _Track] = {
            w.id: _Track(
                w,
                specs[w.name].queue,
                specs[w.name].submit_at,
                specs[w.name].idle_after,
                specs[w.name].idle_reclaim_after,
            )
            for w in world.workloads
        }
        # Stable sort: steps due at the same moment apply in document order.
        self.steps: list[StepDoc] = sorted(doc.steps, key=lambda s: s.at)
        self.next_step = 0
        self.evictions: list[tuple[Seconds, int]] = []
        self.usage: dict[str, list[UsageAt]] = {q.name: [] for q in doc.queues}
        self.cycles = 0
        # Consumption for fair-share history: what the document declares happened before 0, then
        # every run, its end filled in when it ends.
        self.consumed: list[UsageInterval] = [
            UsageInterval(
                tree_id("queue", h.queue),
                h.gpu_eq,
                EPOCH + timedelta(seconds=h.start),
                EPOCH + timedelta(seconds=h.end),
            )
            for h in doc.history
        ]
        self.last_rebalance: Seconds | None = None

    def run(self) -> ScenarioResult:
        index, t = 0, 0.0
        while True:
            # Rounded so that a cycle of 0.1 s lands on 0.3, not 0.30000000000000004.
            t = round(index * self.doc.cycle_seconds, 9)
            self._finish_runs(t)
            self._apply_steps(t)
            self._submit(t)
            if all(track.state in TERMINAL for track in self.tracks.values()):
                break
            self._cycle(t)
            index += 1
            if index * self.doc.cycle_seconds > self.doc.until:
                break
        self._place_in_queues()
        return ScenarioResult(
            ended_at=t,
            cycles=self.cycles,
            workloads=tuple(track.result() for track in self.tracks.values()),
            evictions_per_cycle=tuple(self.evictions),
            queue_usage={name: tuple(entries) for name, entries in self.usage.items()},
        )

    def _place_in_queues(self) -> None:
        """Each queued workload's place in its queue, as the API reads it (`queue_order`)."""
        queued = sorted((t for t in self.tracks.values() if t.state == "queued"), key=lambda t: queue_order(t.workload))
        places: dict[str, int] = {}
        for track in queued:
            track.queue_position = places[track.queue] = places.get(track.queue, 0) + 1

    # --- the world between cycles ---------------------------------------------------------------

    def _finish_runs(self, t: Seconds) -> None:
        for track in self.tracks.values():
            live = track.live
            if live is not None and live.ends_at is not None and live.ends_at <= t:
                track.end_run(live.ends_at, "finished")
                track.state = "succeeded"
                track.finished_at = live.ends_at

    def _apply_steps(self, t: Seconds) -> None:
        while self.next_step < len(self.steps) and self.steps[self.next_step].at <= t:
            step = self.steps[self.next_step]
            self.next_step += 1
            if step.cancel is not None:
                self._cancel(self.tracks[step.cancel], t)
            elif step.set_quota is not None:
                change_quota(self.tree, step.set_quota)
            elif step.cordon is not None:
                self.nodes[step.cordon] = replace(self.nodes[step.cordon], schedulable=False)
            elif step.uncordon is not None:
                self.nodes[step.uncordon] = replace(self.nodes[step.uncordon], schedulable=True)

    def _cancel(self, track: _Track, t: Seconds) -> None:
        if track.state in TERMINAL:
            return
        if track.live is not None:
            track.end_run(t, "cancelled")
        track.state = "cancelled"
        track.reason = f"cancelled at {t:g}"

    def _submit(self, t: Seconds) -> None:
        for track in self.tracks.values():
            if track.state != "unsubmitted" or track.submit_at > t:
                continue
            track.submitted_at = track.submit_at
            refusal = self._refusal(track.workload)
            if refusal is None:
                track.state = "queued"
            else:
                track.state = "rejected"
                track.reason = refusal

    def _refusal(self, workload: Workload) -> str | None:
        """Why the API would refuse this submission against the fleet as it is now, if it would."""
        offered = {key[4:] for pool in self.pools.values() for key in pool.node_capacity() if key.startswith("mig:")}
        for pod_set in workload.pod_sets:
            if pod_set.mig_profile and pod_set.mig_profile not in offered:
                return f"pod set {pod_set.name}: no pool in the fleet offers MIG profile {pod_set.mig_profile}"
        return why_never_fits(workload, self.world.clusters, tuple(self.nodes.values()))

    # --- one scheduling cycle -------------------------------------------------------------------

    def _snapshot(self, t: Seconds) -> Snapshot:
        pending = sorted(
            (track.workload for track in self.tracks.values() if track.state == "queued"),
            key=lambda w: w.created_seq,
        )
        live_runs = []
        for track in self.tracks.values():
            live = track.live
            if live is None:
                continue
            admitted = EPOCH + timedelta(seconds=live.admitted_at)
            live_runs.append(
                LiveRun(
                    workload_id=track.workload.id,
                    queue_id=track.workload.queue_id,
                    cluster_id=live.cluster_id,
                    priority=track.workload.priority,
                    assignments=live.assignments,
                    run_id=live.run_id,
                    preemptible=track.workload.preemptible,
                    # Pods start the moment a gang is admitted: the scenario has no dispatch delay.
                    started_at=admitted,
                    admitted_at=admitted,
                    min_runtime_seconds=track.workload.min_runtime_seconds,
                    idle=track.idle_after is not None and t - live.admitted_at >= track.idle_after,
                    idle_reclaimable=track.idle_reclaim_after is not None
                    and t - live.admitted_at >= track.idle_reclaim_after,
                    max_runtime_seconds=track.workload.max_runtime_seconds,
                    lent_to=live.lent_to,
                )
            )
        return Snapshot(
            clusters=self.world.clusters,
            nodes=tuple(self.nodes.values()),
            queue_tree=dict(self.tree),
            pending=tuple(pending),
            live_runs=tuple(live_runs),
            usage_history=self._usage_history(t) if self.policy.usage_history_weight > 0 else (),
            last_rebalance_at=None if self.last_rebalance is None else EPOCH + timedelta(seconds=self.last_rebalance),
        )

    def pools_of_nodes(self) -> dict[str, NodePool]:
        return {node_id: self.pools[node.pool_id] for node_id, node in self.nodes.items()}

    def _usage_history(self, t: Seconds) -> tuple[UsageInterval, ...]:
        intervals = list(self.consumed)
        for track in self.tracks.values():
            for run in track.runs:
                end = run.ended_at if run.ended_at is not None else t
                if end <= run.admitted_at:
                    continue
                intervals.append(
                    UsageInterval(
                        track.workload.queue_id,
                        run.gpu_eq,
                        EPOCH + timedelta(seconds=run.admitted_at),
                        EPOCH + timedelta(seconds=end),
                    )
                )
        return tuple(intervals)

    def _cycle(self, t: Seconds) -> None:
        snapshot = self._snapshot(t)
        decision = schedule(snapshot, self.policy, EPOCH + timedelta(seconds=t))
        self.cycles += 1
        try:
            check_decision(snapshot, decision)
        except InvariantViolation as exc:
            raise ScenarioFailure(f"at {t:g}s the decision broke an invariant of the core: {exc}") from exc
        self._apply(decision, t)
        self._record_usage(t)

    def _apply(self, decision: Decision, t: Seconds) -> None:
        for eviction in decision.evictions:
            track = self.tracks.get(eviction.workload_id)
            if track is None or track.live is None or track.live.run_id != eviction.run_id:
                raise ScenarioFailure(f"at {t:g}s the decision evicts run {eviction.run_id}, which is not live")
            track.end_run(t, "preempted")
            track.state = "queued"
            if eviction.kind == "idle":
                track.workload = replace(track.workload, may_evict=False)
            track.preemptions.append(Preemption(t, eviction.beneficiary, eviction.kind, eviction_text(eviction)))
            beneficiary = self.tracks.get(eviction.beneficiary)
            if beneficiary is not None:
                beneficiary.preempted_others += 1
        if decision.evictions:
            self.evictions.append((t, len(decision.evictions)))
        if any(e.kind == "rebalance" for e in decision.evictions):
            self.last_rebalance = t

        for admission in decision.admissions:
            track = self.tracks[admission.workload_id]
            ends_at = t + track.workload.duration_seconds if track.workload.duration_seconds else None
            run_id = f"{track.workload.id}#{len(track.runs) + 1}"
            track.live = _Live(run_id, t, admission.cluster_id, admission.assignments, ends_at, admission.lent_to)
            pools = sorted({self.pools[self.nodes[a.node_id].pool_id].name for a in admission.assignments})
            nodes = sorted({self.nodes[a.node_id].name for a in admission.assignments})
            unit = GpuEqUnit.for_fleet(self.pools.values(), ())
            gpu_eq = unit.gpus(unit.usage(admission.assignments, self.pools_of_nodes()).get(GPU_EQ, 0))
            track.runs.append(
                RunRecord(
                    t,
                    admission.cluster_id,
                    tuple(pools),
                    tuple(nodes),
                    len(admission.assignments),
                    gpu_eq=gpu_eq,
                    lent_to=admission.lent_to,
                )
            )
            track.state = "running"
            if track.admitted_at is None:
                track.admitted_at = t
            # A requeued workload's first reason after this run is news again.
            track.last_reason = None

        for pending in decision.pending:
            track = self.tracks[pending.workload_id]
            reason = pending_text(pending)
            if reason != track.last_reason:
                track.reasons.append(ReasonAt(t, reason))
                track.last_reason = reason

    def _record_usage(self, t: Seconds) -> None:
        pool_of_node = {node_id: self.pools[node.pool_id] for node_id, node in self.nodes.items()}
        unit = GpuEqUnit.for_fleet(self.pools.values(), ())  # exact sums, then GPUs
        held: dict[str, int] = dict.fromkeys(self.usage, 0)
        for track in self.tracks.values():
            if track.live is not None:
                held[track.queue] += unit.usage(track.live.assignments, pool_of_node).get(GPU_EQ, 0)
        for name, amount in held.items():
            entries = self.usage[name]
            value = unit.gpus(amount)
            if not entries or entries[-1].gpu_eq != value:
                entries.append(UsageAt(t, value))
