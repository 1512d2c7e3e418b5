"""The runs a utilization report reads through its repository.

A leaf module, so the ports can name `ReportRepository` without importing the report use cases.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import NamedTuple, Protocol

from controlplane.core.decision import EndCause

# The audit actions whose entries name an eviction's beneficiary (`detail.beneficiary`, a workload
# id): the scheduler writes `run.reclaim-idle` with the idle evidence, `run.evict` for every other kind.
IDLE_RECLAIM_ACTION = "run.reclaim-idle"
EVICTION_ACTION = "run.evict"
# Telemetry windows are at most this long, so one that starts this long before a range may still
# overlap it; a window that starts earlier is not counted in the range (the rule both the SQL and
# the Python sums follow).
WINDOW_LOOKBACK = timedelta(hours=1)


@dataclass(frozen=True)
class RunSlice:
    """One pod of a run: where it runs and what it holds."""

    node: str
    gpu_model: str
    gpu_eq: float
    # gpu-eq of each whole or shared GPU the pod reports telemetry for (1, or 1 / replicas);
    # MIG instances carry their profile in the window instead.
    device_share: float = 1.0
    price_per_gpu_hour: float = 0.0  # its pool's price, for the cost report
    pool: str = ""  # its pool's name (the audit names the pools a run holds)


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    workload_id: str
    workload: str
    team_id: str
    team: str
    queue: str
    cluster: str
    state: str
    message: str
    admitted_at: datetime
    finished_at: datetime | None
    slices: tuple[RunSlice, ...]
    end_cause: str = ""  # EndCause; "" while live
    started_at: datetime | None = None  # when its pods last all ran; None if they never did

    @property
    def gpu_eq(self) -> float:
        return sum(s.gpu_eq for s in self.slices)

    @property
    def reclaimed_idle(self) -> bool:
        return self.end_cause == EndCause.RECLAIMED_IDLE and self.finished_at is not None


@dataclass(frozen=True)
class WorkloadRecord:
    """A submitted workload, for the waiting-time report."""

    workload_id: str
    workload: str
    team_id: str
    team: str
    queue: str
    state: str
    submitted_at: datetime
    first_admitted_at: datetime | None  # its first run's admission; None if never admitted
    finished_at: datetime | None
    gpu_eq: float  # what the whole gang asks for (every replica), as the core counts gpu-eq


@dataclass(frozen=True)
class QueueRecord:
    """A queue's entitlement inputs, as configured now: its own and its team's GPU guarantees (the
    sum of their GPU amounts, gpu-eq or per model) and its fair-share weight."""

    queue: str
    team_id: str
    team: str
    guaranteed: float
    team_guaranteed: float
    weight: float


class WindowSum(NamedTuple):
    """The telemetry windows of one run on one node (and MIG profile) inside one bucket of a
    report, summed. Only windows with an activity reading count, each for the seconds it overlaps
    both the bucket (up to `now`) and the run's allocation (admission to end). A NamedTuple: a
    timeline reads tens of thousands of them."""

    bucket: int  # index into the spans asked for
    run_id: str
    node: str
    mig_profile: str | None
    measured_seconds: float  # the overlaps
    used_seconds: float  # each overlap x the window's activity mean (0..1)
    idle_seconds: float  # the overlaps of windows whose activity mean is below the idle threshold


class ReportRepository(Protocol):
    def runs(self, start: datetime, end: datetime, team_id: str | None) -> list[RunRecord]:
        """Runs whose allocation overlaps `[start, end)` (admitted before `end`, not finished
        before `start`), of one team or of all."""
        ...

    def window_sums(
        self,
        spans: Sequence[tuple[datetime, datetime]],
        team_id: str | None,
        now: datetime,
        idle_threshold: float,
    ) -> list[WindowSum]:
        """The telemetry windows of runs (of one team or of all) summed per bucket, run, node and
        MIG profile, in the database: what `report_accounting.window_sums` computes from windows in
        hand. `spans` are consecutive buckets of one length from the first one's start, the last
        possibly cut short (what `report_over_time.buckets` gives, or one range); a window counts in
        a bucket when it starts in `[lo - WINDOW_LOOKBACK, hi)`."""
        ...

    def workloads(self, start: datetime, end: datetime, team_id: str | None) -> list[WorkloadRecord]:
        """Workloads submitted in `[start, end)`, of one team or of all."""
        ...

    def first_allocation(self, start: datetime, end: datetime, team_id: str | None) -> datetime | None:
        """When the earliest run whose allocation overlaps `[start, end)` was admitted (one
        aggregate, no run read), of one team or of all; None: no such run."""
        ...

    def queues(self) -> list[QueueRecord]:
        """Every queue with its guarantees and weight."""
        ...

    def capacity_gpu_eq(self) -> float:
        """The fleet's GPUs now: every pool's nodes x GPUs per node (a MIG or shared GPU counts 1)."""
        ...

    def beneficiary_teams(self, run_ids: Sequence[str]) -> dict[str, str]:
        """Run id -> the team of the workload its eviction was for, where the audit log recorded it."""
        ...

    def marked(self, action: str, object_id: str) -> bool:
        """Whether the audit log holds an entry with this action and object id."""
        ...
