"""Idle findings, and the running runs the idle policy judges."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from sqlalchemy import delete, select
from sqlalchemy.orm import Session, selectinload

from adapters.sql.convert import pool_from_row
from adapters.sql.tables import (
    ClusterRow,
    IdleFindingRow,
    NodePoolRow,
    NodeRow,
    QueueRow,
    RunRow,
    TeamRow,
    WorkloadRow,
)
from controlplane.core.gpu_eq import held_gpu_eq
from controlplane.domain.model import PodAssignment
from controlplane.service.idle_records import IdleCandidate, IdleFinding


def _devices(demand: dict[str, int]) -> int:
    """GPU devices one pod holds as dcgm-exporter reports them: GPUs, MIG instances, or the one
    GPU a shared slot runs on."""
    count = int(demand.get("gpu", 0)) + sum(int(n) for key, n in demand.items() if key.startswith("mig:"))
    return count + (1 if demand.get("share") else 0)


class SqlIdleRepository:
    def __init__(self, session: Session) -> None:
        self.s = session

    def candidates(self, run_ids: Collection[str] | None = None) -> list[IdleCandidate]:
        # The workload's few columns, not the row: a row carries its container spec (up to 64 KiB).
        w = WorkloadRow
        query = (
            select(RunRow, w.id, w.name, w.priority_class, w.kind, TeamRow.name, QueueRow.name, ClusterRow.name)
            .join(w, w.id == RunRow.workload_id)
            .join(TeamRow, TeamRow.id == w.team_id)
            .join(QueueRow, QueueRow.id == w.queue_id)
            .join(ClusterRow, ClusterRow.id == RunRow.cluster_id)
            .where(RunRow.state == "running")
            .order_by(RunRow.id)
            .options(selectinload(RunRow.assignments))
        )
        if run_ids is not None:
            if not run_ids:
                return []
            query = query.where(RunRow.id.in_(list(run_ids)))
        rows = self.s.execute(query).all()
        node_ids = {a.node_id for run, *_ in rows for a in run.assignments}
        pool_of_node = (
            {
                node_id: pool_from_row(pool)
                for node_id, pool in self.s.execute(
                    select(NodeRow.id, NodePoolRow)
                    .join(NodePoolRow, NodePoolRow.id == NodeRow.pool_id)
                    .where(NodeRow.id.in_(node_ids))
                )
            }
            if node_ids
            else {}
        )
        out = []
        for run, workload_id, workload_name, priority_class, kind, team, queue, cluster in rows:
            devices = sum(_devices(dict(a.demand)) for a in run.assignments)
            held = tuple(
                PodAssignment(a.pod_set, a.pod_index, a.node_id, dict(a.demand))
                for a in run.assignments
                if a.node_id in pool_of_node
            )
            gpu_eq = held_gpu_eq(held, pool_of_node)
            out.append(
                IdleCandidate(
                    run_id=run.id,
                    workload_id=workload_id,
                    workload_name=workload_name,
                    team=team,
                    queue=queue,
                    priority_class=priority_class,
                    kind=kind,
                    cluster=cluster,
                    started_at=run.started_at,
                    gpu_devices=devices,
                    gpu_eq=gpu_eq,
                )
            )
        return out

    def findings(self) -> dict[str, IdleFinding]:
        return {row.run_id: _finding(row) for row in self.s.scalars(select(IdleFindingRow))}

    def finding(self, run_id: str) -> IdleFinding | None:
        row = self.s.get(IdleFindingRow, run_id)
        return None if row is None else _finding(row)

    def put_finding(self, finding: IdleFinding) -> None:
        row = self.s.get(IdleFindingRow, finding.run_id)
        values = {
            "workload_id": finding.workload_id,
            "cluster": finding.cluster,
            "status": finding.status,
            "stage": finding.stage,
            "idle_windows": finding.idle_windows,
            "reason": finding.reason,
            "evidence": [dict(e) for e in finding.evidence],
            "action": finding.action,
            "stage_since": finding.stage_since,
            "updated_at": finding.updated_at,
        }
        if row is None:
            self.s.add(IdleFindingRow(run_id=finding.run_id, **values))
        else:
            for key, value in values.items():
                setattr(row, key, value)
        self.s.flush()

    def drop_findings(self, run_ids: Sequence[str]) -> None:
        self.s.execute(delete(IdleFindingRow).where(IdleFindingRow.run_id.in_(list(run_ids))))


def _finding(row: IdleFindingRow) -> IdleFinding:
    return IdleFinding(
        run_id=row.run_id,
        workload_id=row.workload_id,
        cluster=row.cluster,
        status=row.status,
        stage=row.stage,
        idle_windows=row.idle_windows,
        reason=row.reason,
        evidence=tuple(row.evidence),
        action=row.action,
        stage_since=row.stage_since,
        updated_at=row.updated_at,
    )
