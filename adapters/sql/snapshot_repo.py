"""Reading a consistent scheduling snapshot in one read transaction."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy import Row, Text, and_, cast, exists, func, or_, select
from sqlalchemy.orm import Session, aliased

from adapters.sql.convert import pool_from_row
from adapters.sql.tables import (
    ClusterRow,
    CohortRow,
    IdleFindingRow,
    NodePoolRow,
    NodeRow,
    PendingReasonRow,
    PodSetRow,
    PriorityClassRow,
    QueueRow,
    RunAssignmentRow,
    RunRow,
    TeamRow,
    WorkloadRow,
)
from controlplane.core.decision import EndCause
from controlplane.core.gpu_eq import held_gpu_eq
from controlplane.core.history import UsageInterval
from controlplane.core.snapshot import LiveRun, Snapshot
from controlplane.domain.model import (
    Cluster,
    Node,
    NodePool,
    PodAssignment,
    PodSet,
    QueueNode,
    Quota,
    Toleration,
    Workload,
    WorkloadKind,
    WorkloadState,
)

_KINDS = {kind.value: kind for kind in WorkloadKind}  # a dict look-up, not an enum call, per row

LIVE = ("admitted", "dispatching", "running")


def _tree_node(row: Row[Any], parent_id: str | None) -> QueueNode:
    return QueueNode(
        id=row.id,
        name=row.name,
        parent_id=parent_id,
        guaranteed=Quota(row.guaranteed),
        limit=Quota(row.limit),
        weight=row.weight,
        borrowing_limit=Quota(row.borrowing_limit),
        lending_limit=Quota(row.lending_limit),
    )


def _columns(row: type[Any], *names: str, as_text: frozenset[str] = frozenset()) -> list[Any]:
    """Core columns of a table labelled by their attribute names (rows then read like ORM rows,
    without an identity map or instrumented instances: the snapshot only reads); those named in
    `as_text` are JSON columns read as their text, for the caller to parse once per distinct text."""
    table = row.__table__
    columns = []
    for name in names:
        column = getattr(row, name).expression if name in _RENAMED else table.c[name]
        columns.append(cast(column, Text).label(name) if name in as_text else column.label(name))
    return columns


_RENAMED = frozenset({"limit"})  # attributes whose column has another name ("limit_")
_TREE_COLUMNS = ("id", "name", "guaranteed", "limit", "weight", "borrowing_limit", "lending_limit")
_POOL_COLUMNS = (
    "id",
    "cluster_id",
    "name",
    "gpu_model",
    "gpus_per_node",
    "cpu_millis",
    "memory_mib",
    "sharing",
    "taints",
    "labels",
    "price_per_gpu_hour",
    "spot",
    "node_count",
    "resource_names",
    "max_shares_per_pod",
)
# The workload id, then what `_Interned.pod_set` unpacks, in its order.
_POD_SET_COLUMNS = (
    "workload_id",
    "name",
    "replicas",
    "gpus",
    "mig_profile",
    "gpu_fraction",
    "cpu_millis",
    "memory_mib",
    "gpu_models",
    "min_replicas",
)
# What a pending Workload is built from, in the order `_pending` unpacks them.
_WORKLOAD_COLUMNS = (
    "id",
    "team_id",
    "queue_id",
    "name",
    "priority_class",
    "priority",
    "kind",
    "min_available",
    "requires_isolation",
    "tolerations",
    "duration_seconds",
    "created_seq",
    "max_runtime_seconds",
    "spot",
    "same_pool",
)


class _Interned:
    """One immutable value per distinct content: a deep backlog repeats a few pod-set shapes and
    toleration lists thousands of times, so each is parsed and built once per read (the JSON
    columns are read as their text, the key)."""

    def __init__(self) -> None:
        self.pod_sets: dict[tuple[Any, ...], PodSet] = {}
        self.tolerations: dict[str | None, tuple[Toleration, ...]] = {}

    def pod_set(self, shape: tuple[Any, ...]) -> PodSet:
        """The pod set of a row's columns after its workload id, in `_POD_SET_COLUMNS` order."""
        found = self.pod_sets.get(shape)
        if found is None:
            name, replicas, gpus, mig_profile, gpu_fraction, cpu_millis, memory_mib, gpu_models, min_replicas = shape
            found = self.pod_sets[shape] = PodSet(
                name=name,
                replicas=replicas,
                gpus=gpus,
                mig_profile=mig_profile,
                gpu_fraction=gpu_fraction,
                cpu_millis=cpu_millis,
                memory_mib=memory_mib,
                gpu_models=tuple(json.loads(gpu_models)) if gpu_models else (),
                min_replicas=min_replicas,
            )
        return found

    def toleration_list(self, text: str | None) -> tuple[Toleration, ...]:
        found = self.tolerations.get(text)
        if found is None:
            found = self.tolerations[text] = tuple(Toleration(**t) for t in json.loads(text)) if text else ()
        return found


class SqlSnapshotReader:
    def __init__(self, session: Session) -> None:
        self.s = session

    def load(self, history_since: datetime | None = None, last_rebalance: bool = False) -> Snapshot:
        self._repeatable_read()
        clusters, nodes = self._fleet()
        tree = self._queue_tree()
        classes = self._classes()
        pending = self._pending(classes)
        live = self._live(classes)
        live = self._with_idle_marks(live)
        pending = self._without_evictions_after_idle_reclaim(pending)
        pools = {pool.id: pool for cluster in clusters for pool in cluster.pools}
        history = () if history_since is None else self._history(history_since, nodes, pools)
        return Snapshot(
            clusters=clusters,
            nodes=nodes,
            queue_tree=tree,
            pending=pending,
            live_runs=live,
            usage_history=history,
            last_rebalance_at=self._last_rebalance_at() if last_rebalance else None,
        )

    def stored_reasons(self) -> dict[str, tuple[str, str]]:
        """The pending reason and kind stored for each queued workload the scheduler has decided
        since it was queued (plain tuples). The others are left out: whatever it decides for them
        differs from their own reason (kind ""), so a fresh backlog's leader reads nothing here."""
        return {
            workload_id: (reason, kind)
            for workload_id, reason, kind in self.s.connection()
            .execute(
                select(PendingReasonRow.workload_id, PendingReasonRow.reason, PendingReasonRow.kind)
                .join(WorkloadRow, WorkloadRow.id == PendingReasonRow.workload_id)
                .where(WorkloadRow.state == WorkloadState.QUEUED)
            )
            .all()
        }

    def _repeatable_read(self) -> None:
        if self.s.get_bind().dialect.name == "postgresql":
            # Every query of the read must see the same committed state. (SQLite: every transaction
            # begins IMMEDIATE, so no write can land in between either.)
            self.s.connection(execution_options={"isolation_level": "REPEATABLE READ"})

    def _queue_tree(self) -> dict[str, QueueNode]:
        tree: dict[str, QueueNode] = {}
        for level, parent in ((CohortRow, None), (TeamRow, "cohort_id"), (QueueRow, "team_id")):
            names = _TREE_COLUMNS + ((parent,) if parent else ())
            for row in self.s.execute(select(*_columns(level, *names))):
                tree[row.id] = _tree_node(row, getattr(row, parent) if parent else None)
        return tree

    def _classes(self) -> dict[str, Row[Any]]:
        return {
            pc.name: pc
            for pc in self.s.execute(select(*_columns(PriorityClassRow, "name", "preemptible", "min_runtime_seconds")))
        }

    def _last_rebalance_at(self) -> datetime | None:
        return self.s.scalar(select(func.max(RunRow.finished_at)).where(RunRow.end_cause == EndCause.REBALANCED.value))

    def _fleet(self) -> tuple[tuple[Cluster, ...], tuple[Node, ...]]:
        """The same fleet `SqlAdminRepository.fleet` reads, in the same order, as plain rows."""
        pools: dict[str, list[NodePool]] = {}
        for row in self.s.execute(select(*_columns(NodePoolRow, *_POOL_COLUMNS)).order_by(NodePoolRow.name)):
            pools.setdefault(row.cluster_id, []).append(pool_from_row(row))
        clusters = tuple(
            Cluster(c.id, c.name, c.provider, c.region, tuple(pools.get(c.id, ())))
            for c in self.s.execute(
                select(ClusterRow.id, ClusterRow.name, ClusterRow.provider, ClusterRow.region).order_by(ClusterRow.name)
            )
        )
        nodes = tuple(
            Node(*row)
            for row in self.s.execute(
                select(NodeRow.id, NodeRow.cluster_id, NodeRow.pool_id, NodeRow.name, NodeRow.schedulable).order_by(
                    NodeRow.name
                )
            )
        )
        return clusters, nodes

    def pending_order(self) -> tuple[Any, ...]:
        """Submission order; the id breaks ties (`created_seq` is a microsecond timestamp, so a burst
        of submits can share one), compared bytewise on every backend so the snapshot cache can keep
        the same order in Python."""
        by_id = WorkloadRow.id.collate("C") if self.s.get_bind().dialect.name == "postgresql" else WorkloadRow.id
        return (WorkloadRow.created_seq, by_id)

    def _pending(self, classes: Mapping[str, Row[Any]], *where: Any) -> tuple[Workload, ...]:
        """Queued workloads (of those `where` selects) in submission order; their pod sets in one
        query, grouped here. Executed on the connection (plain Core rows, no ORM result layer per
        row) and fetched at once: iterating a Core result fetches one row per driver call. Rows are
        unpacked by position: a Row's attribute look-up by name costs about 1 µs, 2 s per read of
        100,000 gangs when each of their 16 columns is read by name."""
        connection = self.s.connection()
        interned = _Interned()
        pod_sets: dict[str, list[PodSet]] = {}
        for row in connection.execute(
            select(*_columns(PodSetRow, *_POD_SET_COLUMNS, as_text=frozenset({"gpu_models"})))
            .join(WorkloadRow, WorkloadRow.id == PodSetRow.workload_id)
            .where(WorkloadRow.state == WorkloadState.QUEUED, *where)
            .order_by(PodSetRow.ordinal)  # grouped per workload here: no sort on the text id
        ).all():
            workload_id, *shape = row
            found = pod_sets.get(workload_id)
            if found is None:
                found = pod_sets[workload_id] = []
            found.append(interned.pod_set(tuple(shape)))
        kinds, no_pod_sets = _KINDS, ()
        return tuple(
            Workload(
                id=workload_id,
                team_id=team_id,
                queue_id=queue_id,
                name=name,
                priority_class=class_name,
                priority=priority,
                kind=kinds.get(kind) or WorkloadKind(kind),
                pod_sets=tuple(pod_sets.get(workload_id, no_pod_sets)),
                min_available=min_available,
                requires_isolation=requires_isolation,
                tolerations=interned.toleration_list(tolerations),
                duration_seconds=duration_seconds,
                created_seq=created_seq,
                preemptible=classes[class_name].preemptible,
                min_runtime_seconds=classes[class_name].min_runtime_seconds,
                max_runtime_seconds=max_runtime_seconds,
                spot=spot,
                same_pool=same_pool,
            )
            for (
                workload_id,
                team_id,
                queue_id,
                name,
                class_name,
                priority,
                kind,
                min_available,
                requires_isolation,
                tolerations,
                duration_seconds,
                created_seq,
                max_runtime_seconds,
                spot,
                same_pool,
            ) in connection.execute(
                select(*_columns(WorkloadRow, *_WORKLOAD_COLUMNS, as_text=frozenset({"tolerations"})))
                .where(WorkloadRow.state == WorkloadState.QUEUED, *where)
                .order_by(*self.pending_order())
            ).all()
        )

    def _assignments(self, *where: Any) -> dict[str, list[PodAssignment]]:
        """The assignments of the runs `where` selects, per run, in their order: one query. A
        fleet's demands repeat a few shapes, so each distinct JSON text is parsed once and its
        mapping shared (PodAssignment.demand is read-only)."""
        demands: dict[str, dict[str, int]] = {}
        by_run: dict[str, list[PodAssignment]] = {}
        for run_id, pod_set, pod_index, node_id, text in (
            self.s.connection()
            .execute(
                select(
                    RunAssignmentRow.run_id,
                    RunAssignmentRow.pod_set,
                    RunAssignmentRow.pod_index,
                    RunAssignmentRow.node_id,
                    cast(RunAssignmentRow.demand, Text),
                )
                .join(RunRow, RunRow.id == RunAssignmentRow.run_id)
                .where(*where)
                .order_by(RunAssignmentRow.ordinal)  # grouped per run here: no sort on the text id
            )
            .all()
        ):
            demand = demands.get(text)
            if demand is None:
                demand = demands[text] = json.loads(text)
            by_run.setdefault(run_id, []).append(PodAssignment(pod_set, pod_index, node_id, demand))
        return by_run

    def _live(self, classes: Mapping[str, Row[Any]], *where: Any) -> tuple[LiveRun, ...]:
        assignments = self._assignments(RunRow.state.in_(LIVE), *where)
        return tuple(
            LiveRun(
                workload_id=workload_id,
                queue_id=queue_id,
                cluster_id=cluster_id,
                priority=priority,
                assignments=tuple(assignments.get(run_id, ())),
                run_id=run_id,
                preemptible=classes[pc_name].preemptible,
                started_at=started_at,
                admitted_at=created_at,
                min_runtime_seconds=classes[pc_name].min_runtime_seconds,
                max_runtime_seconds=max_runtime,
                lent_to=lent_to,
            )
            for (
                run_id,
                workload_id,
                cluster_id,
                started_at,
                created_at,
                lent_to,
                queue_id,
                priority,
                pc_name,
                max_runtime,
            ) in (
                self.s.execute(
                    select(
                        RunRow.id,
                        RunRow.workload_id,
                        RunRow.cluster_id,
                        RunRow.started_at,
                        RunRow.created_at,
                        RunRow.lent_to,
                        WorkloadRow.queue_id,
                        WorkloadRow.priority,
                        WorkloadRow.priority_class,
                        WorkloadRow.max_runtime_seconds,
                    )
                    .join(WorkloadRow, WorkloadRow.id == RunRow.workload_id)
                    .where(RunRow.state.in_(LIVE), *where)
                )
            )
        )

    def _with_idle_marks(self, live: tuple[LiveRun, ...], *where: Any) -> tuple[LiveRun, ...]:
        """The idle policy's stage per run: deprioritized runs are taken first as victims, runs at
        the reclaim stage may be taken by any waiting gang that fits."""
        stages = dict(
            self.s.execute(
                select(IdleFindingRow.run_id, IdleFindingRow.stage).where(IdleFindingRow.status == "idle", *where)
            ).all()
        )
        if not stages:
            return live
        return tuple(
            replace(
                run,
                idle=stages.get(run.run_id) in ("deprioritize", "reclaim"),
                idle_reclaimable=stages.get(run.run_id) == "reclaim",
            )
            if run.run_id in stages
            else run
            for run in live
        )

    def _without_evictions_after_idle_reclaim(self, pending: tuple[Workload, ...], *where: Any) -> tuple[Workload, ...]:
        """A workload whose last run was reclaimed for idleness waits for free capacity: it may not
        evict anyone to get its GPUs straight back."""
        # Read on every cycle, so only the few runs ended by an idle reclaim, not every run of the backlog.
        newer = aliased(RunRow)
        held_back = set(
            self.s.scalars(
                select(RunRow.workload_id)
                .join(WorkloadRow, WorkloadRow.id == RunRow.workload_id)
                .where(
                    WorkloadRow.state == WorkloadState.QUEUED,
                    RunRow.end_cause == EndCause.RECLAIMED_IDLE.value,
                    ~exists().where(newer.workload_id == RunRow.workload_id, newer.created_at > RunRow.created_at),
                    *where,
                )
            )
        )
        if not held_back:
            return pending
        return tuple(replace(w, may_evict=False) if w.id in held_back else w for w in pending)

    def _history(
        self, since: datetime, nodes: tuple[Node, ...], pools: dict[str, NodePool]
    ) -> tuple[UsageInterval, ...]:
        """What every run that held capacity since `since` consumed, per queue (for fair share)."""
        return tuple(interval for interval in self._usage_of_runs(since, nodes, pools).values() if interval)

    def _usage_of_runs(
        self, since: datetime, nodes: tuple[Node, ...], pools: Mapping[str, NodePool], *where: Any
    ) -> dict[str, UsageInterval | None]:
        """Per run (of those `where` selects) that held capacity since `since`: what it consumed,
        or None when it held no GPUs on a node of the fleet."""
        pool_of_node = {node.id: pools[node.pool_id] for node in nodes if node.pool_id in pools}
        intervals: dict[str, UsageInterval | None] = {}
        held = and_(or_(RunRow.finished_at.is_(None), RunRow.finished_at >= since), *where)
        assignments = self._assignments(held)
        rows = self.s.execute(
            select(RunRow.id, RunRow.started_at, RunRow.created_at, RunRow.finished_at, WorkloadRow.queue_id)
            .join(WorkloadRow, WorkloadRow.id == RunRow.workload_id)
            .where(held)
        )
        for run_id, started_at, created_at, finished_at, queue_id in rows:
            start = started_at or created_at
            known = tuple(
                a
                for a in assignments.get(run_id, ())
                if a.node_id in pool_of_node  # a node since removed from the fleet no longer counts
            )
            gpu_eq = held_gpu_eq(known, pool_of_node)
            intervals[run_id] = UsageInterval(queue_id, float(gpu_eq), start, finished_at) if gpu_eq else None
        return intervals
