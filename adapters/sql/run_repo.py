"""Runs as the dispatcher and the cluster-status handler see them."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import case, func, literal, select, update
from sqlalchemy.orm import Session

from adapters.sql.row_locks import lock_workloads
from adapters.sql.tables import (
    ClusterRow,
    NodePoolRow,
    NodeRow,
    QueueRow,
    RunAssignmentRow,
    RunRow,
    TeamRow,
    WorkloadRow,
)
from controlplane.core.decision import EndCause
from controlplane.service.ports import PodOrder, RunOrder, RunStatus, Teardown

LIVE = ("admitted", "dispatching", "running")
TERMINAL = ("succeeded", "failed", "cancelled", "preempted")


class SqlRunRepository:
    def __init__(self, session: Session) -> None:
        self.s = session

    def to_dispatch(self, limit: int, clusters: Collection[str] | None = None) -> list[RunOrder]:
        query = (
            select(RunRow, WorkloadRow, ClusterRow.name, QueueRow.name, TeamRow.name)
            .join(WorkloadRow, WorkloadRow.id == RunRow.workload_id)
            .join(ClusterRow, ClusterRow.id == RunRow.cluster_id)
            .join(QueueRow, QueueRow.id == WorkloadRow.queue_id)
            .join(TeamRow, TeamRow.id == WorkloadRow.team_id)
            .where(RunRow.dispatch_state == "pending", RunRow.state.in_(LIVE))
        )
        if clusters is not None:
            query = query.where(ClusterRow.name.in_(sorted(clusters)))
        rows = self.s.execute(query.order_by(RunRow.created_at, RunRow.id).limit(limit)).all()
        node_ids = {a.node_id for run, *_ in rows for a in run.assignments}
        nodes = (
            {
                nid: (name, pool)
                for nid, name, pool in self.s.execute(
                    select(NodeRow.id, NodeRow.name, NodePoolRow.name)
                    .join(NodePoolRow, NodePoolRow.id == NodeRow.pool_id)
                    .where(NodeRow.id.in_(node_ids))
                )
            }
            if node_ids
            else {}
        )
        return [
            RunOrder(
                run_id=run.id,
                workload_id=wl.id,
                workload_name=wl.name,
                team=team,
                queue=queue,
                cluster=cluster,
                epoch=run.epoch,
                attempt=run.attempt,
                priority_class=wl.priority_class,
                min_available=wl.min_available,
                pods=tuple(
                    PodOrder(a.pod_set, a.pod_index, nodes[a.node_id][0], nodes[a.node_id][1], dict(a.demand))
                    for a in run.assignments
                ),
                duration_seconds=wl.duration_seconds,
                container=dict(wl.container),
                max_runtime_seconds=wl.max_runtime_seconds,
                labels={str(k): str(v) for k, v in (wl.labels or {}).items()},
                priority=wl.priority,
                serving=wl.serving,
            )
            for run, wl, cluster, queue, team in rows
        ]

    def to_teardown(self, limit: int, clusters: Collection[str] | None = None) -> list[Teardown]:
        query = (
            select(RunRow.id, ClusterRow.name)
            .join(ClusterRow, ClusterRow.id == RunRow.cluster_id)
            .where(RunRow.dispatch_state == "teardown")
        )
        if clusters is not None:
            query = query.where(ClusterRow.name.in_(sorted(clusters)))
        rows = self.s.execute(query.order_by(RunRow.id).limit(limit))
        return [Teardown(run_id, cluster) for run_id, cluster in rows]

    def set_dispatch_state(self, run_id: str, from_state: str, to_state: str, now: datetime) -> bool:
        lock_workloads(self.s, of_runs=[run_id])
        values: dict[str, Any] = {"dispatch_state": to_state}
        if to_state == "applied":
            values["dispatched_at"] = now
        result = self.s.execute(
            update(RunRow)
            .where(RunRow.id == run_id, RunRow.dispatch_state == from_state)
            .values(**values)
            .execution_options(synchronize_session=False)
        )
        return bool(result.rowcount)  # type: ignore[attr-defined]

    def clusters_of(self, run_ids: Collection[str]) -> dict[str, str]:
        ids = sorted(run_ids)
        found: dict[str, str] = {}
        for start in range(0, len(ids), 500):  # stay far below SQLite's bound on parameters
            rows = self.s.execute(
                select(RunRow.id, ClusterRow.name)
                .join(ClusterRow, ClusterRow.id == RunRow.cluster_id)
                .where(RunRow.id.in_(ids[start : start + 500]))
            ).all()
            found.update((run_id, cluster) for run_id, cluster in rows)
        return found

    def status(self, run_id: str) -> RunStatus | None:
        row = self.s.execute(
            select(
                RunRow.id,
                RunRow.workload_id,
                QueueRow.name,
                RunRow.state,
                WorkloadRow.min_available,
                ClusterRow.name,
                RunRow.epoch,
                TeamRow.name,
                select(func.count())
                .select_from(RunAssignmentRow)
                .where(RunAssignmentRow.run_id == RunRow.id)
                .scalar_subquery(),
            )
            .join(WorkloadRow, WorkloadRow.id == RunRow.workload_id)
            .join(QueueRow, QueueRow.id == WorkloadRow.queue_id)
            .join(ClusterRow, ClusterRow.id == RunRow.cluster_id)
            .join(TeamRow, TeamRow.id == QueueRow.team_id)
            .where(RunRow.id == run_id)
        ).first()
        return RunStatus(*row) if row else None

    def set_state(
        self,
        run_id: str,
        from_states: Sequence[str],
        to_state: str,
        message: str,
        now: datetime,
        cause: EndCause | None = None,
    ) -> bool:
        if to_state in TERMINAL:
            return run_id in self.end_all([(run_id, message, cause or EndCause(to_state))], from_states, to_state, now)
        lock_workloads(self.s, of_runs=[run_id])
        values: dict[str, Any] = {"state": to_state, "message": message}
        if to_state == "running":
            values["started_at"] = now
        result = self.s.execute(
            update(RunRow)
            .where(RunRow.id == run_id, RunRow.state.in_(list(from_states)))
            .values(**values)
            .execution_options(synchronize_session=False)
        )
        return bool(result.rowcount)  # type: ignore[attr-defined]

    def end_all(
        self, ends: Sequence[tuple[str, str, EndCause]], from_states: Sequence[str], to_state: str, now: datetime
    ) -> set[str]:
        assert to_state in TERMINAL, to_state
        if not ends:
            return set()
        ids = [run_id for run_id, _, _ in ends]
        lock_workloads(self.s, of_runs=ids)
        values: dict[str, Any] = {
            "state": to_state,
            "message": case({run_id: message for run_id, message, _ in ends}, value=RunRow.id),
            "end_cause": case({run_id: str(cause) for run_id, _, cause in ends}, value=RunRow.id),
            "finished_at": now,
            # A finished run's objects are removed from its cluster by the dispatcher.
            "dispatch_state": "teardown",
        }
        if to_state == "succeeded":
            # Pods seen succeeded with no running report before (they ran between two looks):
            # the run did start, by `now` at the latest.
            values["started_at"] = func.coalesce(RunRow.started_at, literal(now, RunRow.started_at.type))
        moved = self.s.execute(
            update(RunRow)
            .where(RunRow.id.in_(ids), RunRow.state.in_(list(from_states)))
            .values(**values)
            .returning(RunRow.id)
            .execution_options(synchronize_session=False)
        )
        return set(moved.scalars())

    def live_run_ids(self, cluster: str) -> set[str]:
        return set(
            self.s.scalars(
                select(RunRow.id)
                .join(ClusterRow, ClusterRow.id == RunRow.cluster_id)
                .where(ClusterRow.name == cluster, RunRow.state.in_(LIVE))
            )
        )
