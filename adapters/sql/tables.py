"""SQLAlchemy 2.x models: the one source of truth for gpufleet's state."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC on every backend (SQLite stores no offset)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:  # noqa: ARG002
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# Integer primary keys that autoincrement on SQLite too (BIGINT is not a rowid alias there).
AutoId = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSON(), list[Any]: JSON()}


class QuotaColumns:
    guaranteed: Mapped[dict[str, Any]] = mapped_column(default=dict)
    limit: Mapped[dict[str, Any]] = mapped_column("limit_", default=dict)
    weight: Mapped[float] = mapped_column(Float, default=1.0)
    borrowing_limit: Mapped[dict[str, Any]] = mapped_column(default=dict)
    lending_limit: Mapped[dict[str, Any]] = mapped_column(default=dict)


class CohortRow(QuotaColumns, Base):
    __tablename__ = "cohorts"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(63), unique=True)
    created_at: Mapped[datetime]


class TeamRow(QuotaColumns, Base):
    __tablename__ = "teams"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(63), unique=True)
    cohort_id: Mapped[str | None] = mapped_column(ForeignKey("cohorts.id", ondelete="RESTRICT"))
    created_at: Mapped[datetime]


class QueueRow(QuotaColumns, Base):
    __tablename__ = "queues"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(63), unique=True)
    team_id: Mapped[str] = mapped_column(ForeignKey("teams.id", ondelete="RESTRICT"), index=True)
    created_at: Mapped[datetime]


class PriorityClassRow(Base):
    __tablename__ = "priority_classes"
    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    value: Mapped[int] = mapped_column(Integer)
    preemptible: Mapped[bool] = mapped_column(Boolean, default=True)
    min_runtime_seconds: Mapped[int] = mapped_column(Integer, default=0)
    is_default: Mapped[bool] = mapped_column(Boolean, default=False)


class ClusterRow(Base):
    __tablename__ = "clusters"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(63), unique=True)
    provider: Mapped[str] = mapped_column(String(20))
    region: Mapped[str] = mapped_column(String(63), default="")
    created_at: Mapped[datetime]
    # Cloud clusters (migration 0003): where the cluster lives and how to reach its scheduler stack.
    # Locators and settings only: credentials are built in memory, a user kubeconfig lives in a 0600
    # file of the state dir and `kubeconfig_ref` is its file name.
    account: Mapped[str] = mapped_column(String(255), default="")
    cloud_cluster: Mapped[str] = mapped_column(String(253), default="")
    resource_group: Mapped[str] = mapped_column(String(90), default="")
    cloud_cluster_id: Mapped[str] = mapped_column(String(255), default="")
    kube_settings: Mapped[dict[str, Any]] = mapped_column(default=dict)
    kubeconfig_ref: Mapped[str] = mapped_column(String(255), default="")
    sync_state: Mapped[str] = mapped_column(String(20), default="ready")  # pending | ready | error
    sync_error: Mapped[str] = mapped_column(Text, default="")
    synced_at: Mapped[datetime | None]
    pool_issues: Mapped[list[Any]] = mapped_column(default=list)
    pool_prices: Mapped[dict[str, Any]] = mapped_column(default=dict)
    pools: Mapped[list[NodePoolRow]] = relationship(
        back_populates="cluster", cascade="all, delete-orphan", order_by="NodePoolRow.name"
    )


class NodePoolRow(Base):
    __tablename__ = "node_pools"
    __table_args__ = (UniqueConstraint("cluster_id", "name"),)
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    cluster_id: Mapped[str] = mapped_column(ForeignKey("clusters.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(63))
    gpu_model: Mapped[str] = mapped_column(String(40))
    gpus_per_node: Mapped[int] = mapped_column(Integer)
    cpu_millis: Mapped[int] = mapped_column(Integer)
    memory_mib: Mapped[int] = mapped_column(Integer)
    sharing: Mapped[str] = mapped_column(String(80), default="exclusive")
    taints: Mapped[list[Any]] = mapped_column(default=list)
    labels: Mapped[dict[str, Any]] = mapped_column(default=dict)
    price_per_gpu_hour: Mapped[float] = mapped_column(Float, default=0.0)
    spot: Mapped[bool] = mapped_column(Boolean, default=False)
    node_count: Mapped[int] = mapped_column(Integer)
    # Cloud pools (migration 0003): bounds, shape and the autoscaler's bookkeeping.
    min_size: Mapped[int] = mapped_column(Integer, default=0)
    max_size: Mapped[int | None] = mapped_column(Integer)
    instance_type: Mapped[str] = mapped_column(String(80), default="")
    cloud_pool_id: Mapped[str] = mapped_column(String(255), default="")
    scale_target: Mapped[int | None] = mapped_column(Integer)
    scale_requested_at: Mapped[datetime | None]
    idle_since: Mapped[datetime | None]
    # Pools made from nodes (migration 0005): the resource each demand key is requested as, and the
    # most shares one container may ask for (0: no limit).
    resource_names: Mapped[dict[str, Any]] = mapped_column(default=dict)
    max_shares_per_pod: Mapped[int] = mapped_column(Integer, default=0)
    cluster: Mapped[ClusterRow] = relationship(back_populates="pools")
    nodes: Mapped[list[NodeRow]] = relationship(cascade="all, delete-orphan", order_by="NodeRow.name")


class NodeRow(Base):
    __tablename__ = "nodes"
    __table_args__ = (UniqueConstraint("cluster_id", "name"),)
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    cluster_id: Mapped[str] = mapped_column(ForeignKey("clusters.id", ondelete="CASCADE"))
    pool_id: Mapped[str] = mapped_column(ForeignKey("node_pools.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(253))
    schedulable: Mapped[bool] = mapped_column(Boolean, default=True)


class WorkloadRow(Base):
    __tablename__ = "workloads"
    __table_args__ = (
        UniqueConstraint("team_id", "idempotency_key"),
        Index("ix_workloads_state_queue", "state", "queue_id"),
        # A queued workload's position is read in its queue's order (adapters/sql/queue_positions.py).
        Index("ix_workloads_queue_order", "queue_id", "state", "priority", "created_seq"),
    )
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    team_id: Mapped[str] = mapped_column(ForeignKey("teams.id", ondelete="RESTRICT"), index=True)
    queue_id: Mapped[str] = mapped_column(ForeignKey("queues.id", ondelete="RESTRICT"))
    name: Mapped[str] = mapped_column(String(63))
    priority_class: Mapped[str] = mapped_column(ForeignKey("priority_classes.name", ondelete="RESTRICT"))
    priority: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(20))
    requires_isolation: Mapped[bool] = mapped_column(Boolean, default=False)
    min_available: Mapped[int] = mapped_column(Integer)
    tolerations: Mapped[list[Any]] = mapped_column(default=list)
    duration_seconds: Mapped[float | None] = mapped_column(Float)
    max_runtime_seconds: Mapped[float | None] = mapped_column(Float)
    spot: Mapped[str] = mapped_column(String(10), default="allow")
    same_pool: Mapped[str] = mapped_column(String(10), default="preferred")
    container: Mapped[dict[str, Any]] = mapped_column(default=dict)
    labels: Mapped[dict[str, Any]] = mapped_column(default=dict)
    idempotency_key: Mapped[str | None] = mapped_column(String(100))
    # SHA-256 of the submitted request: a retry must repeat it, a different one under the same key is refused.
    request_fingerprint: Mapped[str] = mapped_column(String(64), default="")
    state: Mapped[str] = mapped_column(String(20))
    # The text of its last transition: "waiting for the next cycle" at submit, a cancel or an
    # eviction reason, "admitted", a failure. The scheduler's pending reason of a queued gang lives
    # in `pending_reasons` (migration 0014) and is shown instead while the gang is queued.
    reason: Mapped[str] = mapped_column(Text, default="")
    # An inference workload's declared serving signal (controlplane.service.serving.ServingSpec), or
    # NULL (migration 0011). none_as_null: a bulk insert gives every row the key, None meaning none.
    serving: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    version: Mapped[int] = mapped_column(Integer, default=1)
    created_seq: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]
    pod_sets: Mapped[list[PodSetRow]] = relationship(
        cascade="all, delete-orphan", order_by="PodSetRow.ordinal", lazy="selectin"
    )


class PodSetRow(Base):
    __tablename__ = "pod_sets"
    workload_id: Mapped[str] = mapped_column(ForeignKey("workloads.id", ondelete="CASCADE"), primary_key=True)
    ordinal: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(63))
    replicas: Mapped[int] = mapped_column(Integer)
    gpus: Mapped[int] = mapped_column(Integer, default=0)
    mig_profile: Mapped[str | None] = mapped_column(String(20))
    gpu_fraction: Mapped[float | None] = mapped_column(Float)
    cpu_millis: Mapped[int] = mapped_column(Integer)
    memory_mib: Mapped[int] = mapped_column(Integer)
    gpu_models: Mapped[list[Any]] = mapped_column(default=list)
    # The fewest replicas the gang may start with; NULL: all of them (migration 0008).
    min_replicas: Mapped[int | None] = mapped_column(Integer)


class PendingReasonRow(Base):
    """The scheduler's pending reason of a queued gang it has decided on (migration 0014).

    A narrow table, not columns of `workloads`: a deep backlog's first cycle writes about 97,000
    reasons, and an UPDATE of the wide rows rewrites every one of the table's indexes. Readers show
    it only while the workload is `queued` (else `workloads.reason`, kind "", no detail); every
    change of a workload's state deletes it (adapters/sql/workload_repo.py), so a requeued gang
    shows its eviction text until the scheduler decides it again. Not watched by the change log:
    the scheduling snapshot reads no reasons."""

    __tablename__ = "pending_reasons"
    # No foreign key (migration 0015): the writer joins `workloads` to keep only queued gangs,
    # and a second look-up per row cost 0.43 s of a 97,522-reason write; readers start from
    # `workloads`, so a row whose workload is gone is never shown.
    workload_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    reason: Mapped[str] = mapped_column(Text)
    # controlplane.core.decision.PendingKind
    kind: Mapped[str] = mapped_column(String(30))
    # The reason's structured fields (the API's `reason_detail`).
    detail: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class RunRow(Base):
    __tablename__ = "runs"
    __table_args__ = (
        UniqueConstraint("workload_id", "attempt"),
        Index("ix_runs_state", "state"),
        Index("ix_runs_end_cause", "end_cause"),
    )
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    workload_id: Mapped[str] = mapped_column(ForeignKey("workloads.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    cluster_id: Mapped[str] = mapped_column(ForeignKey("clusters.id", ondelete="RESTRICT"))
    epoch: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[str] = mapped_column(String(20))
    # pending -> applied; teardown -> removed. Drives the dispatcher; never changed inside a call.
    dispatch_state: Mapped[str] = mapped_column(String(20), default="pending")
    message: Mapped[str] = mapped_column(Text, default="")
    # Why it ended (controlplane.core.decision.EndCause; "" while live), migration 0007.
    end_cause: Mapped[str] = mapped_column(String(20), default="")
    # Admitted on capacity reserved for this waiting workload, which may take it back (0016).
    lent_to: Mapped[str | None] = mapped_column(String(40), default=None)
    created_at: Mapped[datetime]
    dispatched_at: Mapped[datetime | None]
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    assignments: Mapped[list[RunAssignmentRow]] = relationship(
        cascade="all, delete-orphan", order_by="RunAssignmentRow.ordinal", lazy="selectin"
    )


class RunAssignmentRow(Base):
    __tablename__ = "run_assignments"
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    ordinal: Mapped[int] = mapped_column(Integer, primary_key=True)
    pod_set: Mapped[str] = mapped_column(String(63))
    pod_index: Mapped[int] = mapped_column(Integer)
    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.id", ondelete="RESTRICT"))
    demand: Mapped[dict[str, Any]] = mapped_column()


class OutboxRow(Base):
    __tablename__ = "outbox"
    seq: Mapped[int] = mapped_column(AutoId, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(40), unique=True)
    subject: Mapped[str] = mapped_column(String(255))
    payload: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime]
    published_at: Mapped[datetime | None] = mapped_column(index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    last_error: Mapped[str | None] = mapped_column(Text)


class InboxRow(Base):
    __tablename__ = "inbox"
    consumer: Mapped[str] = mapped_column(String(63), primary_key=True)
    msg_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    processed_at: Mapped[datetime]


class LeaderLeaseRow(Base):
    __tablename__ = "leader_leases"
    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    holder: Mapped[str] = mapped_column(String(200))
    epoch: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[datetime]


class ApiTokenRow(Base):
    __tablename__ = "api_tokens"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(63))
    role: Mapped[str] = mapped_column(String(10))
    team_id: Mapped[str | None] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime]
    revoked_at: Mapped[datetime | None]
    last_used_at: Mapped[datetime | None]


class UiSessionRow(Base):
    """A dashboard login (migration 0012): the SHA-256 of the cookie's secret, never the secret.
    Deleting its token (or the token's team) deletes it."""

    __tablename__ = "ui_sessions"
    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    token_id: Mapped[str] = mapped_column(ForeignKey("api_tokens.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime] = mapped_column(index=True)


class ClusterCredentialRow(Base):
    """A cluster agent's NATS credential (migration 0006): only its SHA-256 hash is kept."""

    __tablename__ = "cluster_credentials"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    cluster_id: Mapped[str] = mapped_column(ForeignKey("clusters.id", ondelete="CASCADE"), index=True)
    secret_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime]
    revoked_at: Mapped[datetime | None]


class AuditRow(Base):
    __tablename__ = "audit_log"
    id: Mapped[int] = mapped_column(AutoId, primary_key=True, autoincrement=True)
    at: Mapped[datetime]
    actor: Mapped[str] = mapped_column(String(100))
    action: Mapped[str] = mapped_column(String(63))
    object_type: Mapped[str] = mapped_column(String(40))
    object_id: Mapped[str] = mapped_column(String(100))
    detail: Mapped[dict[str, Any]] = mapped_column(default=dict)


class TelemetryWindowRow(Base):
    """Roll-up of DCGM samples for one GPU (or MIG instance) of one run over one window.

    Accumulators only (counts, sums, maxima, latest XID), so partial windows merge in any order.
    `run_id` is "" for GPUs no run was attributed to: a primary key cannot hold NULL, and there is
    deliberately no foreign key, so telemetry that arrives before or after its run row still lands.
    """

    __tablename__ = "telemetry_windows"
    __table_args__ = (Index("ix_telemetry_windows_window_start", "window_start"),)
    run_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    gpu_key: Mapped[str] = mapped_column(String(400), primary_key=True)
    window_start: Mapped[datetime] = mapped_column(primary_key=True)
    window_seconds: Mapped[int] = mapped_column(Integer)
    cluster: Mapped[str] = mapped_column(String(63))
    node: Mapped[str] = mapped_column(String(253))
    gpu_uuid: Mapped[str] = mapped_column(String(80))
    gpu_index: Mapped[int] = mapped_column(Integer)
    mig_profile: Mapped[str | None] = mapped_column(String(20))
    mig_instance: Mapped[int | None] = mapped_column(Integer)
    pod: Mapped[str | None] = mapped_column(String(253))
    namespace: Mapped[str | None] = mapped_column(String(63))
    samples: Mapped[int] = mapped_column(Integer)
    first_sample_at: Mapped[datetime]
    last_sample_at: Mapped[datetime]
    sm_active_n: Mapped[int] = mapped_column(Integer)
    sm_active_sum: Mapped[float] = mapped_column(Float)
    sm_active_max: Mapped[float] = mapped_column(Float)
    gr_engine_n: Mapped[int] = mapped_column(Integer)
    gr_engine_sum: Mapped[float] = mapped_column(Float)
    gr_engine_max: Mapped[float] = mapped_column(Float)
    gpu_util_n: Mapped[int] = mapped_column(Integer)
    gpu_util_sum: Mapped[float] = mapped_column(Float)
    gpu_util_max: Mapped[float] = mapped_column(Float)
    tensor_n: Mapped[int] = mapped_column(Integer)
    tensor_sum: Mapped[float] = mapped_column(Float)
    fb_used_n: Mapped[int] = mapped_column(Integer)
    fb_used_sum: Mapped[float] = mapped_column(Float)
    fb_free_n: Mapped[int] = mapped_column(Integer)
    fb_free_sum: Mapped[float] = mapped_column(Float)
    power_n: Mapped[int] = mapped_column(Integer)
    power_sum: Mapped[float] = mapped_column(Float)
    xid_last: Mapped[int | None] = mapped_column(Integer)
    xid_at: Mapped[datetime | None]
    xid_error_samples: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[datetime]


class IdleFindingRow(Base):
    """What the idle policy last concluded about one live run, with its evidence (anti-hoarding).

    One row per run while it runs; the scheduling snapshot reads the stage from here.
    """

    __tablename__ = "idle_findings"
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    workload_id: Mapped[str] = mapped_column(String(40), index=True)
    cluster: Mapped[str] = mapped_column(String(63))
    status: Mapped[str] = mapped_column(String(20))
    stage: Mapped[str] = mapped_column(String(20))
    idle_windows: Mapped[int] = mapped_column(Integer)
    reason: Mapped[str] = mapped_column(Text)
    evidence: Mapped[list[Any]] = mapped_column(default=list)
    action: Mapped[str] = mapped_column(String(20))
    stage_since: Mapped[datetime]
    updated_at: Mapped[datetime]


class NodePodSummaryRow(Base):
    """Per GPU node, the live pods gpufleet did not place that ask for no GPU and belong to no
    DaemonSet, as the last inventory report saw them (migration 0010; read by the audit). Its own
    table: writes to `nodes` are logged for the scheduler's snapshot, these change every report."""

    __tablename__ = "node_pod_summaries"
    cluster_id: Mapped[str] = mapped_column(ForeignKey("clusters.id", ondelete="CASCADE"), primary_key=True)
    node: Mapped[str] = mapped_column(String(253), primary_key=True)
    pods: Mapped[int] = mapped_column(Integer)
    sample: Mapped[list[Any]] = mapped_column(default=list)
    observed_at: Mapped[datetime]


class ServingReadingRow(Base):
    """The latest serving reading of one run (requests/s and mean latency of its declared metrics),
    as its cluster's agent reported it (migration 0011). One row per run, overwritten only by a newer
    reading; removed with the run."""

    __tablename__ = "serving_readings"
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    cluster: Mapped[str] = mapped_column(String(63))
    observed_at: Mapped[datetime]
    requests_per_second: Mapped[float | None] = mapped_column(Float)
    latency_ms: Mapped[float | None] = mapped_column(Float)
    updated_at: Mapped[datetime]


class SnapshotChangeRow(Base):
    """One write that changed what the scheduling snapshot reads (migration 0009). Written only by
    triggers, read by the scheduler's snapshot cache (adapters/sql/snapshot_changes.py).

    `entity` says which part of the snapshot to re-read (workload, run, fleet, tree, class) and
    `key` which object; `txid` is the writing transaction's id on PostgreSQL (NULL on SQLite)."""

    __tablename__ = "snapshot_changes"
    seq: Mapped[int] = mapped_column(AutoId, primary_key=True, autoincrement=True)
    entity: Mapped[str] = mapped_column(String(10))
    key: Mapped[str] = mapped_column(String(253))
    txid: Mapped[int | None] = mapped_column(BigInteger, index=True)
    at: Mapped[datetime]
