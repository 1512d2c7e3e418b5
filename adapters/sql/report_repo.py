"""Rows for utilization reports: runs whose allocation overlaps a range, with their pods."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session, selectinload

from adapters.sql.tables import AuditRow, ClusterRow, NodePoolRow, NodeRow, QueueRow, RunRow, TeamRow, WorkloadRow
from controlplane.core.gpu_eq import gpu_eq_with_replicas
from controlplane.domain.sharing import InvalidSharingMode, SharingMode
from controlplane.service.report_records import RunRecord, RunSlice


def _slice(node: str, pool: NodePoolRow, demand: dict[str, Any]) -> RunSlice:
    """gpu-eq of one pod (as the core counts it, `controlplane.core.gpu_eq`), and the gpu-eq of each
    whole or shared GPU it reports telemetry for."""
    try:
        replicas = SharingMode.parse(pool.sharing).replicas
    except InvalidSharingMode:
        replicas = 1
    plain = gpu_eq_with_replicas({"gpu": int(demand.get("gpu", 0)), "share": int(demand.get("share", 0))}, replicas)
    migs = 0.0
    for key, count in demand.items():
        if key.startswith("mig:"):
            try:
                migs += gpu_eq_with_replicas({key: int(count)}, replicas)
            except InvalidSharingMode:
                continue  # a profile this version does not know holds no gpu-eq it can count
    devices = int(demand.get("gpu", 0)) + (1 if demand.get("share") else 0)
    share = plain / devices if devices else 1.0
    return RunSlice(
        node=node,
        gpu_model=pool.gpu_model,
        gpu_eq=plain + migs,
        device_share=share,
        price_per_gpu_hour=pool.price_per_gpu_hour,
    )


class SqlReportRepository:
    def __init__(self, session: Session) -> None:
        self.s = session

    def runs(self, start: datetime, end: datetime, team_id: str | None) -> list[RunRecord]:
        query = (
            select(RunRow, WorkloadRow.name, WorkloadRow.team_id, TeamRow.name, QueueRow.name, ClusterRow.name)
            .join(WorkloadRow, WorkloadRow.id == RunRow.workload_id)
            .join(TeamRow, TeamRow.id == WorkloadRow.team_id)
            .join(QueueRow, QueueRow.id == WorkloadRow.queue_id)
            .join(ClusterRow, ClusterRow.id == RunRow.cluster_id)
            .where(RunRow.created_at < end, or_(RunRow.finished_at.is_(None), RunRow.finished_at >= start))
            .order_by(RunRow.id)
            .options(selectinload(RunRow.assignments))
        )
        if team_id is not None:
            query = query.where(WorkloadRow.team_id == team_id)
        rows = self.s.execute(query).all()
        node_ids = {a.node_id for row in rows for a in row[0].assignments}
        nodes: dict[str, tuple[str, NodePoolRow]] = {}
        if node_ids:
            for node, pool in self.s.execute(
                select(NodeRow, NodePoolRow)
                .join(NodePoolRow, NodePoolRow.id == NodeRow.pool_id)
                .where(NodeRow.id.in_(node_ids))
            ):
                nodes[node.id] = (node.name, pool)
        out = []
        for run, workload, workload_team, team, queue, cluster in rows:
            slices = tuple(
                _slice(nodes[a.node_id][0], nodes[a.node_id][1], dict(a.demand))
                for a in run.assignments
                if a.node_id in nodes
            )
            out.append(
                RunRecord(
                    run_id=run.id,
                    workload_id=run.workload_id,
                    workload=workload,
                    team_id=workload_team,
                    team=team,
                    queue=queue,
                    cluster=cluster,
                    state=run.state,
                    message=run.message,
                    end_cause=run.end_cause,
                    admitted_at=run.created_at,
                    finished_at=run.finished_at,
                    slices=slices,
                )
            )
        return out

    def marked(self, action: str, object_id: str) -> bool:
        found = self.s.scalar(
            select(AuditRow.id).where(AuditRow.action == action, AuditRow.object_id == object_id).limit(1)
        )
        return found is not None
