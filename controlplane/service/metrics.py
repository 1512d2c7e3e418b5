"""What gpufleet tells its operators about itself: the metrics port the loops and services report to.

The service layer knows no metrics library: it calls a `Metrics` (a Protocol) and the composition root
hands it the Prometheus adapter (`adapters/prometheus`), or nothing (`NO_METRICS`, the default of every
call site, for tests, simulators and benchmarks). Every call reports a committed fact: callers observe
after their transaction commits, never for a decision that may still be rolled back.

Label values are bounded by construction: queues, clusters and providers are names an administrator
registered; kinds, phases and outcomes are small enums; no free text is ever a label value (the
adapter also caps the number of distinct values per label, as a backstop). Run ids and workload
names appear only in the per-run SLO gauges (`RunUtilization`, `RunServing`), which a reader cuts to
a configured number of runs (`DEFAULT_MAX_RUN_SERIES`).

Gauges that come from SQL state (backlogs, quota, pending gangs, leases, idle findings) are not
pushed by the hot path: a `FleetGaugeReader` reads them with a few bounded aggregate queries when
Prometheus scrapes, and the adapter turns the `FleetGauges` it returns into metric families.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Protocol

from controlplane.core.decision import EvictionKind, PendingKind
from controlplane.service.errors import StoreUnavailable, TransactionConflict


class CyclePhase(StrEnum):
    """The parts of one scheduling cycle, timed separately (`gpufleet_scheduler_cycle_seconds`)."""

    SNAPSHOT = "snapshot"  # read the fleet, queues and workloads in one read transaction
    PARK = "park"  # the kept state parks what waits and stores those reasons (not one-shot)
    SCHEDULE = "schedule"  # the pure core decides the rest
    CHECK = "check"  # invariant check of the decision (only when `check_invariants` is on)
    APPLY = "apply"  # write evictions, admissions and pending reasons under the epoch


class DispatchFailure(StrEnum):
    TRANSIENT = "transient"  # the call failed; retried next pass
    PERMANENT = "permanent"  # the cluster can never take the run as ordered; the run failed
    NO_DRIVER = "no-driver"  # no client for the cluster (unreachable, credentials missing)


class ClusterOperation(StrEnum):
    APPLY = "apply"
    TEARDOWN = "teardown"
    LIST = "list"  # orphan collection lists what the cluster holds


class Writer(StrEnum):
    """Who retried a database transaction (`gpufleet_db_retries_total`)."""

    SCHEDULER = "scheduler"
    DISPATCHER = "dispatcher"
    INGEST = "ingest"
    API = "api"


class RetryCause(StrEnum):
    """Why a transaction was retried: the database aborted it to settle a conflict with a concurrent
    one (`deadlock`; `serialization`), or it could not be reached (`unavailable`)."""

    DEADLOCK = "deadlock"
    SERIALIZATION = "serialization"
    UNAVAILABLE = "unavailable"


def retry_cause(exc: StoreUnavailable) -> RetryCause:
    return RetryCause(exc.cause) if isinstance(exc, TransactionConflict) else RetryCause.UNAVAILABLE


EVICTION_KINDS = tuple(str(kind) for kind in EvictionKind)

# A queued gang's reason kind is the scheduler's typed `PendingKind` (stored as
# `pending_reasons.kind`), a bounded set; a gang the scheduler has not decided on since it was
# submitted or requeued has no pending row ("unscheduled"). Anything else counts as "other".
PENDING_REASON_KINDS = tuple(str(kind) for kind in PendingKind)
UNSCHEDULED = "unscheduled"
OTHER = "other"


def pending_reason_kind(kind: str) -> str:
    """The label value for a stored pending reason kind: the kind, `unscheduled`, or `other`."""
    if not kind:
        return UNSCHEDULED
    return kind if kind in PENDING_REASON_KINDS else OTHER


def eviction_kind(kind: str) -> str:
    return kind if kind in EVICTION_KINDS else OTHER


class Metrics(Protocol):
    """Counters and timings of one process; see `docs/operating.md` for the metric names."""

    def cycle_phase(self, phase: CyclePhase, seconds: float) -> None: ...
    def cycle_done(self, seconds: float, pending: int) -> None: ...
    def admitted(self, queue: str, since_submit_seconds: float | None) -> None: ...
    def evicted(self, kind: str) -> None: ...
    def started(self, queue: str, since_submit_seconds: float) -> None:
        """A run's gang reached `running` (time from the workload's submission)."""
        ...

    def dispatched(self, cluster: str, seconds: float, created: bool) -> None: ...
    def dispatch_failed(self, cluster: str, operation: ClusterOperation, failure: DispatchFailure) -> None: ...
    def torn_down(self, cluster: str) -> None: ...
    def ingested(self, consumer: str, outcome: str, lag_seconds: float | None, count: int = 1) -> None:
        """`count` inbound messages handled with `outcome`; lag: now minus when the stream stored
        the (oldest) one, observed once per call."""
        ...

    def telemetry_batch(self, messages: int, samples: int, windows: int) -> None: ...
    def relayed(self, published: int, failed: bool) -> None: ...
    def relay_dead_lettered(self) -> None:
        """An event the server can never take was moved to the dead-letter stream (and skipped)."""
        ...

    def inbound_refused(self, reason: str) -> None:
        """The inbound gateway refused a sender's message; `reason` is one of a few fixed codes."""
        ...

    def lease(self, lease: str, epoch: int | None) -> None:
        """This process holds `lease` at `epoch` (just acquired or renewed), or no longer holds it."""
        ...

    def consumer_pending(self, consumer: str, pending: int, ack_pending: int) -> None:
        """The broker's count of messages a durable consumer has not delivered / not seen acked."""
        ...

    def cloud_call(self, provider: str, operation: str, outcome: str, seconds: float) -> None: ...
    def api_request(self, method: str, route: str, status: int, seconds: float) -> None:
        """One answered API request; `route` is the route's template (`/v1/workloads/{workload_id}`)."""
        ...

    def db_retry(self, writer: Writer, cause: RetryCause) -> None:
        """A transaction of `writer` failed for `cause` and is run again: at once after a conflict
        (`service/retries.py`), or by its loop after a backoff or at its next pass. (An API request
        that still fails is answered 503 for its caller to retry: `gpufleet_api_requests_total`.)"""
        ...


class NoMetrics:
    """Reports nothing: the default wherever no metrics adapter is wired."""

    def cycle_phase(self, phase: CyclePhase, seconds: float) -> None:
        pass

    def cycle_done(self, seconds: float, pending: int) -> None:
        pass

    def admitted(self, queue: str, since_submit_seconds: float | None) -> None:
        pass

    def evicted(self, kind: str) -> None:
        pass

    def started(self, queue: str, since_submit_seconds: float) -> None:
        pass

    def dispatched(self, cluster: str, seconds: float, created: bool) -> None:
        pass

    def dispatch_failed(self, cluster: str, operation: ClusterOperation, failure: DispatchFailure) -> None:
        pass

    def torn_down(self, cluster: str) -> None:
        pass

    def ingested(self, consumer: str, outcome: str, lag_seconds: float | None, count: int = 1) -> None:
        pass

    def telemetry_batch(self, messages: int, samples: int, windows: int) -> None:
        pass

    def relayed(self, published: int, failed: bool) -> None:
        pass

    def relay_dead_lettered(self) -> None:
        pass

    def inbound_refused(self, reason: str) -> None:
        pass

    def lease(self, lease: str, epoch: int | None) -> None:
        pass

    def consumer_pending(self, consumer: str, pending: int, ack_pending: int) -> None:
        pass

    def cloud_call(self, provider: str, operation: str, outcome: str, seconds: float) -> None:
        pass

    def api_request(self, method: str, route: str, status: int, seconds: float) -> None:
        pass

    def db_retry(self, writer: Writer, cause: RetryCause) -> None:
        pass


NO_METRICS: Metrics = NoMetrics()


def seconds_between(start: datetime | None, end: datetime) -> float | None:
    """Non-negative seconds from `start` to `end` (clocks of two writers may disagree a little)."""
    if start is None:
        return None
    return max(0.0, (end - start).total_seconds())


# -- gauges read from SQL at scrape time ---------------------------------------------------------


@dataclass(frozen=True)
class QueueQuota:
    queue: str
    team: str
    # By resource ("gpu-eq" or a GPU model): GPU-equivalents held by live runs, and the quota.
    used: Mapping[str, float] = field(default_factory=dict)
    guaranteed: Mapping[str, float] = field(default_factory=dict)
    limit: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ClusterGpus:
    cluster: str
    gpu_model: str
    capacity: float  # GPUs on the cluster's schedulable nodes
    allocated: float  # GPU-equivalents held by live runs


@dataclass(frozen=True)
class LeaseState:
    lease: str
    epoch: int
    expires_in_seconds: float  # negative once expired: nobody holds it


@dataclass(frozen=True)
class RunUtilization:
    """A live run's effective utilization: the activity mean of its latest telemetry window."""

    run: str
    workload: str
    team: str
    queue: str
    cluster: str
    activity: float  # 0..1, the idle policy's signal (SM active, else graphics engine, else GPU_UTIL)


@dataclass(frozen=True)
class TeamUtilization:
    """A team over the last hour, by the utilization report's accounting (`reports.aggregate`)."""

    team: str
    allocated_gpu_hours: float
    measured_gpu_hours: float
    used_gpu_hours: float
    efficiency: float | None  # used / measured; None when nothing was measured
    allocated_gpus: float  # gpu-eq its live runs hold now


@dataclass(frozen=True)
class QueueWaits:
    """The queue's queued workloads now: how many, and how long since they were submitted."""

    queue: str
    team: str
    pending: int
    oldest_seconds: float
    p50_seconds: float
    p95_seconds: float


@dataclass(frozen=True)
class RunServing:
    """A live inference run's latest serving reading and its declared latency objective."""

    run: str
    workload: str
    team: str
    cluster: str
    requests_per_second: float | None
    latency_ms: float | None
    objective_ms: float | None


@dataclass(frozen=True)
class PoolGpus:
    """One node pool's GPUs: on schedulable nodes, held by live runs, busy by DCGM, flagged idle."""

    cluster: str
    pool: str
    gpu_model: str
    capacity: float  # GPUs on its schedulable nodes
    allocated: float  # GPU-equivalents held by live runs
    used: float  # GPUs measured in the recent windows times their mean activity: busy GPU-equivalents
    measured: int  # GPUs with a recent telemetry window
    idle: float  # GPU-equivalents held by runs the idle policy flagged (notify or beyond)


@dataclass(frozen=True)
class PendingDemand:
    """What queued gangs ask for, per the GPU models they accept ("" : any model)."""

    gpu_models: str
    gangs: int
    pods: int
    gpu_eq: float


# The per-run families (utilization, serving) carry a run label: a scrape holds at most this many
# runs of each, the lowest-utilization (or slowest) first, so a large fleet cannot blow it up.
DEFAULT_MAX_RUN_SERIES = 2_000


@dataclass(frozen=True)
class FleetGauges:
    """State the operators watch, read from SQL in one go (see `FleetGaugeReader`)."""

    pending: Mapping[tuple[str, str], int]  # (queue, reason kind) -> gangs waiting
    workloads: Mapping[tuple[str, str], int]  # (queue, state) -> workloads not finished
    quotas: tuple[QueueQuota, ...]
    gpus: tuple[ClusterGpus, ...]
    idle_findings: Mapping[tuple[str, str], int]  # (stage, team) -> live runs with that finding
    idle_gpus: Mapping[tuple[str, str], float]  # (stage, team) -> GPU-equivalents those runs hold
    sm_active: Mapping[str, float]  # cluster -> mean DCGM SM activity (0..1) over recent windows
    measured_gpus: Mapping[str, int]  # cluster -> GPUs with a recent telemetry window
    cluster_sync_errors: Mapping[str, int]  # cluster -> 1 when its last fleet sync failed
    outbox_backlog: int
    outbox_oldest_seconds: float  # age of the oldest unpublished event (0 with none)
    leases: tuple[LeaseState, ...]
    # The SLO link (issue 13): effective utilization per run and team, idle and unmeasured GPUs,
    # waits, serving signals. Empty by default so a reader that knows none of them stays valid.
    run_utilization: tuple[RunUtilization, ...] = ()
    team_utilization: tuple[TeamUtilization, ...] = ()
    idle_notified_gpus: Mapping[tuple[str, str], float] = field(default_factory=dict)  # (cluster, team) -> gpu-eq
    unmeasured_gpus: Mapping[str, float] = field(default_factory=dict)  # cluster -> gpu-eq of unmeasured runs
    queue_waits: tuple[QueueWaits, ...] = ()
    serving: tuple[RunServing, ...] = ()
    # The dashboard's fleet page: per node pool, and the queued demand per accepted GPU models.
    pools: tuple[PoolGpus, ...] = ()
    pending_demand: tuple[PendingDemand, ...] = ()
    cluster_runs: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (cluster, run state) -> live runs


class FleetGaugeReader(Protocol):
    def read(self, now: datetime) -> FleetGauges: ...
