"""The runs a utilization report reads through its repository.

A leaf module, so the ports can name `ReportRepository` without importing the report use cases.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from controlplane.core.decision import EndCause


@dataclass(frozen=True)
class RunSlice:
    """One pod of a run: where it runs and what it holds."""

    node: str
    gpu_model: str
    gpu_eq: float
    # gpu-eq of each whole or shared GPU the pod reports telemetry for (1, or 1 / replicas);
    # MIG instances carry their profile in the window instead.
    device_share: float = 1.0
    price_per_gpu_hour: float = 0.0  # the price of its node's pool


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

    @property
    def gpu_eq(self) -> float:
        return sum(s.gpu_eq for s in self.slices)

    @property
    def reclaimed_idle(self) -> bool:
        return self.end_cause == EndCause.RECLAIMED_IDLE and self.finished_at is not None


class ReportRepository(Protocol):
    def runs(self, start: datetime, end: datetime, team_id: str | None) -> list[RunRecord]:
        """Runs whose allocation overlaps `[start, end)` (admitted before `end`, not finished
        before `start`), of one team or of all."""
        ...

    def marked(self, action: str, object_id: str) -> bool:
        """Whether the audit log holds an entry with this action and object id."""
        ...
