"""Read models the API and CLI show. Plain values built by the persistence adapter."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any

from pydantic import Field

from controlplane.domain.limits import MAX_NODES_SHOWN, MAX_PAGE_BYTES, MAX_RUNS_SHOWN

# Descriptions in the OpenAPI document of the fields that are bounded (`controlplane.domain.limits`).
_NODES = f"the current run's nodes by name, in order: the first {MAX_NODES_SHOWN} (`node_count` counts all)"
_RUNS = f"the latest {MAX_RUNS_SHOWN} runs, oldest first (`attempts` counts all)"
_NEXT = (
    "null on the last page; else pass it as `cursor` (with the same filters) for the items after this page. "
    f"A page ends early when one more item would take it past {MAX_PAGE_BYTES:,} bytes"
)


@dataclass(frozen=True)
class NodeView:
    id: str
    name: str
    schedulable: bool


@dataclass(frozen=True)
class PoolView:
    id: str
    name: str
    gpu_model: str
    gpus_per_node: int
    cpu_millis: int
    memory_mib: int
    sharing: str
    taints: list[dict[str, str]]
    labels: dict[str, str]
    price_per_gpu_hour: float
    spot: bool
    node_count: int
    nodes: list[NodeView] = field(default_factory=list)
    # Cloud pools: bounds from the cloud, and the size the autoscaler last asked for.
    min_size: int = 0
    max_size: int | None = None
    instance_type: str = ""
    cloud_pool_id: str = ""
    scale_target: int | None = None
    resource_names: dict[str, str] = field(default_factory=dict)
    max_shares_per_pod: int = 0


@dataclass(frozen=True)
class ClusterView:
    id: str
    name: str
    provider: str
    region: str
    created_at: datetime
    pools: list[PoolView]
    # Real clusters: the cloud locator, Kubernetes settings and the fleet-sync state. No secrets.
    account: str = ""
    cloud_cluster: str = ""
    resource_group: str = ""
    cloud_cluster_id: str = ""
    kubernetes: dict[str, Any] = field(default_factory=dict)
    sync_state: str = "ready"  # pending (not discovered yet) | ready | error
    sync_error: str = ""
    synced_at: datetime | None = None
    pool_issues: list[str] = field(default_factory=list)  # discovered pools gpufleet could not map
    pool_prices: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class TreeNodeView:
    id: str
    name: str
    parent_id: str | None
    guaranteed: dict[str, float]
    limit: dict[str, float]
    weight: float
    created_at: datetime
    parent: str | None = None  # the parent's name: the team of a queue, the cohort of a team
    borrowing_limit: dict[str, float] = field(default_factory=dict)
    lending_limit: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class QueueRef:
    """A queue and its team, by id and name: what a submit needs of them (one query, no quotas)."""

    id: str
    name: str
    team_id: str
    team: str
    # Whether the API token asked about with the queue (`AdminRepository.queue_ref`) exists and is
    # not revoked; True when none was asked about.
    token_active: bool = True


@dataclass(frozen=True)
class PriorityClassView:
    name: str
    value: int
    preemptible: bool
    min_runtime_seconds: int
    is_default: bool


@dataclass(frozen=True)
class TokenView:
    id: str
    name: str
    role: str
    team_id: str | None
    created_at: datetime
    revoked_at: datetime | None


@dataclass(frozen=True)
class ClusterCredential:
    """A cluster agent's NATS credential (the secret itself is shown once and never stored)."""

    id: str
    cluster: str
    created_at: datetime
    revoked_at: datetime | None


@dataclass(frozen=True)
class Principal:
    """Who is calling: an admin, or a member of one team."""

    token_id: str
    role: str
    team_id: str | None

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"


@dataclass(frozen=True)
class PlacementView:
    """Where a run's pods are, counted: `pods` of pod set `pod_set` on `nodes` nodes of pool `pool`.
    A run has one per pod set and pool it uses, so its size does not grow with the pod count."""

    pod_set: str
    pool: str
    pods: int
    nodes: int


@dataclass(frozen=True)
class IdleView:
    """What the idle policy last concluded about a run (anti-hoarding), as the API shows it."""

    status: str  # busy | idle | unknown | grace | exempt
    stage: str  # none | notify | deprioritize | reclaim
    idle_windows: int
    reason: str
    stage_since: datetime
    updated_at: datetime


@dataclass(frozen=True)
class ServingView:
    """The latest serving reading of an inference run (its declared traffic and latency metrics)."""

    requests_per_second: float | None
    latency_ms: float | None
    observed_at: datetime


@dataclass(frozen=True)
class RunView:
    id: str
    attempt: int
    cluster: str
    epoch: int
    state: str
    message: str
    created_at: datetime
    dispatched_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    placement: list[PlacementView]
    idle: IdleView | None = None
    end_cause: str = ""  # why it ended (EndCause: preempted, reclaimed-idle, node-lost, ...); "" while live
    serving: ServingView | None = None  # the latest traffic/latency reading of a serving run
    # Runs on capacity reserved for this waiting workload (id), which takes it back when it can start.
    lent_to: str | None = None


@dataclass(frozen=True)
class WorkloadView:
    id: str
    name: str
    team: str
    queue: str
    priority_class: str
    priority: int
    kind: str
    state: str
    reason: str
    queue_position: int | None
    min_available: int
    requires_isolation: bool
    pod_sets: list[dict[str, Any]]
    duration_seconds: float | None
    max_runtime_seconds: float | None
    spot: str
    same_pool: str
    idempotency_key: str | None
    labels: dict[str, str]
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    cluster: str | None
    # The current run's nodes, by name: the first `MAX_NODES_SHOWN` in order; `node_count` counts all.
    nodes: Annotated[list[str], Field(description=_NODES)]
    # The latest `MAX_RUNS_SHOWN` runs, oldest first; `attempts` counts all.
    runs: Annotated[list[RunView], Field(description=_RUNS)]
    # While queued: the kind of `reason` and its structured fields (queue, limit, amount, cluster,
    # reservation, ...) as the scheduler decided them; None before its first decision.
    reason_detail: dict[str, Any] | None = None
    # An inference workload's declared `serving` block (metrics, latency objective), or None.
    serving: dict[str, Any] | None = None
    node_count: int = 0
    attempts: int = 0


@dataclass(frozen=True)
class NodeLoad:
    """A node of a pool as the dashboard's node view shows it: its GPUs and what live runs hold."""

    name: str
    schedulable: bool
    gpus: int
    allocated_gpu_eq: float  # GPU-equivalents held by live runs' pods on it
    pods: int  # live runs' pods on it
    # (id, name, team id) of live workloads on it, at most a few; the rest are only counted in `pods`
    workloads: tuple[tuple[str, str, str], ...]


@dataclass(frozen=True)
class WorkloadSummary:
    """A workload as lists show it: its pod sets (at most 16) and counts, never a pod or a run, so
    an item's size does not grow with the gang (`GET /v1/workloads/{id}` shows the runs)."""

    id: str
    name: str
    team: str
    queue: str
    priority_class: str
    priority: int
    kind: str
    state: str
    reason: str
    queue_position: int | None
    min_available: int
    pods: int  # all pod sets' replicas together
    pod_sets: list[dict[str, Any]]
    requires_isolation: bool
    duration_seconds: float | None
    max_runtime_seconds: float | None
    spot: str
    same_pool: str
    idempotency_key: str | None
    labels: dict[str, str]
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    cluster: str | None  # the current (or last, once finished) run's cluster; None while queued
    node_count: int  # nodes of that run
    attempts: int  # runs so far


@dataclass(frozen=True)
class Listed:
    """A list item and its place in the list's order (what a continuation cursor names)."""

    position: tuple[int, str]  # (created_seq, id): newest first, the id breaking ties
    workload: WorkloadSummary


@dataclass(frozen=True)
class WorkloadPage:
    """One page of `GET /v1/workloads`."""

    items: list[WorkloadSummary]
    # Pass as `cursor` (with the same filters) for the items after this page; null: there are none.
    # A page ends early, with `next` set, when one more item would take it past `MAX_PAGE_BYTES`.
    next: Annotated[str | None, Field(description=_NEXT)]
