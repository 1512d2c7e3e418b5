"""What the idle pass reads and writes through its repository (candidates and findings).

A leaf module, so the ports can name `IdleRepository` without importing the idle use cases.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol


@dataclass(frozen=True)
class IdleCandidate:
    """A running run, with what the idle policy needs to judge it."""

    run_id: str
    workload_id: str
    workload_name: str
    team: str
    queue: str
    priority_class: str
    kind: str
    cluster: str
    started_at: datetime | None
    gpu_devices: int
    gpu_eq: float


@dataclass(frozen=True)
class IdleFinding:
    run_id: str
    workload_id: str
    cluster: str
    status: str
    stage: str
    idle_windows: int
    reason: str
    evidence: tuple[Mapping[str, Any], ...]
    action: str
    stage_since: datetime
    updated_at: datetime


class IdleRepository(Protocol):
    def candidates(self, run_ids: Collection[str] | None = None) -> list[IdleCandidate]:
        """Running runs the idle policy judges; with `run_ids`, only those of them."""
        ...

    def findings(self) -> dict[str, IdleFinding]: ...
    def finding(self, run_id: str) -> IdleFinding | None: ...
    def put_finding(self, finding: IdleFinding) -> None: ...
    def drop_findings(self, run_ids: Sequence[str]) -> None: ...
