"""Rows for fleet reports: runs whose allocation overlaps a range (with their pods and prices), their
telemetry windows summed per bucket (`window_sums`), workloads submitted in a range, queues'
entitlement inputs, fleet capacity, eviction beneficiaries."""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from adapters.sql.run_pods import Pod, pods_by_run
from adapters.sql.tables import (
    AuditRow,
    ClusterRow,
    NodePoolRow,
    PodSetRow,
    QueueRow,
    RunRow,
    TeamRow,
    WorkloadRow,
)
from adapters.sql.window_sums import window_sums
from controlplane.core.gpu_eq import gpu_eq_with_replicas
from controlplane.domain.model import GPU_EQ
from controlplane.domain.sharing import InvalidSharingMode, mig_gpu_eq
from controlplane.service.report_records import (
    EVICTION_ACTION,
    IDLE_RECLAIM_ACTION,
    QueueRecord,
    RunRecord,
    RunSlice,
    WindowSum,
    WorkloadRecord,
)

CHUNK = 1000  # bounded IN lists


@functools.lru_cache(maxsize=4096)
def _pod_gpu_eq(replicas: int, demand: str) -> tuple[float, float]:
    """(gpu-eq, gpu-eq per device it reports telemetry for) of a pod asking `demand` (its stored
    JSON) on a pool of `replicas` shares per GPU. Memoized by the text: a report reads thousands of
    pods, and the pods of a gang (and most gangs) ask alike."""
    asks = json.loads(demand)
    plain = gpu_eq_with_replicas({"gpu": int(asks.get("gpu", 0)), "share": int(asks.get("share", 0))}, replicas)
    migs = 0.0
    for key, count in asks.items():
        if key.startswith("mig:"):
            try:
                migs += gpu_eq_with_replicas({key: int(count)}, replicas)
            except InvalidSharingMode:
                continue  # a profile this version does not know holds no gpu-eq it can count
    devices = int(asks.get("gpu", 0)) + (1 if asks.get("share") else 0)
    return plain + migs, plain / devices if devices else 1.0


def _slice(pod: Pod) -> RunSlice:
    """gpu-eq of one pod (as the core counts it, `controlplane.core.gpu_eq`), and the gpu-eq of each
    whole or shared GPU it reports telemetry for."""
    gpu_eq, share = _pod_gpu_eq(pod.pool.replicas, pod.demand)
    return RunSlice(
        node=pod.node,
        gpu_model=pod.pool.gpu_model,
        gpu_eq=gpu_eq,
        device_share=share,
        price_per_gpu_hour=pod.pool.price_per_gpu_hour,
        pool=pod.pool.name,
    )


def _pod_set_gpu_eq(pod_set: PodSetRow) -> float:
    """gpu-eq a pod set asks for (every replica): whole GPUs, a MIG slice's sevenths, or a fraction."""
    if pod_set.mig_profile:
        try:
            per_pod = float(mig_gpu_eq(pod_set.mig_profile))
        except InvalidSharingMode:
            per_pod = 0.0
    elif pod_set.gpu_fraction:
        per_pod = float(pod_set.gpu_fraction)
    else:
        per_pod = float(pod_set.gpus or 0)
    return pod_set.replicas * per_pod


def _gpu_amount(quota: dict[str, Any]) -> float:
    """The GPUs a quota names: its gpu-eq amount, or the sum of its per-model amounts if larger."""
    eq = float(quota.get(GPU_EQ, 0) or 0)
    models = sum(float(v or 0) for k, v in quota.items() if k != GPU_EQ)
    return max(eq, models)


class SqlReportRepository:
    def __init__(self, session: Session) -> None:
        self.s = session

    def first_allocation(self, start: datetime, end: datetime, team_id: str | None) -> datetime | None:
        query = select(func.min(RunRow.created_at)).where(
            RunRow.created_at < end, or_(RunRow.finished_at.is_(None), RunRow.finished_at >= start)
        )
        if team_id is not None:
            query = query.join(WorkloadRow, WorkloadRow.id == RunRow.workload_id).where(WorkloadRow.team_id == team_id)
        first = self.s.scalar(query)
        if isinstance(first, str):  # SQLite hands aggregates back as text, without the UTC conversion
            first = datetime.fromisoformat(first)
        if first is not None and first.tzinfo is None:
            first = first.replace(tzinfo=UTC)
        return first

    def runs(self, start: datetime, end: datetime, team_id: str | None) -> list[RunRecord]:
        overlapping = [RunRow.created_at < end, or_(RunRow.finished_at.is_(None), RunRow.finished_at >= start)]
        if team_id is not None:
            overlapping.append(WorkloadRow.team_id == team_id)
        query = (
            select(
                RunRow.id,
                RunRow.workload_id,
                RunRow.state,
                RunRow.message,
                RunRow.end_cause,
                RunRow.started_at,
                RunRow.created_at,
                RunRow.finished_at,
                WorkloadRow.name,
                WorkloadRow.team_id,
                TeamRow.name,
                QueueRow.name,
                ClusterRow.name,
            )
            .join(WorkloadRow, WorkloadRow.id == RunRow.workload_id)
            .join(TeamRow, TeamRow.id == WorkloadRow.team_id)
            .join(QueueRow, QueueRow.id == WorkloadRow.queue_id)
            .join(ClusterRow, ClusterRow.id == RunRow.cluster_id)
            .where(*overlapping)
            .order_by(RunRow.id)
        )
        rows = self.s.execute(query).all()
        ids = select(RunRow.id).join(WorkloadRow, WorkloadRow.id == RunRow.workload_id).where(*overlapping)
        pods = pods_by_run(self.s, ids) if rows else {}
        return [
            RunRecord(
                run_id=run_id,
                workload_id=workload_id,
                workload=workload,
                team_id=workload_team,
                team=team,
                queue=queue,
                cluster=cluster,
                state=state,
                message=message,
                end_cause=end_cause,
                started_at=started_at,
                admitted_at=admitted_at,
                finished_at=finished_at,
                slices=tuple(_slice(pod) for pod in pods.get(run_id, ())),
            )
            for (
                run_id,
                workload_id,
                state,
                message,
                end_cause,
                started_at,
                admitted_at,
                finished_at,
                workload,
                workload_team,
                team,
                queue,
                cluster,
            ) in rows
        ]

    def window_sums(
        self,
        spans: Sequence[tuple[datetime, datetime]],
        team_id: str | None,
        now: datetime,
        idle_threshold: float,
    ) -> list[WindowSum]:
        return window_sums(self.s, spans, team_id, now, idle_threshold)

    def workloads(self, start: datetime, end: datetime, team_id: str | None) -> list[WorkloadRecord]:
        first_run = (
            select(RunRow.workload_id, func.min(RunRow.created_at).label("first"))
            .group_by(RunRow.workload_id)
            .subquery()
        )
        query = (
            select(WorkloadRow, TeamRow.name, QueueRow.name, first_run.c.first)
            .join(TeamRow, TeamRow.id == WorkloadRow.team_id)
            .join(QueueRow, QueueRow.id == WorkloadRow.queue_id)
            .outerjoin(first_run, first_run.c.workload_id == WorkloadRow.id)
            .where(WorkloadRow.created_at >= start, WorkloadRow.created_at < end)
            .order_by(WorkloadRow.created_seq)
        )
        if team_id is not None:
            query = query.where(WorkloadRow.team_id == team_id)
        return [
            WorkloadRecord(
                workload_id=w.id,
                workload=w.name,
                team_id=w.team_id,
                team=team,
                queue=queue,
                state=w.state,
                submitted_at=w.created_at,
                first_admitted_at=first,
                finished_at=w.finished_at,
                gpu_eq=sum(_pod_set_gpu_eq(p) for p in w.pod_sets),
            )
            for w, team, queue, first in self.s.execute(query)
        ]

    def queues(self) -> list[QueueRecord]:
        rows = self.s.execute(select(QueueRow, TeamRow).join(TeamRow, TeamRow.id == QueueRow.team_id))
        return [
            QueueRecord(
                queue=q.name,
                team_id=t.id,
                team=t.name,
                guaranteed=_gpu_amount(dict(q.guaranteed or {})),
                team_guaranteed=_gpu_amount(dict(t.guaranteed or {})),
                weight=float(q.weight) if q.weight and q.weight > 0 else 1.0,
            )
            for q, t in rows
        ]

    def capacity_gpu_eq(self) -> float:
        total = self.s.scalar(select(func.sum(NodePoolRow.node_count * NodePoolRow.gpus_per_node)))
        return float(total or 0)

    def beneficiary_teams(self, run_ids: Sequence[str]) -> dict[str, str]:
        ids = list(run_ids)
        found: dict[str, str] = {}
        beneficiary_of: dict[str, str] = {}
        for start in range(0, len(ids), CHUNK):
            for object_id, detail in self.s.execute(
                select(AuditRow.object_id, AuditRow.detail).where(
                    AuditRow.action.in_((IDLE_RECLAIM_ACTION, EVICTION_ACTION)),
                    AuditRow.object_id.in_(ids[start : start + CHUNK]),
                )
            ):
                workload = (detail or {}).get("beneficiary")
                if isinstance(workload, str) and workload:
                    beneficiary_of[object_id] = workload
        workloads = sorted(set(beneficiary_of.values()))
        team_of: dict[str, str] = {}
        for start in range(0, len(workloads), CHUNK):
            for workload_id, team in self.s.execute(
                select(WorkloadRow.id, TeamRow.name)
                .join(TeamRow, TeamRow.id == WorkloadRow.team_id)
                .where(WorkloadRow.id.in_(workloads[start : start + CHUNK]))
            ):
                team_of[workload_id] = team
        for run_id, workload in beneficiary_of.items():
            if workload in team_of:
                found[run_id] = team_of[workload]
        return found

    def marked(self, action: str, object_id: str) -> bool:
        found = self.s.scalar(
            select(AuditRow.id).where(AuditRow.action == action, AuditRow.object_id == object_id).limit(1)
        )
        return found is not None
