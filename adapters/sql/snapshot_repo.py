"""Reading a consistent scheduling snapshot in one read transaction."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from adapters.sql.admin_repo import SqlAdminRepository
from adapters.sql.convert import workload_from_row
from adapters.sql.tables import CohortRow, PriorityClassRow, QueueRow, RunRow, TeamRow, WorkloadRow
from controlplane.core.snapshot import LiveRun, Snapshot
from controlplane.domain.model import PodAssignment, QueueNode, Quota, WorkloadState

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

    def load(self) -> Snapshot:
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
        return Snapshot(clusters=clusters, nodes=nodes, queue_tree=tree, pending=pending, live_runs=live)
