"""Fleet, queue tree and priority classes in SQL."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from fractions import Fraction
from typing import Any

from sqlalchemy import String, cast, delete, exists, func, literal, or_, select, update
from sqlalchemy.orm import Session, selectinload

from adapters.sql.convert import cluster_from_row, node_from_row, node_to_row, pool_from_row, pool_to_row
from adapters.sql.slo_gauges import demand_of
from adapters.sql.tables import (
    ApiTokenRow,
    ClusterRow,
    CohortRow,
    NodePoolRow,
    NodeRow,
    PriorityClassRow,
    QueueRow,
    RunAssignmentRow,
    RunRow,
    TeamRow,
    WorkloadRow,
)
from controlplane.core.gpu_eq import gpu_eq_float
from controlplane.domain.model import Cluster, Node
from controlplane.service.views import (
    ClusterView,
    NodeLoad,
    NodeView,
    PoolView,
    PriorityClassView,
    QueueRef,
    TreeNodeView,
)

LIVE_RUN_STATES = ("admitted", "dispatching", "running")
_LEVEL_ROWS: dict[str, Any] = {"cohort": CohortRow, "team": TeamRow, "queue": QueueRow}
_PARENT_COLUMN = {"cohort": None, "team": "cohort_id", "queue": "team_id"}
_PARENT_LEVEL = {"team": "cohort", "queue": "team"}


def _pool_view(row: NodePoolRow, with_nodes: bool) -> PoolView:
    return PoolView(
        id=row.id,
        name=row.name,
        gpu_model=row.gpu_model,
        gpus_per_node=row.gpus_per_node,
        cpu_millis=row.cpu_millis,
        memory_mib=row.memory_mib,
        sharing=row.sharing,
        taints=list(row.taints),
        labels=dict(row.labels),
        price_per_gpu_hour=row.price_per_gpu_hour,
        spot=row.spot,
        node_count=row.node_count,
        nodes=[NodeView(n.id, n.name, n.schedulable) for n in row.nodes] if with_nodes else [],
        min_size=row.min_size,
        max_size=row.max_size,
        instance_type=row.instance_type,
        cloud_pool_id=row.cloud_pool_id,
        scale_target=row.scale_target,
        resource_names={str(k): str(v) for k, v in (row.resource_names or {}).items()},
        max_shares_per_pod=row.max_shares_per_pod or 0,
    )


def _cluster_view(row: ClusterRow, with_nodes: bool = False) -> ClusterView:
    return ClusterView(
        row.id,
        row.name,
        row.provider,
        row.region,
        row.created_at,
        [_pool_view(p, with_nodes) for p in row.pools],
        account=row.account,
        cloud_cluster=row.cloud_cluster,
        resource_group=row.resource_group,
        cloud_cluster_id=row.cloud_cluster_id,
        kubernetes=dict(row.kube_settings),
        sync_state=row.sync_state,
        sync_error=row.sync_error,
        synced_at=row.synced_at,
        pool_issues=[str(i) for i in row.pool_issues],
        pool_prices={str(k): float(v) for k, v in row.pool_prices.items()},
    )


class SqlAdminRepository:
    def __init__(self, session: Session) -> None:
        self.s = session

    # -- fleet -------------------------------------------------------------------------------
    def add_cluster(self, cluster: Cluster, nodes: Sequence[Node], now: datetime) -> None:
        self.s.add(
            ClusterRow(
                id=cluster.id, name=cluster.name, provider=cluster.provider, region=cluster.region, created_at=now
            )
        )
        self.s.flush()
        self._add_pools(cluster, nodes)

    def _add_pools(self, cluster: Cluster, nodes: Sequence[Node]) -> None:
        self.s.add_all([pool_to_row(p) for p in cluster.pools])
        self.s.flush()
        self.s.add_all([node_to_row(n) for n in nodes])
        self.s.flush()

    def set_cluster_region(self, cluster_id: str, region: str) -> None:
        self.s.execute(update(ClusterRow).where(ClusterRow.id == cluster_id).values(region=region))

    def _cluster_row(self, ref: str) -> ClusterRow | None:
        return self.s.scalars(
            select(ClusterRow)
            .where(or_(ClusterRow.id == ref, ClusterRow.name == ref))
            .options(selectinload(ClusterRow.pools).selectinload(NodePoolRow.nodes))
        ).first()

    def get_cluster(self, ref: str) -> ClusterView | None:
        row = self._cluster_row(ref)
        return _cluster_view(row, with_nodes=True) if row else None

    def known_clusters(self, names: Collection[str]) -> set[str]:
        if not names:
            return set()
        return set(self.s.scalars(select(ClusterRow.name).where(ClusterRow.name.in_(list(names)))))

    def list_clusters(self) -> list[ClusterView]:
        rows = self.s.scalars(select(ClusterRow).order_by(ClusterRow.name).options(selectinload(ClusterRow.pools)))
        return [_cluster_view(r) for r in rows]

    def delete_cluster(self, cluster_id: str) -> None:
        self.s.execute(delete(NodeRow).where(NodeRow.cluster_id == cluster_id))
        self.s.execute(delete(NodePoolRow).where(NodePoolRow.cluster_id == cluster_id))
        self.s.execute(delete(ClusterRow).where(ClusterRow.id == cluster_id))

    def pool_nodes(self, cluster_id: str, pool: str, limit: int) -> list[NodeLoad]:
        return pool_nodes(self.s, cluster_id, pool, limit)

    def cluster_run_count(self, cluster_id: str) -> int:
        return self.s.scalar(select(func.count()).select_from(RunRow).where(RunRow.cluster_id == cluster_id)) or 0

    def cluster_has_live_runs(self, cluster_id: str) -> bool:
        return bool(
            self.s.scalar(select(exists().where(RunRow.cluster_id == cluster_id, RunRow.state.in_(LIVE_RUN_STATES))))
        )

    def fleet(self) -> tuple[tuple[Cluster, ...], tuple[Node, ...]]:
        clusters = self.s.scalars(
            select(ClusterRow).order_by(ClusterRow.name).options(selectinload(ClusterRow.pools))
        ).all()
        nodes = self.s.scalars(select(NodeRow).order_by(NodeRow.name)).all()
        return tuple(cluster_from_row(c) for c in clusters), tuple(node_from_row(n) for n in nodes)

    def apply_node_schedulable(
        self, cluster_id: str, schedulable: Mapping[str, bool], kube_settings: Mapping[str, Any]
    ) -> tuple[int, list[str]]:
        row = self.s.get(ClusterRow, cluster_id, with_for_update=True)
        if row is None:
            return 0, sorted(schedulable)
        row.kube_settings = {**row.kube_settings, **kube_settings}  # a new dict, so the change is seen
        nodes = {
            n.name: n
            for n in self.s.scalars(
                select(NodeRow).where(NodeRow.cluster_id == cluster_id, NodeRow.name.in_(list(schedulable)))
            )
        }
        changed = 0
        for name, value in schedulable.items():
            node = nodes.get(name)
            if node is not None and node.schedulable != value:
                node.schedulable = value
                changed += 1
        self.s.flush()
        return changed, sorted(set(schedulable) - set(nodes))

    # -- queue tree --------------------------------------------------------------------------
    def _tree_view(self, level: str, row: Any, parent_name: str | None = None) -> TreeNodeView:
        """`parent_name`: the parent's, when the caller read it with the row (else one look-up)."""
        column = _PARENT_COLUMN[level]
        parent_id = getattr(row, column) if column else None
        if parent_id and parent_name is None:
            parent = self.s.get(_LEVEL_ROWS[_PARENT_LEVEL[level]], parent_id)
            parent_name = parent.name if parent is not None else None
        return TreeNodeView(
            row.id,
            row.name,
            parent_id,
            dict(row.guaranteed),
            dict(row.limit),
            row.weight,
            row.created_at,
            parent_name if parent_id else None,
            dict(row.borrowing_limit),
            dict(row.lending_limit),
        )

    def add_tree_node(self, level: str, view: TreeNodeView) -> None:
        values: dict[str, Any] = {
            "id": view.id,
            "name": view.name,
            "guaranteed": view.guaranteed,
            "limit": view.limit,
            "weight": view.weight,
            "borrowing_limit": view.borrowing_limit,
            "lending_limit": view.lending_limit,
            "created_at": view.created_at,
        }
        column = _PARENT_COLUMN[level]
        if column:
            values[column] = view.parent_id
        self.s.add(_LEVEL_ROWS[level](**values))
        self.s.flush()

    def update_tree_node(self, level: str, view: TreeNodeView) -> None:
        row = self.s.get(_LEVEL_ROWS[level], view.id)
        assert row is not None
        row.guaranteed, row.limit, row.weight = view.guaranteed, view.limit, view.weight
        row.borrowing_limit, row.lending_limit = view.borrowing_limit, view.lending_limit
        self.s.flush()

    def get_tree_node(self, level: str, ref: str) -> TreeNodeView | None:
        model = _LEVEL_ROWS[level]
        row = self.s.scalars(select(model).where(or_(model.id == ref, model.name == ref))).first()
        return self._tree_view(level, row) if row else None

    def queue_ref(self, ref: str, token_id: str | None = None) -> QueueRef | None:
        active = (
            exists().where(ApiTokenRow.id == token_id, ApiTokenRow.revoked_at.is_(None))
            if token_id is not None
            else literal(True)
        )
        row = self.s.execute(
            select(QueueRow.id, QueueRow.name, QueueRow.team_id, TeamRow.name, active)
            .join(TeamRow, TeamRow.id == QueueRow.team_id)
            .where(or_(QueueRow.id == ref, QueueRow.name == ref))
            .limit(1)
        ).first()
        return QueueRef(row[0], row[1], row[2], row[3], bool(row[4])) if row else None

    def list_tree_nodes(self, level: str, parent_id: str | None = None) -> list[TreeNodeView]:
        model = _LEVEL_ROWS[level]
        column = _PARENT_COLUMN[level]
        if column is None:
            return [self._tree_view(level, r) for r in self.s.scalars(select(model).order_by(model.name))]
        parent_model = _LEVEL_ROWS[_PARENT_LEVEL[level]]
        # The parent's name in the same query: one round trip for the level, not one per parent.
        query = (
            select(model, parent_model.name)
            .outerjoin(parent_model, parent_model.id == getattr(model, column))
            .order_by(model.name)
        )
        if parent_id is not None:
            query = query.where(getattr(model, column) == parent_id)
        return [self._tree_view(level, row, parent_name) for row, parent_name in self.s.execute(query)]

    def delete_tree_node(self, level: str, node_id: str) -> None:
        model = _LEVEL_ROWS[level]
        self.s.execute(delete(model).where(model.id == node_id))

    def tree_node_in_use(self, level: str, node_id: str) -> str | None:
        if level == "cohort":
            n = self.s.scalar(select(func.count()).where(TeamRow.cohort_id == node_id))
            return f"{n} teams belong to it" if n else None
        if level == "team":
            n = self.s.scalar(select(func.count()).where(QueueRow.team_id == node_id))
            return f"{n} queues belong to it" if n else None
        n = self.s.scalar(select(func.count()).where(WorkloadRow.queue_id == node_id))
        return f"{n} workloads were submitted to it" if n else None

    # -- priority classes --------------------------------------------------------------------
    @staticmethod
    def _pc_view(row: PriorityClassRow) -> PriorityClassView:
        return PriorityClassView(row.name, row.value, row.preemptible, row.min_runtime_seconds, row.is_default)

    def put_priority_class(self, pc: PriorityClassView) -> None:
        if pc.is_default:
            self.s.execute(update(PriorityClassRow).values(is_default=False))
        row = self.s.get(PriorityClassRow, pc.name)
        if row is None:
            row = PriorityClassRow(name=pc.name)
            self.s.add(row)
        row.value, row.preemptible = pc.value, pc.preemptible
        row.min_runtime_seconds, row.is_default = pc.min_runtime_seconds, pc.is_default
        self.s.flush()

    def get_priority_class(self, name: str) -> PriorityClassView | None:
        row = self.s.get(PriorityClassRow, name)
        return self._pc_view(row) if row else None

    def default_priority_class(self) -> PriorityClassView | None:
        row = self.s.scalars(
            select(PriorityClassRow).order_by(PriorityClassRow.is_default.desc(), PriorityClassRow.value)
        ).first()
        return self._pc_view(row) if row else None

    def list_priority_classes(self) -> list[PriorityClassView]:
        rows = self.s.scalars(select(PriorityClassRow).order_by(PriorityClassRow.value.desc()))
        return [self._pc_view(r) for r in rows]

    def delete_priority_class(self, name: str) -> None:
        self.s.execute(delete(PriorityClassRow).where(PriorityClassRow.name == name))

    def priority_class_in_use(self, name: str) -> bool:
        return bool(self.s.scalar(select(exists().where(WorkloadRow.priority_class == name))))


# The live workloads a node view names per node: the rest are counted, not named.
MAX_WORKLOADS_PER_NODE = 4


def pool_nodes(s: Session, cluster_id: str, pool_name: str, limit: int) -> list[NodeLoad]:
    """The nodes of one pool, by name, with the GPU-equivalents and pods live runs hold on each:
    grouped in SQL by node and demand shape, so a 5,000-pod gang is a handful of rows."""
    pool_row = s.scalar(select(NodePoolRow).where(NodePoolRow.cluster_id == cluster_id, NodePoolRow.name == pool_name))
    if pool_row is None:
        return []
    pool = pool_from_row(pool_row)
    nodes = s.execute(
        select(NodeRow.id, NodeRow.name, NodeRow.schedulable)
        .where(NodeRow.pool_id == pool_row.id)
        .order_by(NodeRow.name)
        .limit(limit)
    ).all()
    ids = [n.id for n in nodes]
    a = RunAssignmentRow
    live = RunRow.state.in_(("admitted", "dispatching", "running"))
    held: dict[str, Fraction] = defaultdict(Fraction)
    pods: dict[str, int] = defaultdict(int)
    names: dict[str, list[tuple[str, str, str]]] = defaultdict(list)
    if ids:
        shape = cast(a.demand, String)
        for node_id, demand_text, count in s.execute(
            select(a.node_id, shape, func.count())
            .join(RunRow, RunRow.id == a.run_id)
            .where(a.node_id.in_(ids), live)
            .group_by(a.node_id, shape)
        ):
            held[node_id] += Fraction(gpu_eq_float(demand_of(demand_text), pool)) * int(count)
            pods[node_id] += int(count)
        for node_id, workload_id, name, team_id in s.execute(
            select(a.node_id, WorkloadRow.id, WorkloadRow.name, WorkloadRow.team_id)
            .join(RunRow, RunRow.id == a.run_id)
            .join(WorkloadRow, WorkloadRow.id == RunRow.workload_id)
            .where(a.node_id.in_(ids), live)
            .distinct()
            .order_by(a.node_id, WorkloadRow.name)
        ):
            if len(names[node_id]) < MAX_WORKLOADS_PER_NODE:
                names[node_id].append((workload_id, name, team_id))
    return [
        NodeLoad(n.name, n.schedulable, pool.gpus_per_node, float(held[n.id]), pods[n.id], tuple(names[n.id]))
        for n in nodes
    ]
