"""A queued workload's place in its queue, worked out where it is read.

The scheduler no longer stores positions: a position moves whenever a gang ahead is admitted, so
storing it rewrote every waiting gang's row on every cycle that admitted anything. It is the
queue's own order (`controlplane.core.parking.queue_order`): higher priority first, then FIFO by
submission sequence, ids compared bytewise to settle ties. Position 1 is the queue's head.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

from adapters.sql.tables import WorkloadRow
from controlplane.domain.model import WorkloadState

W = WorkloadRow


def _by_id(s: Session) -> Any:
    """The id column, compared bytewise on every backend (as the scheduler orders ids)."""
    return W.id.collate("C") if s.get_bind().dialect.name == "postgresql" else W.id


def position_of(s: Session, workload_id: str, queue_id: str, priority: int, created_seq: int) -> int:
    """The place of one queued workload in its queue (one count over the queue's index)."""
    by_id = _by_id(s)
    ahead = s.scalar(
        select(func.count())
        .select_from(W)
        .where(
            W.queue_id == queue_id,
            W.state == WorkloadState.QUEUED,
            or_(
                W.priority > priority,
                and_(
                    W.priority == priority,
                    or_(W.created_seq < created_seq, and_(W.created_seq == created_seq, by_id < workload_id)),
                ),
            ),
        )
    )
    return int(ahead or 0) + 1


def positions_of(s: Session, queued: Iterable[tuple[str, str]]) -> dict[str, int]:
    """The places of queued workloads, given as (id, queue id): one ranking of their queues."""
    wanted = dict(queued)
    if not wanted:
        return {}
    ranked = (
        select(
            W.id.label("id"),
            func.row_number()
            .over(partition_by=W.queue_id, order_by=(W.priority.desc(), W.created_seq, _by_id(s)))
            .label("position"),
        )
        .where(W.state == WorkloadState.QUEUED, W.queue_id.in_(set(wanted.values())))
        .subquery()
    )
    rows = s.execute(select(ranked.c.id, ranked.c.position).where(ranked.c.id.in_(list(wanted))))
    return {workload_id: int(position) for workload_id, position in rows}
