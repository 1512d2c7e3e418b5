"""The small typed protocols the service layer needs from the outside world.

Adapters implement them; only the composition root (`controlplane.bootstrap`) picks which.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import TracebackType
from typing import Any, Protocol, Self

from controlplane.core.decision import Admission, EndCause
from controlplane.domain.model import Cluster, Node, Workload
from controlplane.service.audit_records import AuditRepository
from controlplane.service.cloud_state import CloudRepository
from controlplane.service.idle_records import IdleRepository
from controlplane.service.messaging_ports import Inbox, Outbox
from controlplane.service.report_records import ReportRepository
from controlplane.service.serving import ServingRepository
from controlplane.service.session_ports import UiSessionRepository
from controlplane.service.snapshot_ports import SnapshotReader
from controlplane.service.telemetry_window import TelemetryWindow, WindowQuery
from controlplane.service.views import (
    ClusterCredential,
    ClusterView,
    Listed,
    NodeLoad,
    PriorityClassView,
    QueueRef,
    TokenView,
    TreeNodeView,
    WorkloadView,
)


@dataclass(frozen=True)
class WorkloadFilter:
    team_id: str | None = None
    queue: str | None = None
    states: tuple[str, ...] = ()
    name: str | None = None
    limit: int = 100
    offset: int = 0
    # Only workloads after this place in the list's order (`Listed.position`): a page's cursor.
    after: tuple[int, str] | None = None
    # The list's order (`WORKLOAD_SORTS`); a cursor (`after`) follows the default order only.
    sort: str = "newest"


# The orders a workload list can be read in: newest first (the API's, which cursors follow), oldest
# first, highest priority first, by name, state, queue or team (each then newest first).
WORKLOAD_SORTS = ("newest", "oldest", "priority", "name", "state", "queue", "team")
# What a workload list's counts can be grouped by (`WorkloadRepository.counts`).
WORKLOAD_GROUPS = ("state", "queue", "team", "priority_class")


@dataclass(frozen=True)
class WorkloadHead:
    """The few fields the service layer needs to decide on a workload."""

    id: str
    team_id: str
    queue: str
    state: str
    version: int
    live_run_id: str | None


@dataclass(frozen=True)
class PendingRecord:
    """A pending reason as stored: the sentence for people, the kind and fields for machines."""

    workload_id: str
    text: str
    kind: str  # controlplane.core.decision.PendingKind
    detail: Mapping[str, Any]


@dataclass(frozen=True)
class PodOrder:
    pod_set: str
    index: int
    node: str
    pool: str
    demand: Mapping[str, int]


@dataclass(frozen=True)
class RunOrder:
    """Everything a cluster needs to start one run of a gang."""

    run_id: str
    workload_id: str
    workload_name: str
    team: str
    queue: str
    cluster: str
    epoch: int
    attempt: int
    priority_class: str
    min_available: int
    pods: tuple[PodOrder, ...]
    duration_seconds: float | None  # simulated clusters only: how long the pods pretend to work
    container: Mapping[str, Any] = field(default_factory=dict)
    # The workload's declared bound: a real cluster stops the pods after this long.
    max_runtime_seconds: float | None = None
    # The workload's own Kubernetes labels (never gpufleet.io/*), put on every object and pod.
    labels: Mapping[str, str] = field(default_factory=dict)
    # The value of `priority_class` when the workload was submitted (for cluster priority classes).
    priority: int = 0
    # An inference workload's declared serving block: put on its pods for the agent to scrape.
    serving: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Teardown:
    run_id: str
    cluster: str


@dataclass(frozen=True)
class RunStatus:
    run_id: str
    workload_id: str
    queue: str
    state: str
    min_available: int
    cluster: str = ""  # the cluster the run was placed on
    epoch: int = 0  # the scheduler epoch that placed it; reports must carry it
    team: str = ""
    # Pods it was admitted with: an elastic or partially admitted gang runs with more than
    # `min_available`, and has succeeded only when every one of them has.
    pod_count: int = 0


class AdminRepository(Protocol):
    def add_cluster(self, cluster: Cluster, nodes: Sequence[Node], now: datetime) -> None: ...
    def set_cluster_region(self, cluster_id: str, region: str) -> None: ...
    def get_cluster(self, ref: str) -> ClusterView | None: ...
    def known_clusters(self, names: Collection[str]) -> set[str]:
        """Those of `names` that name a registered cluster (cheap: no pools or nodes loaded)."""
        ...

    def list_clusters(self) -> list[ClusterView]: ...
    def delete_cluster(self, cluster_id: str) -> None: ...
    def cluster_has_live_runs(self, cluster_id: str) -> bool: ...

    def cluster_run_count(self, cluster_id: str) -> int: ...
    def pool_nodes(self, cluster_id: str, pool: str, limit: int) -> list[NodeLoad]:
        """The nodes of one pool (at most `limit`, by name) with what live runs hold on each."""
        ...

    def fleet(self) -> tuple[tuple[Cluster, ...], tuple[Node, ...]]: ...
    def apply_node_schedulable(
        self, cluster_id: str, schedulable: Mapping[str, bool], kube_settings: Mapping[str, Any]
    ) -> tuple[int, list[str]]:
        """Set `schedulable` of the cluster's nodes named in `schedulable` and merge `kube_settings` into
        the cluster's; returns (nodes changed, names the cluster has no node for)."""
        ...

    def add_tree_node(self, level: str, view: TreeNodeView) -> None: ...
    def update_tree_node(self, level: str, view: TreeNodeView) -> None: ...
    def get_tree_node(self, level: str, ref: str) -> TreeNodeView | None: ...
    def list_tree_nodes(self, level: str, parent_id: str | None = None) -> list[TreeNodeView]: ...
    def delete_tree_node(self, level: str, node_id: str) -> None: ...
    def tree_node_in_use(self, level: str, node_id: str) -> str | None: ...

    def put_priority_class(self, pc: PriorityClassView) -> None: ...
    def get_priority_class(self, name: str) -> PriorityClassView | None: ...
    def queue_ref(self, ref: str, token_id: str | None = None) -> QueueRef | None:
        """The queue with this id or name and its team, or None; with `token_id`, also whether that
        API token is active (in the same query: a submit checks its token in its own transaction)."""
        ...

    def default_priority_class(self) -> PriorityClassView | None: ...
    def list_priority_classes(self) -> list[PriorityClassView]: ...
    def delete_priority_class(self, name: str) -> None: ...
    def priority_class_in_use(self, name: str) -> bool: ...


@dataclass(frozen=True)
class NewWorkload:
    """What `WorkloadRepository.add` stores, for `add_many`."""

    workload: Workload
    container: Mapping[str, Any]
    labels: Mapping[str, str]
    idempotency_key: str | None
    fingerprint: str
    serving: Mapping[str, Any] | None = None  # an inference workload's `serving` block (ServingSpec)


# A new workload's reason until the scheduler's first decision about it.
QUEUED_REASON = "waiting for the next cycle"


class WorkloadRepository(Protocol):
    def add(
        self,
        workload: Workload,
        *,
        container: Mapping[str, Any],
        labels: Mapping[str, str],
        idempotency_key: str | None,
        fingerprint: str,
        now: datetime,
        serving: Mapping[str, Any] | None = None,
    ) -> None:
        """Store a new queued workload (reason `QUEUED_REASON`, version 1) and its pod sets. Raises
        `DuplicateKey` when the team used `idempotency_key` before; the transaction stays usable."""
        ...

    def add_many(self, new: Sequence[NewWorkload], now: datetime) -> set[str]:
        """`add` of many workloads in a few statements; returns the ids of those added (one whose
        team used its idempotency key before, or earlier in `new`, is not)."""
        ...

    def by_idempotency_key(self, team_id: str, key: str) -> tuple[str, str] | None:
        """(workload id, request fingerprint) of the submission that used this key."""
        ...

    def head(self, workload_id: str) -> WorkloadHead | None: ...
    def view(self, workload_id: str) -> WorkloadView | None: ...
    def list(self, flt: WorkloadFilter) -> list[Listed]: ...
    def counts(self, flt: WorkloadFilter, by: str) -> dict[str, int]:
        """How many workloads `flt` selects (its limit, offset and order ignored), grouped by `by`
        (one of `WORKLOAD_GROUPS`): one grouped count in the store, whatever the number of workloads."""
        ...

    def lock(self, workload_ids: Collection[str] = (), of_runs: Collection[str] = ()) -> None:
        """Lock these workloads and the workloads of these runs for this transaction, in the one lock
        order of every writer of workloads and runs (docs/concepts/reliability-security.md). Every
        writing method below takes the locks it needs itself; a transaction that writes several
        workloads or runs in several calls takes them all here first."""
        ...

    def set_state(
        self, workload_id: str, from_states: Sequence[str], to_state: str, reason: str, now: datetime
    ) -> bool: ...
    def set_states(
        self, changes: Sequence[tuple[str, str, str]], from_states: Sequence[str], now: datetime
    ) -> set[str]:
        """`set_state` for many workloads in one statement, `changes` as (workload id, to state,
        reason); the ids of those that moved (they were in one of `from_states`). A workload that
        leaves `queued` loses its pending reason."""
        ...

    def admit_all(self, admissions: Sequence[Admission], epoch: int, now: datetime) -> dict[str, str]:
        """Admit every workload of `admissions` that is still queued: a new run with its
        assignments each. Returns the queue name of each admitted workload by its id; one cancelled
        since the snapshot was read is left out."""
        ...

    def record_pending(self, reasons: Sequence[PendingRecord]) -> int:
        """Store the reasons of queued workloads whose reason, kind or position differs from the
        stored one, set-based (the store compares, nothing is read back); returns how many."""

    def submitted_at(self, workload_ids: Collection[str]) -> dict[str, datetime]:
        """When each of these workloads was submitted (metrics: time to admission and to running)."""
        ...

    def event_data(self, workload_id: str) -> dict[str, Any]: ...
    def event_data_many(self, workload_ids: Collection[str]) -> dict[str, dict[str, Any]]:
        """`event_data` of each of these workloads, by id, in a few queries however many."""
        ...


class RunRepository(Protocol):
    def to_dispatch(self, limit: int, clusters: Collection[str] | None = None) -> list[RunOrder]:
        """Oldest runs waiting to be applied, of `clusters` only when given."""
        ...

    def to_teardown(self, limit: int, clusters: Collection[str] | None = None) -> list[Teardown]: ...
    def set_dispatch_state(self, run_id: str, from_state: str, to_state: str, now: datetime) -> bool: ...
    def status(self, run_id: str) -> RunStatus | None: ...
    def set_state(
        self,
        run_id: str,
        from_states: Sequence[str],
        to_state: str,
        message: str,
        now: datetime,
        cause: EndCause | None = None,
    ) -> bool:
        """Move the run from one of `from_states`; a run that ends records `cause` (by default the
        one its terminal state implies: succeeded, failed, cancelled, preempted)."""
        ...

    def end_all(
        self, ends: Sequence[tuple[str, str, EndCause]], from_states: Sequence[str], to_state: str, now: datetime
    ) -> set[str]:
        """End many runs in one statement, `ends` as (run id, message, cause), each moved to the
        terminal `to_state` from one of `from_states`; the ids of those that moved."""
        ...

    def live_run_ids(self, cluster: str) -> set[str]: ...
    def clusters_of(self, run_ids: Collection[str]) -> dict[str, str]:
        """Cluster name by run id, for those of `run_ids` that exist."""
        ...


class LeaseRepository(Protocol):
    def acquire(self, name: str, holder: str, now: datetime, ttl_seconds: float) -> int | None: ...
    def renew(self, name: str, holder: str, epoch: int, now: datetime, ttl_seconds: float) -> bool: ...
    def release(self, name: str, holder: str, epoch: int) -> None: ...
    def expires_at(self, name: str) -> datetime | None: ...
    def expire_all(self) -> int: ...


class TokenRepository(Protocol):
    def add(self, view: TokenView, token_hash: str) -> None: ...
    def by_hash(self, token_hash: str) -> TokenView | None: ...
    def get(self, token_id: str) -> TokenView | None: ...
    def list(self, team_id: str | None) -> list[TokenView]: ...
    def revoke(self, token_id: str, now: datetime) -> None: ...
    def count_admin(self) -> int: ...


class ClusterCredentialRepository(Protocol):
    def add(self, credential_id: str, cluster_id: str, secret_hash: str, now: datetime) -> None: ...
    def by_hash(self, secret_hash: str) -> ClusterCredential | None: ...
    def for_cluster(self, cluster_id: str) -> list[ClusterCredential]: ...
    def revoke_all(self, cluster_id: str, now: datetime) -> list[str]: ...
    def still_valid(self, credential_ids: Sequence[str]) -> set[str]: ...


class AuditLog(Protocol):
    def record(
        self, actor: str, action: str, object_type: str, object_id: str, detail: Mapping[str, Any], now: datetime
    ) -> None: ...


class TelemetryRepository(Protocol):
    """GPU telemetry windows (roll-ups of DCGM samples, never raw samples)."""

    def claim_batches(self, consumer: str, msg_ids: Sequence[str], now: datetime) -> set[str]:
        """Record the ids in the inbox; return those not seen before (all in this transaction)."""
        ...

    def merge_windows(self, windows: Sequence[TelemetryWindow], now: datetime) -> None:
        """Upsert partial windows: counters add up, maxima take the larger, the latest XID wins."""
        ...

    def windows(self, query: WindowQuery) -> list[TelemetryWindow]: ...

    def prune(self, windows_before: datetime, consumer: str, inbox_before: datetime) -> tuple[int, int]:
        """Delete windows that ended before `windows_before`, and the consumer's old inbox rows."""
        ...


class UnitOfWork(Protocol):
    """One database transaction. Leaving the block without `commit()` rolls back."""

    @property
    def admin(self) -> AdminRepository: ...

    @property
    def workloads(self) -> WorkloadRepository: ...

    @property
    def runs(self) -> RunRepository: ...

    @property
    def outbox(self) -> Outbox: ...

    @property
    def inbox(self) -> Inbox: ...

    @property
    def leases(self) -> LeaseRepository: ...

    @property
    def tokens(self) -> TokenRepository: ...

    @property
    def cluster_credentials(self) -> ClusterCredentialRepository: ...

    @property
    def audit(self) -> AuditLog: ...

    @property
    def snapshots(self) -> SnapshotReader: ...

    @property
    def telemetry(self) -> TelemetryRepository: ...

    @property
    def idle(self) -> IdleRepository: ...

    @property
    def cloud(self) -> CloudRepository: ...

    @property
    def reports(self) -> ReportRepository: ...

    @property
    def audit_facts(self) -> AuditRepository: ...

    @property
    def serving(self) -> ServingRepository: ...

    @property
    def ui_sessions(self) -> UiSessionRepository: ...

    def __enter__(self) -> Self: ...
    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...
    def commit(self) -> None: ...


class UnitOfWorkFactory(Protocol):
    def __call__(self) -> UnitOfWork: ...


class PermanentDispatchError(Exception):
    """The run can never be created on its cluster as ordered (e.g. its manifests are invalid there):
    the dispatcher fails the run instead of retrying it."""


class ClusterDriver(Protocol):
    """One member cluster, as the dispatcher sees it. Every call is idempotent."""

    async def apply(self, order: RunOrder) -> bool:
        """Create the run's objects; False when they already existed (counts as success)."""
        ...

    async def delete(self, run_id: str) -> bool: ...

    async def list_owned(self) -> set[str]: ...


class EventPublisher(Protocol):
    async def publish(self, subject: str, payload: bytes, msg_id: str) -> None: ...


class Clock(Protocol):
    def now(self) -> datetime: ...
