"""Real clusters in SQL: locators and sync state, pool sync by diff, autoscaler and gang-timeout queries."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import exists, select, update
from sqlalchemy.orm import Session, selectinload

from adapters.sql.row_locks import lock_workloads
from adapters.sql.tables import (
    ClusterRow,
    NodePoolRow,
    NodeRow,
    PendingReasonRow,
    QueueRow,
    RunAssignmentRow,
    RunRow,
    WorkloadRow,
)
from controlplane.core.decision import EndCause
from controlplane.service.cloud_state import (
    CloudClusterRecord,
    CloudPoolRecord,
    LostRun,
    PoolChanges,
    StalledRun,
    SyncedPool,
)
from controlplane.service.cluster_specs import CLOUD_PROVIDERS
from controlplane.service.ids import new_id

LIVE = ("admitted", "dispatching", "running")
NOT_YET_RUNNING = ("admitted", "dispatching")
LIVE_STATES = (*NOT_YET_RUNNING, "running")


class SqlCloudRepository:
    def __init__(self, session: Session) -> None:
        self.s = session

    def set_cluster_meta(
        self,
        cluster_id: str,
        *,
        account: str,
        cloud_cluster: str,
        resource_group: str,
        cloud_cluster_id: str,
        kube_settings: Mapping[str, Any],
        kubeconfig_ref: str,
        sync_state: str,
        pool_prices: Mapping[str, float],
    ) -> None:
        self.s.execute(
            update(ClusterRow)
            .where(ClusterRow.id == cluster_id)
            .values(
                account=account,
                cloud_cluster=cloud_cluster,
                resource_group=resource_group,
                cloud_cluster_id=cloud_cluster_id,
                kube_settings=dict(kube_settings),
                kubeconfig_ref=kubeconfig_ref,
                sync_state=sync_state,
                pool_prices=dict(pool_prices),
            )
            .execution_options(synchronize_session=False)
        )

    def real_clusters(self) -> list[CloudClusterRecord]:
        rows = self.s.scalars(select(ClusterRow).where(ClusterRow.provider != "sim").order_by(ClusterRow.name))
        return [
            CloudClusterRecord(
                id=r.id,
                name=r.name,
                provider=r.provider,
                region=r.region,
                account=r.account,
                cloud_cluster=r.cloud_cluster,
                resource_group=r.resource_group,
                cloud_cluster_id=r.cloud_cluster_id,
                kube_settings=dict(r.kube_settings),
                kubeconfig_ref=r.kubeconfig_ref,
                sync_state=r.sync_state,
                synced_at=r.synced_at,
                pool_prices={str(k): float(v) for k, v in r.pool_prices.items()},
            )
            for r in rows
        ]

    def _referenced(self, node_ids: Sequence[str]) -> set[str]:
        if not node_ids:
            return set()
        return set(
            self.s.scalars(
                select(RunAssignmentRow.node_id).where(RunAssignmentRow.node_id.in_(list(node_ids))).distinct()
            )
        )

    def sync_pools(
        self,
        cluster_id: str,
        pools: Sequence[SyncedPool],
        issues: Sequence[str],
        now: datetime,
        cloud_synced: bool = True,
    ) -> PoolChanges:
        # Fleet sync and the inventory both rewrite a cluster's pools: the cluster row serialises them.
        cluster = self.s.scalars(
            select(ClusterRow)
            .where(ClusterRow.id == cluster_id)
            .options(selectinload(ClusterRow.pools).selectinload(NodePoolRow.nodes))
            .with_for_update()
        ).one()
        existing = {p.name: p for p in cluster.pools}
        added: list[str] = []
        resized: list[tuple[str, int, int]] = []
        for synced in pools:
            spec = synced.spec
            row = existing.pop(spec.name, None)
            if row is None:
                row = NodePoolRow(id=new_id("pool"), cluster_id=cluster_id, name=spec.name)
                self.s.add(row)
                added.append(spec.name)
                before = None
            else:
                before = row.node_count
            row.gpu_model, row.gpus_per_node = spec.gpu_model, spec.gpus_per_node
            row.cpu_millis, row.memory_mib, row.sharing = spec.cpu_millis, spec.memory_mib, spec.sharing
            row.taints = [t.model_dump() for t in spec.taints]
            row.labels = dict(spec.labels)
            row.price_per_gpu_hour, row.spot, row.node_count = spec.price_per_gpu_hour, spec.spot, spec.node_count
            row.min_size, row.max_size = synced.min_size, synced.max_size
            row.instance_type, row.cloud_pool_id = synced.instance_type, synced.cloud_pool_id
            row.resource_names, row.max_shares_per_pod = dict(synced.resource_names), synced.max_shares_per_pod
            if row.scale_target is not None and row.scale_target == spec.node_count:
                row.scale_target = None  # the cloud got there
            if before is not None and before != spec.node_count:
                resized.append((spec.name, before, spec.node_count))
            self.s.flush()
            self._sync_nodes(cluster_id, row, synced.node_names)
        removed: list[str] = []
        for name, row in sorted(existing.items()):
            removed.append(name)
            self._sync_nodes(cluster_id, row, ())
            if not row.nodes:
                self.s.delete(row)
            else:
                row.node_count = 0  # runs still refer to its cordoned nodes; kept until they are gone
        if cloud_synced:
            cluster.sync_state, cluster.sync_error, cluster.synced_at = "ready", "", now
        cluster.pool_issues = list(issues)
        self.s.flush()
        return PoolChanges(tuple(added), tuple(removed), tuple(resized))

    def _sync_nodes(self, cluster_id: str, pool: NodePoolRow, names: Sequence[str]) -> None:
        wanted = set(names)
        current = {n.name: n for n in pool.nodes}
        # A node name is unique per cluster: one moved between pools leaves its old pool first.
        stale = [n for name, n in current.items() if name not in wanted]
        referenced = self._referenced([n.id for n in stale])
        for node in stale:
            if node.id in referenced:
                node.schedulable = False
            else:
                pool.nodes.remove(node)
                self.s.delete(node)
        self.s.flush()
        for name in names:
            if name in current:
                # Membership is fleet sync's; whether a node takes work (cordoned, NotReady) is the
                # inventory reports' (`service/inventory.py`), which also un-cordon a node that came back.
                continue
            moved = self.s.scalars(
                select(NodeRow).where(NodeRow.cluster_id == cluster_id, NodeRow.name == name)
            ).first()
            if moved is not None:
                if self._referenced([moved.id]):
                    continue  # still held by a run of its old pool; picked up on a later sync
                self.s.delete(moved)
                self.s.flush()
            pool.nodes.append(NodeRow(id=new_id("node"), cluster_id=cluster_id, pool_id=pool.id, name=name))
        self.s.flush()

    def live_runs_on_nodes(self, cluster_id: str, node_names: Sequence[str]) -> list[LostRun]:
        if not node_names:
            return []
        rows = self.s.execute(
            select(RunRow.id, RunRow.workload_id, QueueRow.name, NodeRow.name)
            .join(RunAssignmentRow, RunAssignmentRow.run_id == RunRow.id)
            .join(NodeRow, NodeRow.id == RunAssignmentRow.node_id)
            .join(WorkloadRow, WorkloadRow.id == RunRow.workload_id)
            .join(QueueRow, QueueRow.id == WorkloadRow.queue_id)
            .where(NodeRow.cluster_id == cluster_id, NodeRow.name.in_(list(node_names)), RunRow.state.in_(LIVE))
            .order_by(RunRow.id, NodeRow.name)
        ).all()
        lost: dict[str, LostRun] = {}
        for run_id, workload_id, queue, node in rows:
            lost.setdefault(run_id, LostRun(run_id, workload_id, queue, node))
        return list(lost.values())

    def sync_failed(self, cluster_id: str, error: str) -> None:
        row = self.s.get(ClusterRow, cluster_id)
        if row is None:
            return
        # A cluster never synced stays usable by nothing; one synced before keeps its last inventory.
        row.sync_state = "error" if row.synced_at is None else row.sync_state
        row.sync_error = error[:2000]
        self.s.flush()

    def cloud_pools(self) -> list[CloudPoolRecord]:
        busy = exists().where(
            RunAssignmentRow.run_id == RunRow.id,
            RunAssignmentRow.node_id == NodeRow.id,
            NodeRow.pool_id == NodePoolRow.id,
            RunRow.state.in_(LIVE),
        )
        rows = self.s.execute(
            select(NodePoolRow, ClusterRow.name, ClusterRow.provider, busy.label("busy"))
            .join(ClusterRow, ClusterRow.id == NodePoolRow.cluster_id)
            .where(ClusterRow.provider.in_(CLOUD_PROVIDERS), ClusterRow.sync_state == "ready")
            .order_by(ClusterRow.name, NodePoolRow.name)
        ).all()
        return [
            CloudPoolRecord(
                id=p.id,
                cluster_id=p.cluster_id,
                cluster=cluster,
                provider=provider,
                name=p.name,
                node_count=p.node_count,
                min_size=p.min_size,
                max_size=p.max_size,
                scale_target=p.scale_target,
                scale_requested_at=p.scale_requested_at,
                idle_since=p.idle_since,
                busy=bool(is_busy),
            )
            for p, cluster, provider, is_busy in rows
        ]

    def set_scale_target(self, pool_id: str, target: int, now: datetime) -> None:
        self.s.execute(
            update(NodePoolRow)
            .where(NodePoolRow.id == pool_id)
            .values(scale_target=target, scale_requested_at=now)
            .execution_options(synchronize_session=False)
        )

    def set_idle_since(self, pool_id: str, since: datetime | None) -> None:
        self.s.execute(
            update(NodePoolRow)
            .where(NodePoolRow.id == pool_id)
            .values(idle_since=since)
            .execution_options(synchronize_session=False)
        )

    def pending_kinds(self) -> dict[str, str]:
        rows = self.s.execute(
            select(WorkloadRow.id, PendingReasonRow.kind)
            .outerjoin(PendingReasonRow, PendingReasonRow.workload_id == WorkloadRow.id)
            .where(WorkloadRow.state == "queued")
        )
        return {wid: kind or "" for wid, kind in rows}

    def stalled_runs(self, dispatched_before: datetime) -> list[StalledRun]:
        return self._runs(
            RunRow.dispatched_at,
            RunRow.state.in_(NOT_YET_RUNNING),
            RunRow.dispatch_state == "applied",
            RunRow.dispatched_at < dispatched_before,
        )

    def undispatched_runs(self, admitted_before: datetime) -> list[StalledRun]:
        return self._runs(
            RunRow.created_at,
            RunRow.state.in_(NOT_YET_RUNNING),
            RunRow.dispatch_state == "pending",
            RunRow.created_at < admitted_before,
            limit=1000,
        )

    def applied_runs(self, cluster: str, dispatched_before: datetime) -> list[StalledRun]:
        return self._runs(
            RunRow.dispatched_at,
            ClusterRow.name == cluster,
            RunRow.state.in_(LIVE_STATES),
            RunRow.dispatch_state == "applied",
            RunRow.dispatched_at < dispatched_before,
        )

    def _runs(self, since: Any, *conditions: Any, limit: int | None = None) -> list[StalledRun]:
        """Runs matching `conditions` with their queue and cluster names, oldest `since` first (`since`
        is the moment the result's `dispatched_at` carries)."""
        rows = self.s.execute(
            select(RunRow.id, RunRow.workload_id, QueueRow.name, ClusterRow.name, since)
            .join(WorkloadRow, WorkloadRow.id == RunRow.workload_id)
            .join(QueueRow, QueueRow.id == WorkloadRow.queue_id)
            .join(ClusterRow, ClusterRow.id == RunRow.cluster_id)
            .where(since.is_not(None), *conditions)
            .order_by(since, RunRow.id)
            .limit(limit)
        ).all()
        return [StalledRun(run_id, wid, queue, cluster, at) for run_id, wid, queue, cluster, at in rows]

    def requeue_run(self, run_id: str, message: str, cause: EndCause, now: datetime, running_too: bool = False) -> bool:
        lock_workloads(self.s, of_runs=[run_id])
        result = self.s.execute(
            update(RunRow)
            .where(RunRow.id == run_id, RunRow.state.in_(LIVE_STATES if running_too else NOT_YET_RUNNING))
            # `preempted` is the run state for "ended by gpufleet, its workload back in the queue".
            .values(
                state="preempted", message=message, end_cause=str(cause), finished_at=now, dispatch_state="teardown"
            )
            .execution_options(synchronize_session=False)
        )
        return bool(result.rowcount)  # type: ignore[attr-defined]
