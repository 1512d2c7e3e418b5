"""Platform-admin operations: the fleet, the queue tree, priority classes."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from controlplane.domain.model import GPU_EQ, Cluster, Node, NodePool
from controlplane.domain.resource_names import ResourceOverrides, unadvertised
from controlplane.domain.sharing import MIG_PROFILES, SharingMode
from controlplane.service.cloud_ports import UnsafeKubeconfig, validate_user_kubeconfig
from controlplane.service.cloud_state import SyncedPool
from controlplane.service.cluster_specs import CLOUD_PROVIDERS, ClusterSpec, ClusterUpdate
from controlplane.service.commands import (
    CohortSpec,
    PriorityClassSpec,
    QueueSpec,
    QuotaUpdate,
    TeamSpec,
    guarantee_over_limit,
)
from controlplane.service.errors import Conflict, Invalid, NotFound
from controlplane.service.ids import new_id
from controlplane.service.kubeconfigs import KubeconfigStore
from controlplane.service.ports import UnitOfWork
from controlplane.service.views import ClusterView, PriorityClassView, TreeNodeView

LEVELS = ("cohort", "team", "queue")


def _build_fleet(cluster_id: str, spec: ClusterSpec, region: str) -> tuple[Cluster, list[Node]]:
    pools: list[NodePool] = []
    nodes: list[Node] = []
    for pool_spec in spec.pools:
        pool = pool_spec.to_pool(new_id("pool"), cluster_id)
        pools.append(pool)
        nodes.extend(
            Node(new_id("node"), cluster_id, pool.id, f"{spec.name}-{pool.name}-{i}")
            for i in range(pool_spec.node_count)
        )
    return Cluster(cluster_id, spec.name, spec.provider, region, tuple(pools)), nodes


def create_cluster(
    uow: UnitOfWork,
    spec: ClusterSpec,
    actor: str,
    now: datetime,
    kubeconfigs: KubeconfigStore | None = None,
    nats_credential_hash: str | None = None,
) -> ClusterView:
    """Register a cluster. Real clusters are stored with no pools: a `kubernetes` cluster's pools and nodes
    come from its node inventory, a cloud cluster (stored `pending`) is discovered by fleet sync, both
    outside any transaction. A `kubernetes` cluster's kubeconfig goes to `kubeconfigs`, never to SQL.
    `nats_credential_hash`: its agent's first NATS credential, stored in the same transaction."""
    if spec.kubeconfig is not None:
        try:
            validate_user_kubeconfig(spec.kubeconfig)
        except UnsafeKubeconfig as exc:
            raise Invalid(str(exc)) from exc
        if kubeconfigs is None:
            raise Conflict("this API has no kubeconfig store configured; kubernetes clusters cannot be registered")
    cluster_id = new_id("cl")
    stored = False
    try:
        with uow:
            if uow.admin.get_cluster(spec.name) is not None:
                raise Conflict(f"cluster {spec.name} already exists")
            cluster, nodes = _build_fleet(cluster_id, spec, spec.region)
            uow.admin.add_cluster(cluster, nodes, now)
            if nats_credential_hash is not None:
                uow.cluster_credentials.add(new_id("ccr"), cluster_id, nats_credential_hash, now)
            if spec.provider != "sim":
                ref = ""
                if spec.kubeconfig is not None and kubeconfigs is not None:
                    ref = kubeconfigs.put(cluster_id, spec.kubeconfig)  # a local file write, no network
                    stored = True
                uow.cloud.set_cluster_meta(
                    cluster_id,
                    account=spec.account,
                    cloud_cluster=spec.cluster,
                    resource_group=spec.resource_group,
                    cloud_cluster_id=spec.cluster_id,
                    kube_settings=spec.kubernetes.model_dump(),
                    kubeconfig_ref=ref,
                    sync_state="pending" if spec.provider in CLOUD_PROVIDERS else "ready",
                    pool_prices=spec.pool_prices,
                )
            detail = spec.model_dump(exclude={"kubeconfig"})  # a secret: never in the audit log
            uow.audit.record(actor, "cluster.create", "cluster", cluster.id, detail, now)
            uow.commit()
    except BaseException:
        if stored and kubeconfigs is not None:
            kubeconfigs.delete(cluster_id)
        raise
    return get_cluster(uow, spec.name)


def update_cluster(uow: UnitOfWork, ref: str, update: ClusterUpdate, actor: str, now: datetime) -> ClusterView:
    with uow:
        current = uow.admin.get_cluster(ref)
        if current is None:
            raise NotFound(f"no cluster {ref}")
        if update.kubernetes is not None:
            if current.provider == "sim":
                raise Conflict(f"cluster {current.name} is simulated; it has no Kubernetes settings")
            # Only the fields the request names change; the inventory's own keys stay as they are.
            given = update.kubernetes.model_dump(include=update.kubernetes.model_fields_set)
            overrides = ResourceOverrides.of({**current.kubernetes, **given})
            problems = [
                problem
                for pool in current.pools
                for problem in unadvertised(
                    pool.name, SharingMode.parse(pool.sharing).kind, pool.resource_names, overrides
                )
            ]
            if problems:
                raise Conflict(
                    "; ".join(problems) + ". Leave the override out (pods then ask for what the nodes advertise), "
                    "or change the nodes' device plugin first"
                )
            uow.admin.apply_node_schedulable(current.id, {}, given)
        if update.pools is not None:
            if current.provider in CLOUD_PROVIDERS:
                raise Conflict(f"cluster {current.name}: {current.provider} pools come from the cloud (fleet sync)")
            if current.provider == "kubernetes":
                raise Conflict(f"cluster {current.name}: kubernetes pools come from the cluster's nodes")
            if uow.admin.cluster_has_live_runs(current.id):
                raise Conflict(f"cluster {current.name} has live runs; drain it before changing its pools")
            # Reconciled by name, as fleet sync does for a cloud: nodes an ended run's history names
            # stay (cordoned) and so do their pools, so the history and its reports stay whole.
            synced = [
                SyncedPool(
                    spec=pool,
                    min_size=0,
                    max_size=None,
                    instance_type="",
                    cloud_pool_id="",
                    node_names=tuple(f"{current.name}-{pool.name}-{i}" for i in range(pool.node_count)),
                )
                for pool in update.pools
            ]
            uow.cloud.sync_pools(current.id, synced, (), now, cloud_synced=False)
        if update.region is not None:
            uow.admin.set_cluster_region(current.id, update.region)
        detail = update.model_dump(exclude_none=True, exclude={"kubernetes"})
        if update.kubernetes is not None:
            detail["kubernetes"] = update.kubernetes.model_dump(include=update.kubernetes.model_fields_set)
        uow.audit.record(actor, "cluster.update", "cluster", current.id, detail, now)
        uow.commit()
    return get_cluster(uow, current.id)


def get_cluster(uow: UnitOfWork, ref: str) -> ClusterView:
    with uow:
        view = uow.admin.get_cluster(ref)
    if view is None:
        raise NotFound(f"no cluster {ref}")
    return view


def list_clusters(uow: UnitOfWork) -> list[ClusterView]:
    with uow:
        return uow.admin.list_clusters()


def delete_cluster(
    uow: UnitOfWork, ref: str, actor: str, now: datetime, kubeconfigs: KubeconfigStore | None = None
) -> None:
    with uow:
        view = uow.admin.get_cluster(ref)
        if view is None:
            raise NotFound(f"no cluster {ref}")
        if uow.admin.cluster_has_live_runs(view.id):
            raise Conflict(f"cluster {view.name} has live runs; cancel or drain them first")
        runs = uow.admin.cluster_run_count(view.id)
        if runs:
            # Ended runs name the cluster and its nodes; deleting them would rewrite history that
            # usage and cost reports read.
            raise Conflict(
                f"cluster {view.name} is named by the history of {runs} ended run(s), which reports read; "
                "it cannot be deleted (scale its pools to 0 nodes to stop using it)"
            )
        uow.admin.delete_cluster(view.id)
        uow.audit.record(actor, "cluster.delete", "cluster", view.id, {"name": view.name}, now)
        uow.commit()
    if view.provider == "kubernetes" and kubeconfigs is not None:
        kubeconfigs.delete(view.id)


def _parent_ref(spec: CohortSpec | TeamSpec | QueueSpec) -> tuple[str | None, str | None]:
    if isinstance(spec, QueueSpec):
        return "team", spec.team
    if isinstance(spec, TeamSpec) and spec.cohort:
        return "cohort", spec.cohort
    return None, None


def _check_quota_keys(uow: UnitOfWork, *quotas: Mapping[str, float] | None) -> None:
    """A quota key is `gpu-eq` or a GPU model the fleet knows: a pool's model, or one of the models
    gpufleet knows the MIG geometry of. Any other key (`H100` for `H100-80GB`, `cpu`,
    `nvidia.com/gpu`) would be stored and never enforced: the ledger charges only those. Which
    models exist is the fleet's state, so a key it does not know conflicts with it (409)."""
    keys = {key for quota in quotas if quota for key in quota if key != GPU_EQ}
    if not keys:
        return
    known = set(MIG_PROFILES) | {pool.gpu_model for cluster in uow.admin.list_clusters() for pool in cluster.pools}
    unknown = sorted(keys - known)
    if unknown:
        names = ", ".join(f"`{key}`" for key in unknown)
        raise Conflict(
            f"quota key {names} names no GPU model of the fleet and would never be enforced: use `{GPU_EQ}` or one "
            f"of {', '.join(sorted(known))} (a model the fleet does not have yet counts once a node pool of it is "
            "registered, even with no nodes)"
        )


def _quotas(spec: CohortSpec | TeamSpec | QueueSpec | QuotaUpdate) -> tuple[Mapping[str, float] | None, ...]:
    return (spec.guaranteed, spec.limit, spec.borrowing_limit, spec.lending_limit)


def create_tree_node(
    uow: UnitOfWork, level: str, spec: CohortSpec | TeamSpec | QueueSpec, actor: str, now: datetime
) -> TreeNodeView:
    with uow:
        if uow.admin.get_tree_node(level, spec.name) is not None:
            raise Conflict(f"{level} {spec.name} already exists")
        _check_quota_keys(uow, *_quotas(spec))
        parent_id = None
        parent_level, parent_name = _parent_ref(spec)
        if parent_level and parent_name:
            parent = uow.admin.get_tree_node(parent_level, parent_name)
            if parent is None:
                raise NotFound(f"unknown {parent_level} {parent_name!r}")
            parent_id = parent.id
        view = TreeNodeView(
            id=new_id({"cohort": "co", "team": "tm", "queue": "q"}[level]),
            name=spec.name,
            parent_id=parent_id,
            guaranteed=dict(spec.guaranteed),
            limit=dict(spec.limit),
            weight=spec.weight,
            created_at=now,
            parent=parent_name,
            borrowing_limit=dict(spec.borrowing_limit),
            lending_limit=dict(spec.lending_limit),
        )
        uow.admin.add_tree_node(level, view)  # the spec's guarantee is within its limit (`TreeNodeSpec`)
        uow.audit.record(actor, f"{level}.create", level, view.id, spec.model_dump(), now)
        uow.commit()
    return view


def _check_guarantee_within_limit(view: TreeNodeView) -> None:
    """An update's guarantee against the stored limit, or its limit against the stored guarantee:
    the state, not the request alone, is in the way (409)."""
    problem = guarantee_over_limit(view.guaranteed, view.limit)
    if problem:
        raise Conflict(problem)


def update_tree_node(
    uow: UnitOfWork, level: str, ref: str, update: QuotaUpdate, actor: str, now: datetime
) -> TreeNodeView:
    with uow:
        current = uow.admin.get_tree_node(level, ref)
        if current is None:
            raise NotFound(f"no {level} {ref}")
        _check_quota_keys(uow, *_quotas(update))
        view = TreeNodeView(
            id=current.id,
            name=current.name,
            parent_id=current.parent_id,
            guaranteed=dict(update.guaranteed) if update.guaranteed is not None else current.guaranteed,
            limit=dict(update.limit) if update.limit is not None else current.limit,
            weight=update.weight if update.weight is not None else current.weight,
            created_at=current.created_at,
            parent=current.parent,
            borrowing_limit=(
                dict(update.borrowing_limit) if update.borrowing_limit is not None else current.borrowing_limit
            ),
            lending_limit=dict(update.lending_limit) if update.lending_limit is not None else current.lending_limit,
        )
        _check_guarantee_within_limit(view)
        uow.admin.update_tree_node(level, view)
        uow.audit.record(actor, f"{level}.update", level, view.id, update.model_dump(exclude_none=True), now)
        uow.commit()
    return view


def get_tree_node(uow: UnitOfWork, level: str, ref: str) -> TreeNodeView:
    with uow:
        view = uow.admin.get_tree_node(level, ref)
    if view is None:
        raise NotFound(f"no {level} {ref}")
    return view


def list_tree_nodes(uow: UnitOfWork, level: str, parent_id: str | None = None) -> list[TreeNodeView]:
    with uow:
        return uow.admin.list_tree_nodes(level, parent_id)


def delete_tree_node(uow: UnitOfWork, level: str, ref: str, actor: str, now: datetime) -> None:
    with uow:
        view = uow.admin.get_tree_node(level, ref)
        if view is None:
            raise NotFound(f"no {level} {ref}")
        blocker = uow.admin.tree_node_in_use(level, view.id)
        if blocker:
            raise Conflict(f"{level} {view.name} is still in use: {blocker}")
        uow.admin.delete_tree_node(level, view.id)
        uow.audit.record(actor, f"{level}.delete", level, view.id, {"name": view.name}, now)
        uow.commit()


def put_priority_class(uow: UnitOfWork, spec: PriorityClassSpec, actor: str, now: datetime) -> PriorityClassView:
    view = PriorityClassView(spec.name, spec.value, spec.preemptible, spec.min_runtime_seconds, spec.is_default)
    with uow:
        uow.admin.put_priority_class(view)
        uow.audit.record(actor, "priority_class.put", "priority_class", spec.name, spec.model_dump(), now)
        uow.commit()
    return view


def list_priority_classes(uow: UnitOfWork) -> list[PriorityClassView]:
    with uow:
        return uow.admin.list_priority_classes()


def delete_priority_class(uow: UnitOfWork, name: str, actor: str, now: datetime) -> None:
    with uow:
        if uow.admin.get_priority_class(name) is None:
            raise NotFound(f"no priority class {name}")
        if uow.admin.priority_class_in_use(name):
            raise Conflict(f"priority class {name} is used by workloads")
        uow.admin.delete_priority_class(name)
        uow.audit.record(actor, "priority_class.delete", "priority_class", name, {}, now)
        uow.commit()
