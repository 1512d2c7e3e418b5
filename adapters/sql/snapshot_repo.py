"""Reading a consistent scheduling snapshot in one read transaction."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from adapters.sql.admin_repo import SqlAdminRepository
from adapters.sql.convert import workload_from_row
from adapters.sql.tables import CohortRow, QueueRow, RunRow, TeamRow, WorkloadRow
from controlplane.core.snapshot import LiveRun, Snapshot
from controlplane.domain.model import PodAssignment, QueueNode, Quota, WorkloadState

LIVE = ("admitted", "dispatching", "running")


class SqlSnapshotReader:
    def __init__(self, session: Session) -> None:
        self.s = session

    def load(self) -> Snapshot:
        if self.s.get_bind().dialect.name == "postgresql":
            # Every query below must see the same committed state.
            self.s.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        clusters, nodes = SqlAdminRepository(self.s).fleet()
        tree: dict[str, QueueNode] = {}
        for row in self.s.scalars(select(CohortRow)):
            tree[row.id] = QueueNode(row.id, row.name, None, Quota(row.guaranteed), Quota(row.limit), row.weight)
        for team in self.s.scalars(select(TeamRow)):
            tree[team.id] = QueueNode(
                team.id, team.name, team.cohort_id, Quota(team.guaranteed), Quota(team.limit), team.weight
            )
        for queue in self.s.scalars(select(QueueRow)):
            tree[queue.id] = QueueNode(
                queue.id, queue.name, queue.team_id, Quota(queue.guaranteed), Quota(queue.limit), queue.weight
            )
        pending = tuple(
            workload_from_row(row)
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
            )
            for run, queue_id, priority in self.s.execute(
                select(RunRow, WorkloadRow.queue_id, WorkloadRow.priority)
                .join(WorkloadRow, WorkloadRow.id == RunRow.workload_id)
                .where(RunRow.state.in_(LIVE))
                .options(selectinload(RunRow.assignments))
            )
        )
        return Snapshot(clusters=clusters, nodes=nodes, queue_tree=tree, pending=pending, live_runs=live)
