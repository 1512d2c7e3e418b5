"""What the audit reads and writes through its repository: runs with what the rules need, and the
inventory's summary of non-GPU pods on GPU nodes.

A leaf module, so the ports and the inventory can name `AuditRepository` without importing the audit
use cases.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from controlplane.core.audit import NodePodsFact


@dataclass(frozen=True)
class AuditRun:
    """A run as the audit reads it (live, or created since the lookback's start). What its pods
    hold (pools, count, gpu-eq) comes from the utilization accounting's read of the same runs."""

    run_id: str
    workload: str
    team: str
    queue: str
    cluster: str
    kind: str
    priority_class: str
    preemptible: bool
    state: str
    created_at: datetime
    started_at: datetime | None
    last_window_end: datetime | None  # the end of its newest telemetry window, if any
    finished_at: datetime | None = None
    end_cause: str = ""  # controlplane.core.decision.EndCause; "" while live


@dataclass(frozen=True)
class NodePods:
    """One node's non-GPU pods, as an inventory report carries them: how many, and up to 8 names."""

    count: int
    sample: tuple[str, ...]


class AuditRepository(Protocol):
    def runs(self, since: datetime) -> list[AuditRun]:
        """Every live run, and every run created or ended at or after `since`."""
        ...

    def node_pods(self) -> list[NodePodsFact]:
        """The last inventory's non-GPU pods per GPU node (nodes with none are left out)."""
        ...

    def put_node_pods(self, cluster_id: str, by_node: Mapping[str, NodePods], now: datetime) -> None:
        """Replace the cluster's summaries with `by_node` (an empty mapping forgets them all)."""
        ...
