"""What a scenario run reports: per workload, when and where it ran, who evicted it, why it waited."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Seconds = float


def seconds(value: float | None) -> float | int | None:
    """Whole seconds print as integers: `120`, not `120.0`."""
    if value is None:
        return None
    return int(value) if float(value).is_integer() else value


@dataclass(frozen=True)
class ReasonAt:
    at: Seconds
    reason: str


@dataclass(frozen=True)
class Preemption:
    at: Seconds
    by: str  # the workload that needed the capacity
    kind: str  # preempt | reclaim | rebalance
    reason: str


@dataclass(frozen=True)
class RunRecord:
    """One admission of a workload and how it ended."""

    admitted_at: Seconds
    cluster: str
    pools: tuple[str, ...]
    nodes: tuple[str, ...]
    pods: int
    ended_at: Seconds | None = None
    end: str = "running"  # running | finished | preempted | cancelled
    gpu_eq: float = 0.0  # what the run holds, for usage history
    lent_to: str | None = None  # ran on capacity reserved for this waiting workload (its id)


@dataclass(frozen=True)
class WorkloadResult:
    name: str
    queue: str
    priority_class: str
    state: str  # unsubmitted | queued | running | succeeded | cancelled | rejected
    submitted_at: Seconds | None
    admitted_at: Seconds | None  # the first admission
    finished_at: Seconds | None
    runs: tuple[RunRecord, ...]
    preemptions: tuple[Preemption, ...]
    preempted_others: int  # evictions made on behalf of this workload
    pending_reasons: tuple[ReasonAt, ...]  # a new entry only when the reason changes
    queue_position: int | None  # in its queue, when still queued at the end
    reason: str | None  # why it was rejected or cancelled

    @property
    def last_run(self) -> RunRecord | None:
        return self.runs[-1] if self.runs else None

    def to_dict(self) -> dict[str, Any]:
        last = self.last_run
        return {
            "name": self.name,
            "queue": self.queue,
            "priority_class": self.priority_class,
            "state": self.state,
            "submitted_at": seconds(self.submitted_at),
            "admitted_at": seconds(self.admitted_at),
            "cluster": last.cluster if last else None,
            "pool": last.pools[0] if last and len(last.pools) == 1 else None,
            "pools": list(last.pools) if last else [],
            "nodes": list(last.nodes) if last else [],
            "preemptions": [
                {"at": seconds(p.at), "by": p.by, "kind": p.kind, "reason": p.reason} for p in self.preemptions
            ],
            "preempted_others": self.preempted_others,
            "finished_at": seconds(self.finished_at),
            "pending_reasons": [{"at": seconds(r.at), "reason": r.reason} for r in self.pending_reasons],
            "queue_position": self.queue_position,
            "reason": self.reason,
            "runs": [
                {
                    "admitted_at": seconds(r.admitted_at),
                    "cluster": r.cluster,
                    "pools": list(r.pools),
                    "nodes": list(r.nodes),
                    "pods": r.pods,
                    "ended_at": seconds(r.ended_at),
                    "end": r.end,
                }
                for r in self.runs
            ],
        }


@dataclass(frozen=True)
class UsageAt:
    at: Seconds
    gpu_eq: float


@dataclass(frozen=True)
class ScenarioResult:
    ended_at: Seconds
    cycles: int
    workloads: tuple[WorkloadResult, ...]
    evictions_per_cycle: tuple[tuple[Seconds, int], ...]  # only cycles that evicted
    queue_usage: dict[str, tuple[UsageAt, ...]]  # leaf queue -> gpu-eq held, an entry per change

    def workload(self, name: str) -> WorkloadResult:
        for result in self.workloads:
            if result.name == name:
                return result
        raise KeyError(name)

    def queue_gpu_eq_at(self, queue: str, at: Seconds) -> float:
        held = 0.0
        for entry in self.queue_usage.get(queue, ()):
            if entry.at > at:
                break
            held = entry.gpu_eq
        return held

    def to_dict(self) -> dict[str, Any]:
        return {
            "ended_at": seconds(self.ended_at),
            "cycles": self.cycles,
            "evictions": sum(count for _, count in self.evictions_per_cycle),
            "workloads": [w.to_dict() for w in self.workloads],
            "queues": {
                name: [{"at": seconds(u.at), "gpu_eq": u.gpu_eq} for u in usage]
                for name, usage in self.queue_usage.items()
            },
        }
