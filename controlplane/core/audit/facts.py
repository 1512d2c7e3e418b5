"""What the audit reads about the fleet, as plain values the service layer loads (no I/O here)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from controlplane.domain.model import Taint
from controlplane.domain.sharing import SharingKind, SharingMode


@dataclass(frozen=True)
class AuditThresholds:
    """The audit's configurable thresholds (`audit:` in gpufleet.yaml); defaults in docs/concepts/audit.md."""

    lookback_hours: float = 24.0  # allocation-vs-use and recently submitted training are judged over this
    min_utilization: float = 0.3  # a team's used / measured GPU-hours below this is far below its allocation
    min_measured_gpu_hours: float = 1.0  # below this a team's use is too small to judge
    high_utilization: float = 0.1  # below this the allocation-unused finding is high, else warning


@dataclass(frozen=True)
class PoolFact:
    cluster: str
    name: str
    gpu_model: str
    sharing: SharingMode
    gpus_per_node: int
    node_count: int
    taints: tuple[Taint, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.cluster}/{self.name}"

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.node_count


@dataclass(frozen=True)
class NodePodsFact:
    """Live pods on one GPU node that gpufleet did not place, ask for no GPU and are no DaemonSet's."""

    cluster: str
    pool: str
    node: str
    count: int
    sample: tuple[str, ...]  # up to 8 `namespace/name`


@dataclass(frozen=True)
class ClusterFact:
    name: str
    provider: str
    gang: str = "none"  # kubernetes.gang of a real cluster: none | volcano | coscheduling | kueue

    @property
    def starts_gangs_whole(self) -> bool:
        # A simulated cluster starts every pod of a run at once by construction; a real one only with
        # a gang mechanism (otherwise kube-scheduler may bind some pods and leave the rest Pending).
        return self.provider == "sim" or self.gang != "none"


@dataclass(frozen=True)
class TreeFact:
    level: str  # cohort | team | queue
    name: str
    parent: str | None  # the cohort of a team, the team of a queue
    guaranteed: Mapping[str, float] = field(default_factory=dict)
    limit: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ClassFact:
    name: str
    value: int
    preemptible: bool
    min_runtime_seconds: int


@dataclass(frozen=True)
class RunFact:
    """A live run, or one created or ended within the lookback."""

    run_id: str
    workload: str
    team: str
    queue: str
    cluster: str
    pools: tuple[str, ...]  # `cluster/pool` of the pools its pods hold
    kind: str  # training | inference | interactive | batch
    preemptible: bool  # False: production priority (its class is never preempted)
    pods: int
    live: bool
    running: bool
    created_at: datetime
    started_at: datetime | None
    gpu_eq: float
    last_window_end: datetime | None = None  # the end of its newest telemetry window
    # The idle policy's `stale_seconds` for this run: measured less recently than this, it is unknown.
    stale_seconds: float = 900.0
    idle_stage: str = ""  # notify | deprioritize | reclaim while the idle policy marks it, else ""
    idle_windows: int = 0
    # Ended within the lookback because the idle policy reclaimed its GPUs for a waiting gang.
    reclaimed_idle_at: datetime | None = None


@dataclass(frozen=True)
class ServingFact:
    """A live inference run's serving signal: what it declared and the latest reading of it."""

    run_id: str
    workload: str
    team: str
    running_since: datetime | None  # when it started running; None while it has not
    traffic_declared: bool  # a traffic metric the idle policy can read
    latency_objective_ms: float | None
    requests_per_second: float | None
    latency_ms: float | None
    observed_at: datetime | None  # of the latest reading


@dataclass(frozen=True)
class TeamUseFact:
    """A team's GPU-hours over the lookback, from the utilization report's accounting."""

    team: str
    allocated_gpu_hours: float
    measured_gpu_hours: float
    used_gpu_hours: float
    price_per_gpu_hour: float  # mean over its allocation, weighted by GPU-hours


@dataclass(frozen=True)
class AuditFacts:
    pools: tuple[PoolFact, ...] = ()
    node_pods: tuple[NodePodsFact, ...] = ()
    clusters: tuple[ClusterFact, ...] = ()
    tree: tuple[TreeFact, ...] = ()
    classes: tuple[ClassFact, ...] = ()
    runs: tuple[RunFact, ...] = ()
    team_use: tuple[TeamUseFact, ...] = ()
    serving: tuple[ServingFact, ...] = ()
    # The default idle policy's stale_seconds: a cluster with running runs and no window this recent
    # sends no telemetry.
    stale_seconds: float = 900.0

    def teams(self) -> tuple[str, ...]:
        return tuple(sorted(t.name for t in self.tree if t.level == "team"))

    def mig_pools(self) -> tuple[PoolFact, ...]:
        return tuple(p for p in self.pools if p.sharing.kind is SharingKind.MIG)
