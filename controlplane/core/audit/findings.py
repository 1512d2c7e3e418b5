"""What the audit concludes, as data: one `Finding` per broken rule and object, with typed evidence.

Nothing here is prose: `controlplane/service/audit_wording.py` renders each finding's title, evidence
and fix for people, and machines read the rule id, the severity, the objects and the evidence fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum


class Severity(StrEnum):
    INFO = "info"
    WARNING = "warning"
    HIGH = "high"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        return _RANK[self]

    def at_least(self, other: Severity) -> bool:
        return self.rank >= other.rank


_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.HIGH: 2, Severity.CRITICAL: 3}


class Rule(StrEnum):
    """Stable rule ids: CI pipelines filter on them (`gpufleet audit --rule ...`)."""

    GPU_POOL_UNTAINTED = "gpu-pool-untainted"
    NON_GPU_PODS_ON_GPU_NODES = "non-gpu-pods-on-gpu-nodes"
    TIMESLICE_SHARED_PRODUCTION = "timeslice-shared-production"
    SHARED_INFERENCE_NOT_MIG = "shared-inference-not-mig"
    TIMESLICE_POOL_OPEN_TO_ALL = "timeslice-pool-open-to-all"
    TEAM_WITHOUT_LIMIT = "team-without-limit"
    QUEUE_WITHOUT_LIMIT = "queue-without-limit"
    CLASS_WITHOUT_PREEMPTION_POLICY = "priority-class-without-preemption-policy"
    FLEET_WITHOUT_GUARANTEE = "fleet-without-guarantee"
    TRAINING_WITHOUT_GANG = "training-without-gang"
    CLUSTER_WITHOUT_TELEMETRY = "cluster-without-telemetry"
    RUN_UNMEASURED = "run-unmeasured"
    ALLOCATION_UNUSED = "allocation-unused"
    IDLE_RUN = "idle-run"
    IDLE_RECLAIMED = "idle-reclaimed"
    INFERENCE_TRAFFIC_UNKNOWN = "inference-traffic-unknown"
    LATENCY_OBJECTIVE_MISSED = "latency-objective-missed"


class Fix(StrEnum):
    """What to do about a finding (the wording layer says it in full, with the finding's objects)."""

    ADD_GPU_TAINT = "add-gpu-taint"
    KEEP_NON_GPU_PODS_OFF = "keep-non-gpu-pods-off"
    ISOLATE_SHARED_WORK = "isolate-shared-work"
    MOVE_INFERENCE_TO_MIG = "move-inference-to-mig"
    RESTRICT_TIMESLICE_POOL = "restrict-timeslice-pool"
    SET_LIMIT = "set-limit"
    SET_PREEMPTION_POLICY = "set-preemption-policy"
    SET_GUARANTEE = "set-guarantee"
    ENABLE_GANG = "enable-gang"
    DEPLOY_TELEMETRY = "deploy-telemetry"
    RIGHT_SIZE = "right-size"
    RELEASE_IDLE_GPUS = "release-idle-gpus"
    DECLARE_TRAFFIC = "declare-traffic"
    ISOLATE_OR_SCALE = "isolate-or-scale"


@dataclass(frozen=True, order=True)
class ObjectRef:
    """An object a finding concerns: kind (pool, node, cluster, team, queue, priority-class, run,
    workload) and its name (`cluster/pool` for a pool, the id for a run)."""

    kind: str
    name: str


# --- evidence, one type per rule ----------------------------------------------------------------


@dataclass(frozen=True)
class PoolUntainted:
    gpus: int  # GPUs of the pool (nodes x GPUs per node)
    taints: tuple[str, ...]  # the taints it has, none of which keeps pods off (`key=value:Effect`)


@dataclass(frozen=True)
class NonGpuPods:
    nodes: int  # GPU nodes of the pool with such pods
    pods: int
    sample: tuple[str, ...]  # up to 8 `namespace/name`


@dataclass(frozen=True)
class SharedProduction:
    sharing: str
    runs: int  # this team's inference or production runs on the pool
    inference: int
    production: int
    other_teams: int  # other teams with such work on the same pool (counted, never named)


@dataclass(frozen=True)
class SharedInference:
    sharing: str
    runs: int
    other_teams: int
    mig_pools: int  # MIG pools of the fleet


@dataclass(frozen=True)
class TimeslicePoolOpen:
    sharing: str
    teams: int  # every team of the fleet may use it
    mig_pools: tuple[str, ...]


@dataclass(frozen=True)
class NoLimit:
    level: str  # team | queue
    bounded_by: str  # "" when nothing above bounds it, else the level that does (team | cohort)


@dataclass(frozen=True)
class ClassPolicy:
    value: int
    preemptible: bool
    min_runtime_seconds: int


@dataclass(frozen=True)
class NoGuarantee:
    queues: int


@dataclass(frozen=True)
class GangMissing:
    gang: str  # the cluster's gang setting
    runs: int
    largest_pods: int
    sample: tuple[str, ...]  # up to 8 workload names of the team


@dataclass(frozen=True)
class NoTelemetry:
    running_runs: int
    last_window_at: datetime | None
    stale_seconds: float


@dataclass(frozen=True)
class Unmeasured:
    workload: str
    unmeasured_seconds: float
    limit_seconds: float
    gpu_eq: float


@dataclass(frozen=True)
class AllocationUnused:
    lookback_hours: float
    allocated_gpu_hours: float
    measured_gpu_hours: float
    used_gpu_hours: float
    utilization: float  # used / measured
    min_utilization: float
    wasted_gpu_hours: float  # measured - used
    cost_at_stake: float  # wasted GPU-hours x the team's mean price per GPU-hour


@dataclass(frozen=True)
class IdleRun:
    workload: str
    stage: str
    idle_windows: int
    gpu_eq: float


@dataclass(frozen=True)
class IdleReclaimed:
    workload: str
    reclaims: int  # its runs the idle policy reclaimed within the lookback
    gpu_eq: float  # of the last one
    last_reclaimed_at: datetime
    lookback_hours: float


@dataclass(frozen=True)
class TrafficUnknown:
    workload: str
    declared: bool  # False: no traffic metric declared; True: declared, but no fresh reading
    last_reading_at: datetime | None
    stale_seconds: float


@dataclass(frozen=True)
class LatencyMissed:
    workload: str
    latency_ms: float
    objective_ms: float
    observed_at: datetime
    shared_pools: tuple[str, ...]  # the time-sliced or MPS pools it runs on: a neighbour may cause it


Evidence = (
    PoolUntainted
    | NonGpuPods
    | SharedProduction
    | SharedInference
    | TimeslicePoolOpen
    | NoLimit
    | ClassPolicy
    | NoGuarantee
    | GangMissing
    | NoTelemetry
    | Unmeasured
    | AllocationUnused
    | IdleRun
    | IdleReclaimed
    | TrafficUnknown
    | LatencyMissed
)


@dataclass(frozen=True)
class Audience:
    """Who may read a finding besides admins. `team`: that team only (it names the team's own
    objects); `fleet`: any team (it names only pools, clusters, priority classes and counts);
    neither: admins only (it names objects that belong to no team, such as other tenants' pods)."""

    fleet: bool = False
    team: str | None = None


FLEET = Audience(fleet=True)
ADMINS = Audience()


@dataclass(frozen=True)
class Finding:
    rule: Rule
    severity: Severity
    objects: tuple[ObjectRef, ...]
    evidence: Evidence
    fix: Fix
    audience: Audience

    def visible_to(self, team: str | None) -> bool:
        """Whether a caller of `team` (None: an admin) may read it."""
        return team is None or self.audience.fleet or self.audience.team == team

    @property
    def sort_key(self) -> tuple[int, str, tuple[ObjectRef, ...]]:
        return (-self.severity.rank, self.rule.value, self.objects)


def team_of(team: str) -> Audience:
    return Audience(team=team)
