"""Reading a consistent scheduling snapshot in one read transaction."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from sqlalchemy import exists, func, or_, select
from sqlalchemy.orm import Session, aliased, selectinload

from adapters.sql.admin_repo import SqlAdminRepository
from adapters.sql.convert import workload_from_row
from adapters.sql.tables import CohortRow, IdleFindingRow, PriorityClassRow, QueueRow, RunRow, TeamRow, WorkloadRow
from controlplane.core.decision import EndCause
from controlplane.core.gpu_eq import held_gpu_eq
from controlplane.core.history import UsageInterval
from controlplane.core.snapshot import LiveRun, Snapshot
from controlplane.domain.model import Node, NodePool, PodAssignment, QueueNode, Quota, Workload, WorkloadState

LIVE = ("admitted", "dispatching", "running")


def _tree_node(row: CohortRow | TeamRow | QueueRow, parent_id: str | None) -> QueueNode:
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


class SqlSnapshotReader:
    def __init__(self, session: Session) -> None:
        self.s = session

    def load(self, history_since: datetime | None = None, last_rebalance: bool = False) -> Snapshot:
        if self.s.get_bind().dialect.name == "postgresql":
            # Every query below must see the same committed state.
            self.s.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        clusters, nodes = SqlAdminRepository(self.s).fleet()
        tree: dict[str, QueueNode] = {}
        for cohort in self.s.scalars(select(CohortRow)):
            tree[cohort.id] = _tree_node(cohort, None)
        for team in self.s.scalars(select(TeamRow)):
            tree[team.id] = _tree_node(team, team.cohort_id)
        for queue in self.s.scalars(select(QueueRow)):
            tree[queue.id] = _tree_node(queue, queue.team_id)
        classes = {pc.name: pc for pc in self.s.scalars(select(PriorityClassRow))}
        pending = tuple(
            workload_from_row(row, classes[row.priority_class])
            for row in self.s.scalars(
                select(WorkloadRow)
                .where(WorkloadRow.state == WorkloadState.QUEUED)
                .order_by(WorkloadRow.created_seq)
                .options(selectinload(WorkloadRow.pod_sets))
            )
        )
        live = tuple(
            LiveRun(
                workload_id=run.workload_id,
                queue_id=queue_id,
                cluster_id=run.cluster_id,
                priority=priority,
                assignments=tuple(
                    PodAssignment(a.pod_set, a.pod_index, a.node_id, dict(a.demand)) for a in run.assignments
                ),
                run_id=run.id,
                preemptible=classes[pc_name].preemptible,
                started_at=run.started_at,
                admitted_at=run.created_at,
                min_runtime_seconds=classes[pc_name].min_runtime_seconds,
                max_runtime_seconds=max_runtime,
            )
            for run, queue_id, priority, pc_name, max_runtime in self.s.execute(
                select(
                    RunRow,
                    WorkloadRow.queue_id,
                    WorkloadRow.priority,
                    WorkloadRow.priority_class,
                    WorkloadRow.max_runtime_seconds,
                )
                .join(WorkloadRow, WorkloadRow.id == RunRow.workload_id)
                .where(RunRow.state.in_(LIVE))
                .options(selectinload(RunRow.assignments))
            )
        )
        live = self._with_idle_marks(live)
        pending = self._without_evictions_after_idle_reclaim(pending)
        pools = {pool.id: pool for cluster in clusters for pool in cluster.pools}
        history = () if history_since is None else self._history(history_since, nodes, pools)
        last_rebalance_at = None
        if last_rebalance:
            last_rebalance_at = self.s.scalar(
                select(func.max(RunRow.finished_at)).where(RunRow.end_cause == EndCause.REBALANCED.value)
            )
        return Snapshot(
            clusters=clusters,
            nodes=nodes,
            queue_tree=tree,
            pending=pending,
            live_runs=live,
            usage_history=history,
            last_rebalance_at=last_rebalance_at,
        )

    def _with_idle_marks(self, live: tuple[LiveRun, ...]) -> tuple[LiveRun, ...]:
        """The idle policy's stage per run: deprioritized runs are taken first as victims, runs at
        the reclaim stage may be taken by any waiting gang that fits."""
        stages = dict(
            self.s.execute(
                select(IdleFindingRow.run_id, IdleFindingRow.stage).where(IdleFindingRow.status == "idle")
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

    def _without_evictions_after_idle_reclaim(self, pending: tuple[Workload, ...]) -> tuple[Workload, ...]:
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
        pool_of_node = {node.id: pools[node.pool_id] for node in nodes if node.pool_id in pools}
        intervals = []
        rows = self.s.execute(
            select(RunRow, WorkloadRow.queue_id)
            .join(WorkloadRow, WorkloadRow.id == RunRow.workload_id)
            .where(or_(RunRow.finished_at.is_(None), RunRow.finished_at >= since))
            .options(selectinload(RunRow.assignments))
        )
        for run, queue_id in rows:
            start = run.started_at or run.created_at
            known = tuple(
                PodAssignment(a.pod_set, a.pod_index, a.node_id, dict(a.demand))
                for a in run.assignments
                if a.node_id in pool_of_node  # a node since removed from the fleet no longer counts
            )
            gpu_eq = held_gpu_eq(known, pool_of_node)
            if gpu_eq:
                intervals.append(UsageInterval(queue_id, float(gpu_eq), start, run.finished_at))
        return tuple(intervals)
