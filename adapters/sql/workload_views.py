"""Workloads as the API shows them (`WorkloadView`: runs, placements, idle findings) read from SQL.

Separate from `workload_repo`, which writes workloads and their runs; `SqlWorkloadRepository`
inherits these reads, so the port is unchanged."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from adapters.sql.convert import pod_set_dict
from adapters.sql.tables import (
    ClusterRow,
    IdleFindingRow,
    NodePoolRow,
    NodeRow,
    QueueRow,
    RunRow,
    ServingReadingRow,
    TeamRow,
    WorkloadRow,
)
from controlplane.domain.model import WorkloadState
from controlplane.service.ports import WorkloadFilter
from controlplane.service.views import AssignmentView, IdleView, RunView, ServingView, WorkloadView


class SqlWorkloadViews:
    """The read side of `SqlWorkloadRepository`: views of workloads and their runs."""

    s: Session

    def _views(self, rows: Sequence[WorkloadRow]) -> list[WorkloadView]:
        if not rows:
            return []
        ids = [r.id for r in rows]
        queues = dict(
            self.s.execute(select(QueueRow.id, QueueRow.name).where(QueueRow.id.in_({r.queue_id for r in rows}))).all()
        )
        teams = dict(
            self.s.execute(select(TeamRow.id, TeamRow.name).where(TeamRow.id.in_({r.team_id for r in rows}))).all()
        )
        runs = self.s.scalars(select(RunRow).where(RunRow.workload_id.in_(ids)).order_by(RunRow.attempt)).all()
        node_ids = {a.node_id for run in runs for a in run.assignments}
        nodes = (
            {
                n_id: (n_name, p_name)
                for n_id, n_name, p_name in self.s.execute(
                    select(NodeRow.id, NodeRow.name, NodePoolRow.name)
                    .join(NodePoolRow, NodePoolRow.id == NodeRow.pool_id)
                    .where(NodeRow.id.in_(node_ids))
                )
            }
            if node_ids
            else {}
        )
        clusters = (
            dict(
                self.s.execute(
                    select(ClusterRow.id, ClusterRow.name).where(ClusterRow.id.in_({r.cluster_id for r in runs}))
                ).all()
            )
            if runs
            else {}
        )
        live_ids = [run.id for run in runs if run.state in ("admitted", "dispatching", "running")]
        findings = (
            {
                f.run_id: IdleView(f.status, f.stage, f.idle_windows, f.reason, f.stage_since, f.updated_at)
                for f in self.s.scalars(select(IdleFindingRow).where(IdleFindingRow.run_id.in_(live_ids)))
            }
            if live_ids
            else {}
        )
        serving_workloads = {r.id for r in rows if r.kind == "inference"}
        inference = [run.id for run in runs if run.workload_id in serving_workloads]
        serving = (
            {
                r.run_id: ServingView(r.requests_per_second, r.latency_ms, r.observed_at)
                for r in self.s.scalars(select(ServingReadingRow).where(ServingReadingRow.run_id.in_(inference)))
            }
            if inference
            else {}
        )
        by_workload: dict[str, list[RunView]] = {}
        for run in runs:
            by_workload.setdefault(run.workload_id, []).append(
                RunView(
                    id=run.id,
                    attempt=run.attempt,
                    cluster=clusters.get(run.cluster_id, run.cluster_id),
                    epoch=run.epoch,
                    state=run.state,
                    message=run.message,
                    created_at=run.created_at,
                    dispatched_at=run.dispatched_at,
                    started_at=run.started_at,
                    finished_at=run.finished_at,
                    assignments=[
                        AssignmentView(a.pod_set, a.pod_index, *nodes.get(a.node_id, (a.node_id, "")))
                        for a in run.assignments
                    ],
                    idle=findings.get(run.id),
                    end_cause=run.end_cause,
                    serving=serving.get(run.id),
                )
            )
        views = []
        for row in rows:
            run_views = by_workload.get(row.id, [])
            current = run_views[-1] if run_views and row.state != WorkloadState.QUEUED else None
            views.append(
                WorkloadView(
                    id=row.id,
                    name=row.name,
                    team=teams.get(row.team_id, row.team_id),
                    queue=queues.get(row.queue_id, row.queue_id),
                    priority_class=row.priority_class,
                    priority=row.priority,
                    kind=row.kind,
                    state=row.state,
                    reason=row.reason,
                    queue_position=row.queue_position if row.state == WorkloadState.QUEUED else None,
                    min_available=row.min_available,
                    requires_isolation=row.requires_isolation,
                    pod_sets=[pod_set_dict(p) for p in row.pod_sets],
                    duration_seconds=row.duration_seconds,
                    max_runtime_seconds=row.max_runtime_seconds,
                    spot=row.spot,
                    same_pool=row.same_pool,
                    idempotency_key=row.idempotency_key,
                    labels=dict(row.labels),
                    created_at=row.created_at,
                    updated_at=row.updated_at,
                    finished_at=row.finished_at,
                    cluster=current.cluster if current else None,
                    nodes=sorted({a.node for a in current.assignments}) if current else [],
                    runs=run_views,
                    reason_detail=row.reason_detail if row.state == WorkloadState.QUEUED else None,
                    serving=row.serving,
                )
            )
        return views

    def view(self, workload_id: str) -> WorkloadView | None:
        row = self.s.get(WorkloadRow, workload_id, populate_existing=True)
        return self._views([row])[0] if row else None

    def list(self, flt: WorkloadFilter) -> list[WorkloadView]:
        query = select(WorkloadRow)
        if flt.team_id:
            query = query.where(WorkloadRow.team_id == flt.team_id)
        if flt.queue:
            query = query.join(QueueRow, QueueRow.id == WorkloadRow.queue_id).where(QueueRow.name == flt.queue)
        if flt.states:
            query = query.where(WorkloadRow.state.in_(flt.states))
        if flt.name:
            query = query.where(WorkloadRow.name == flt.name)
        query = query.order_by(WorkloadRow.created_seq.desc(), WorkloadRow.id).limit(flt.limit).offset(flt.offset)
        return self._views(self.s.scalars(query).all())
