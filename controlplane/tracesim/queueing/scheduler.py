"""What a simulated scheduler is shown each cycle and what it answers: the one seam between the
queueing engine and the policies it compares (the real core, or a peer scheduler's model).

A scheduler sees the fleet, every pending gang (per queue, in the queue's own order: priority,
then arrival), every live run, and the runs that ended since its previous cycle (for usage
accounting). It answers with the core's own decision types, which the engine applies the same way
whoever made them: evictions first (the run ends, its job goes back to its queue), then admissions
(the gang starts on the assignments given). `more` asks for another cycle even if nothing else
changes (the engine runs it at most `cycle_seconds` later).

Schedulers may keep state between cycles (a peer's parked gangs, decayed usage, token buckets),
so the engine makes one per simulation; they do no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from controlplane.core.snapshot import Decision, LiveRun
from controlplane.domain.model import Workload
from controlplane.tracesim.queueing.inputs import Fleet


@dataclass(frozen=True)
class PendingGang:
    """A job waiting for admission: all `pods` pods of `gpus_per_pod` GPUs at once."""

    workload: Workload  # its id is the job's index in submission order
    queue: str
    gpus_per_pod: int
    pods: int
    submit: float
    max_runtime: float | None  # the declared bound, when the workload gives one

    @property
    def id(self) -> str:
        return self.workload.id

    @property
    def priority(self) -> int:
        return self.workload.priority

    @property
    def gpus(self) -> int:
        return self.gpus_per_pod * self.pods

    @property
    def order(self) -> tuple[int, int]:
        """Its place in its queue: higher priority first, then submission order."""
        return (-self.workload.priority, self.workload.created_seq)


@dataclass(frozen=True)
class RunningGang:
    """A live run: the core's `LiveRun` (its assignments hold the GPUs) plus the job's facts."""

    run: LiveRun
    queue: str
    gpus: int
    start: float
    max_runtime: float | None

    @property
    def run_id(self) -> str:
        return self.run.run_id

    @property
    def priority(self) -> int:
        return self.run.priority


@dataclass(frozen=True)
class EndedRun:
    """A run that ended (completed or evicted) after the scheduler's previous cycle began."""

    queue: str
    gpus: int
    start: float
    end: float


@dataclass(frozen=True)
class CycleView:
    now: float  # virtual seconds
    fleet: Fleet
    pending: Mapping[str, Sequence[PendingGang]]  # queue name -> its gangs in queue order
    running: Sequence[RunningGang]
    ended: Sequence[EndedRun]


@dataclass(frozen=True)
class CycleResult:
    decision: Decision
    more: bool = False  # run another cycle even if nothing else changes
    examined: int | None = None  # pending gangs the policy looked at; None = every one shown


class SimScheduler(Protocol):
    """One scheduling policy under simulation."""

    @property
    def name(self) -> str: ...

    @property
    def one_priority(self) -> bool:
        """True when the policy ignores job priorities (the engine then queues by arrival alone)."""
        ...

    def decide(self, view: CycleView) -> CycleResult: ...
