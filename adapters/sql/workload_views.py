"""Workloads as the API shows them (`WorkloadView`: runs, placements, idle findings) read from SQL.

Separate from `workload_repo`, which writes workloads and their runs; `SqlWorkloadRepository`
inherits these reads, so the port is unchanged. Lists are summaries (`workload_list`). A view's
size does not grow with the gang: a run's pods are counted per pod set and pool in SQL (a run's
ORM `assignments` would load all of them), only the latest `MAX_RUNS_SHOWN` runs and the first
`MAX_NODES_SHOWN` nodes are shown, with counts of all."""

from __future__ import annotations

from sqlalchemy import distinct, func, select
from sqlalchemy.orm import Session

from adapters.sql.convert import pod_set_dict
from adapters.sql.queue_positions import position_of
from adapters.sql.tables import (
    ClusterRow,
    IdleFindingRow,
    NodePoolRow,
    NodeRow,
    PendingReasonRow,
    QueueRow,
    RunAssignmentRow,
    RunRow,
    ServingReadingRow,
    TeamRow,
    WorkloadRow,
)
from adapters.sql.workload_list import count_by, list_summaries
from controlplane.domain.limits import MAX_NODES_SHOWN, MAX_RUNS_SHOWN
from controlplane.domain.model import WorkloadState
from controlplane.service.ports import WorkloadFilter
from controlplane.service.views import IdleView, Listed, PlacementView, RunView, ServingView, WorkloadView

# A run's columns, not the ORM entity: loading a `RunRow` loads all its assignments (selectin).
_RUN_COLUMNS = (
    RunRow.id,
    RunRow.attempt,
    RunRow.cluster_id,
    RunRow.epoch,
    RunRow.state,
    RunRow.message,
    RunRow.created_at,
    RunRow.dispatched_at,
    RunRow.started_at,
    RunRow.finished_at,
    RunRow.end_cause,
    RunRow.lent_to,
)
_LIVE = ("admitted", "dispatching", "running")


class SqlWorkloadViews:
    """The read side of `SqlWorkloadRepository`: views of workloads and their runs."""

    s: Session

    def view(self, workload_id: str) -> WorkloadView | None:
        row = self.s.get(WorkloadRow, workload_id, populate_existing=True)
        if row is None:
            return None
        s = self.s
        queue = s.scalar(select(QueueRow.name).where(QueueRow.id == row.queue_id)) or row.queue_id
        team = s.scalar(select(TeamRow.name).where(TeamRow.id == row.team_id)) or row.team_id
        attempts = s.scalar(select(func.count()).select_from(RunRow).where(RunRow.workload_id == row.id)) or 0
        runs = s.execute(
            select(*_RUN_COLUMNS)
            .where(RunRow.workload_id == row.id)
            .order_by(RunRow.attempt.desc())
            .limit(MAX_RUNS_SHOWN)
        ).all()[::-1]
        run_ids = [r.id for r in runs]
        clusters = (
            dict(
                s.execute(
                    select(ClusterRow.id, ClusterRow.name).where(ClusterRow.id.in_({r.cluster_id for r in runs}))
                ).all()
            )
            if runs
            else {}
        )
        placements = self._placements(run_ids, [p.name for p in row.pod_sets])
        live_ids = [r.id for r in runs if r.state in _LIVE]
        findings = (
            {
                f.run_id: IdleView(f.status, f.stage, f.idle_windows, f.reason, f.stage_since, f.updated_at)
                for f in s.scalars(select(IdleFindingRow).where(IdleFindingRow.run_id.in_(live_ids)))
            }
            if live_ids
            else {}
        )
        serving = (
            {
                r.run_id: ServingView(r.requests_per_second, r.latency_ms, r.observed_at)
                for r in s.scalars(select(ServingReadingRow).where(ServingReadingRow.run_id.in_(run_ids)))
            }
            if row.kind == "inference" and run_ids
            else {}
        )
        run_views = [
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
                placement=placements.get(run.id, []),
                idle=findings.get(run.id),
                end_cause=run.end_cause,
                serving=serving.get(run.id),
                lent_to=run.lent_to,
            )
            for run in runs
        ]
        current = run_views[-1] if run_views and row.state != WorkloadState.QUEUED else None
        nodes, node_count = self._nodes(current.id) if current else ([], 0)
        # While queued, the scheduler's pending reason if it has decided the gang since it was
        # queued; else the text of the workload's last transition.
        pending = (
            s.execute(
                select(PendingReasonRow.reason, PendingReasonRow.kind, PendingReasonRow.detail).where(
                    PendingReasonRow.workload_id == row.id
                )
            ).first()
            if row.state == WorkloadState.QUEUED
            else None
        )
        return WorkloadView(
            id=row.id,
            name=row.name,
            team=team,
            queue=queue,
            priority_class=row.priority_class,
            priority=row.priority,
            kind=row.kind,
            state=row.state,
            reason=pending.reason if pending is not None else row.reason,
            queue_position=(
                position_of(s, row.id, row.queue_id, row.priority, row.created_seq)
                if pending is not None and pending.kind  # decided once: it waits in order
                else None
            ),
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
            nodes=nodes,
            runs=run_views,
            reason_detail=pending.detail if pending is not None else None,
            serving=row.serving,
            node_count=node_count,
            attempts=attempts,
        )

    def _placements(self, run_ids: list[str], pod_set_order: list[str]) -> dict[str, list[PlacementView]]:
        """Each run's pods counted per pod set and pool (in the workload's pod-set order)."""
        if not run_ids:
            return {}
        a = RunAssignmentRow
        counted = self.s.execute(
            select(a.run_id, a.pod_set, NodePoolRow.name, func.count(), func.count(distinct(a.node_id)))
            .join(NodeRow, NodeRow.id == a.node_id)
            .join(NodePoolRow, NodePoolRow.id == NodeRow.pool_id)
            .where(a.run_id.in_(run_ids))
            .group_by(a.run_id, a.pod_set, NodePoolRow.name)
        ).all()
        rank = {name: i for i, name in enumerate(pod_set_order)}
        by_run: dict[str, list[PlacementView]] = {}
        for run_id, pod_set, pool, pods, nodes in sorted(
            counted, key=lambda c: (rank.get(c[1], len(rank)), c[1], c[2])
        ):
            by_run.setdefault(run_id, []).append(PlacementView(pod_set, pool, pods, nodes))
        return by_run

    def _nodes(self, run_id: str) -> tuple[list[str], int]:
        """The first `MAX_NODES_SHOWN` node names of a run, in order, and how many nodes it has."""
        a = RunAssignmentRow
        names = self.s.scalars(
            select(NodeRow.name)
            .join(a, a.node_id == NodeRow.id)
            .where(a.run_id == run_id)
            .distinct()
            .order_by(NodeRow.name)
            .limit(MAX_NODES_SHOWN)
        ).all()
        count = self.s.scalar(select(func.count(distinct(a.node_id))).where(a.run_id == run_id)) or 0
        return list(names), count

    def list(self, flt: WorkloadFilter) -> list[Listed]:
        return list_summaries(self.s, flt)

    def counts(self, flt: WorkloadFilter, by: str) -> dict[str, int]:
        return count_by(self.s, flt, by)
