"""Lists of workloads as summaries (`WorkloadSummary`): pod sets and counts, never a pod or a run.

A list used to carry every run's per-pod assignments, so ten 5,000-pod gangs made a 2.8 MB page
(issue 21). Here a page is read with a few set queries: the workloads' columns (not `container`,
up to 64 KiB each, which no list shows), their pod sets, each one's run count and latest run, and
the node count of the current runs, counted in SQL."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Row, Select, and_, distinct, func, or_, select
from sqlalchemy.orm import Session

from adapters.sql.convert import pod_set_dict
from adapters.sql.queue_positions import positions_of
from adapters.sql.tables import (
    ClusterRow,
    PendingReasonRow,
    PodSetRow,
    QueueRow,
    RunAssignmentRow,
    RunRow,
    TeamRow,
    WorkloadRow,
)
from controlplane.domain.model import WorkloadState
from controlplane.service.ports import WORKLOAD_GROUPS, WORKLOAD_SORTS, WorkloadFilter
from controlplane.service.views import Listed, WorkloadSummary

W = WorkloadRow
# Groups a count returns at most: far above the queues, teams or priority classes anyone registers.
MAX_GROUPS = 1_000
_COLUMNS = (
    W.id,
    W.name,
    W.team_id,
    W.queue_id,
    W.priority_class,
    W.priority,
    W.kind,
    W.state,
    W.reason,
    # The scheduler's pending reason (rule in workload_views.view): joined only while queued.
    PendingReasonRow.reason.label("pending_reason"),
    PendingReasonRow.kind.label("pending_kind"),
    W.min_available,
    W.requires_isolation,
    W.duration_seconds,
    W.max_runtime_seconds,
    W.spot,
    W.same_pool,
    W.idempotency_key,
    W.labels,
    W.created_at,
    W.updated_at,
    W.finished_at,
    W.created_seq,
)


def _selected(query: Select[Any], flt: WorkloadFilter) -> Select[Any]:
    """`query` narrowed to the workloads `flt` selects (team, queue, states, name)."""
    if flt.team_id:
        query = query.where(W.team_id == flt.team_id)
    if flt.queue:
        query = query.where(W.queue_id.in_(select(QueueRow.id).where(QueueRow.name == flt.queue)))
    if flt.states:
        query = query.where(W.state.in_(flt.states))
    if flt.name:
        query = query.where(W.name == flt.name)
    return query


def _order(sort: str) -> list[Any]:
    """The ORDER BY of a list sorted by `sort` (`WORKLOAD_SORTS`); the newest first, then the id,
    break ties, so a page is the same on every read."""
    newest = [W.created_seq.desc(), W.id]
    if sort == "newest":
        return newest
    if sort == "oldest":
        return [W.created_seq, W.id]
    if sort == "priority":
        return [W.priority.desc(), *newest]
    if sort in ("name", "state"):
        return [getattr(W, sort), *newest]
    if sort == "queue":
        return [select(QueueRow.name).where(QueueRow.id == W.queue_id).scalar_subquery(), *newest]
    if sort == "team":
        return [select(TeamRow.name).where(TeamRow.id == W.team_id).scalar_subquery(), *newest]
    raise ValueError(f"unknown workload order {sort!r}; one of {', '.join(WORKLOAD_SORTS)}")


def list_summaries(s: Session, flt: WorkloadFilter) -> list[Listed]:
    """The workloads `flt` selects in `flt.sort`'s order (newest first by default, the id breaking
    ties), after `flt.after` if set (the default order only)."""
    query = _selected(
        select(*_COLUMNS).outerjoin(
            PendingReasonRow, and_(PendingReasonRow.workload_id == W.id, W.state == WorkloadState.QUEUED)
        ),
        flt,
    )
    if flt.after is not None:
        if flt.sort != "newest":
            raise ValueError("a list cursor follows the newest-first order only")
        seq, after_id = flt.after
        query = query.where(or_(W.created_seq < seq, and_(W.created_seq == seq, W.id > after_id)))
    query = query.order_by(*_order(flt.sort)).limit(flt.limit).offset(flt.offset)
    return _summaries(s, s.execute(query).all())


def count_by(s: Session, flt: WorkloadFilter, by: str) -> dict[str, int]:
    """How many workloads `flt` selects per state, queue, team or priority class: one GROUP BY."""
    if by not in WORKLOAD_GROUPS:
        raise ValueError(f"unknown workload grouping {by!r}; one of {', '.join(WORKLOAD_GROUPS)}")
    # Queues and teams are grouped by their id (indexed), then the few groups are named.
    column: Any = {"queue": W.queue_id, "team": W.team_id}.get(by) or getattr(W, by)
    grouped = _selected(select(column, func.count()).select_from(W), flt).group_by(column).limit(MAX_GROUPS)
    counts = {str(k): int(n) for k, n in s.execute(grouped).all()}
    if by not in ("queue", "team") or not counts:
        return counts
    table = QueueRow if by == "queue" else TeamRow
    names = dict(s.execute(select(table.id, table.name).where(table.id.in_(set(counts)))).all())
    return {str(names.get(k, k)): n for k, n in counts.items()}


def _summaries(s: Session, rows: Sequence[Row[Any]]) -> list[Listed]:
    if not rows:
        return []
    ids = [r.id for r in rows]
    queues = dict(
        s.execute(select(QueueRow.id, QueueRow.name).where(QueueRow.id.in_({r.queue_id for r in rows}))).all()
    )
    teams = dict(s.execute(select(TeamRow.id, TeamRow.name).where(TeamRow.id.in_({r.team_id for r in rows}))).all())
    pod_sets: dict[str, list[dict[str, Any]]] = {}
    for p in s.scalars(select(PodSetRow).where(PodSetRow.workload_id.in_(ids)).order_by(PodSetRow.ordinal)):
        pod_sets.setdefault(p.workload_id, []).append(pod_set_dict(p))
    # Each workload's run count and latest run (by attempt), without loading any run's pods.
    counted = (
        select(RunRow.workload_id, func.count().label("runs"), func.max(RunRow.attempt).label("last"))
        .where(RunRow.workload_id.in_(ids))
        .group_by(RunRow.workload_id)
        .subquery()
    )
    latest = {
        r.workload_id: r
        for r in s.execute(
            select(counted.c.workload_id, counted.c.runs, RunRow.id, RunRow.cluster_id).join(
                RunRow, and_(RunRow.workload_id == counted.c.workload_id, RunRow.attempt == counted.c.last)
            )
        )
    }
    clusters = (
        dict(
            s.execute(
                select(ClusterRow.id, ClusterRow.name).where(ClusterRow.id.in_({r.cluster_id for r in latest.values()}))
            ).all()
        )
        if latest
        else {}
    )
    # The current run: the latest one, unless the workload is queued again (then it has none).
    current = {r.id: latest[r.id].id for r in rows if r.id in latest and r.state != WorkloadState.QUEUED}
    node_counts = (
        dict(
            s.execute(
                select(RunAssignmentRow.run_id, func.count(distinct(RunAssignmentRow.node_id)))
                .where(RunAssignmentRow.run_id.in_(set(current.values())))
                .group_by(RunAssignmentRow.run_id)
            ).all()
        )
        if current
        else {}
    )
    # A position once the scheduler has decided the gang (it has a reason kind), as the view shows it.
    positions = positions_of(
        s, [(r.id, r.queue_id) for r in rows if r.state == WorkloadState.QUEUED and r.pending_kind]
    )
    listed = []
    for r in rows:
        run = latest.get(r.id)
        run_id = current.get(r.id)
        sets = pod_sets.get(r.id, [])
        summary = WorkloadSummary(
            id=r.id,
            name=r.name,
            team=teams.get(r.team_id, r.team_id),
            queue=queues.get(r.queue_id, r.queue_id),
            priority_class=r.priority_class,
            priority=r.priority,
            kind=r.kind,
            state=r.state,
            reason=r.pending_reason if r.pending_reason is not None else r.reason,
            queue_position=positions.get(r.id),
            min_available=r.min_available,
            pods=sum(int(p["replicas"]) for p in sets),
            pod_sets=sets,
            requires_isolation=r.requires_isolation,
            duration_seconds=r.duration_seconds,
            max_runtime_seconds=r.max_runtime_seconds,
            spot=r.spot,
            same_pool=r.same_pool,
            idempotency_key=r.idempotency_key,
            labels=dict(r.labels),
            created_at=r.created_at,
            updated_at=r.updated_at,
            finished_at=r.finished_at,
            cluster=clusters.get(run.cluster_id, run.cluster_id) if run is not None and run_id else None,
            node_count=node_counts.get(run_id, 0) if run_id else 0,
            attempts=run.runs if run is not None else 0,
        )
        listed.append(Listed((r.created_seq, r.id), summary))
    return listed
