"""The pods of many runs in two plain queries: where each runs (node name, pool) and what it holds.

The reports and the audit read thousands of runs per page; loading their assignment rows as ORM
objects, and every node's pool row with its JSON columns, cost more than the figures. These are
column reads: one query for the pods of the runs a select names, one for the fleet's pools (a
fleet has tens of pools, not thousands). Demands stay JSON text: the pods of a gang ask alike, so
the reports parse each distinct text once (`report_repo._pod_gpu_eq`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from sqlalchemy import Select, Text, cast, select
from sqlalchemy.orm import Session

from adapters.sql.tables import NodePoolRow, NodeRow, RunAssignmentRow
from controlplane.domain.sharing import InvalidSharingMode, SharingMode


class PoolFacts(NamedTuple):
    """What a report reads of a pod's pool."""

    name: str
    gpu_model: str
    replicas: int  # shares per GPU (1: whole GPUs or MIG)
    price_per_gpu_hour: float


class Pod(NamedTuple):
    node: str
    pool: PoolFacts
    demand: str  # the stored JSON text: the pods of a gang ask alike, so callers parse each text once


def _replicas(sharing: str) -> int:
    try:
        return SharingMode.parse(sharing).replicas
    except InvalidSharingMode:
        return 1  # stored pools were validated; an unknown mode counts as whole GPUs


def pools(s: Session) -> dict[str, PoolFacts]:
    rows = s.execute(
        select(
            NodePoolRow.id,
            NodePoolRow.name,
            NodePoolRow.gpu_model,
            NodePoolRow.sharing,
            NodePoolRow.price_per_gpu_hour,
        )
    )
    return {
        pool_id: PoolFacts(name, model, _replicas(sharing), float(price or 0.0))
        for pool_id, name, model, sharing, price in rows
    }


def pods_by_run(s: Session, run_ids: Select[Any]) -> dict[str, list[Pod]]:
    """Run id -> its pods in ordinal order, for the runs `run_ids` selects."""
    by_pool = pools(s)
    rows = s.execute(
        select(RunAssignmentRow.run_id, NodeRow.name, NodeRow.pool_id, cast(RunAssignmentRow.demand, Text))
        .join(NodeRow, NodeRow.id == RunAssignmentRow.node_id)
        .where(RunAssignmentRow.run_id.in_(run_ids.scalar_subquery()))
        .order_by(RunAssignmentRow.run_id, RunAssignmentRow.ordinal)
    )
    out: dict[str, list[Pod]] = {}
    for run_id, node, pool_id, demand in rows:
        pool = by_pool.get(pool_id)
        if pool is not None:
            out.setdefault(run_id, []).append(Pod(node, pool, demand))
    return out
