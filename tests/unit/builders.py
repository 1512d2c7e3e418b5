"""Small builders for the frozen domain values used by the pure scheduling core.

Every builder has defaults that make a plain, unconstrained fleet: callers only spell out what a
test is about.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime

from controlplane.core.schedule import schedule
from controlplane.core.snapshot import Admission, Decision, LiveRun, Policy, Snapshot
from controlplane.domain.model import (
    Cluster,
    Node,
    NodePool,
    PodSet,
    QueueNode,
    Quota,
    Taint,
    Toleration,
    Workload,
    WorkloadKind,
)
from controlplane.domain.sharing import SharingMode
from controlplane.service.wording import pending_text

NOW = datetime(2025, 1, 1, tzinfo=UTC)

# Roomy host resources, so tests about GPUs are never limited by CPU or memory by accident.
HOST_CPU = 512_000
HOST_MEM = 4_000_000


def make_pool(
    id: str = "p1",
    cluster_id: str = "c1",
    *,
    gpu_model: str = "H100-80GB",
    gpus_per_node: int = 8,
    sharing: str = "exclusive",
    taints: Iterable[Taint] = (),
    cpu_millis: int = HOST_CPU,
    memory_mib: int = HOST_MEM,
    name: str | None = None,
) -> NodePool:
    return NodePool(
        id=id,
        cluster_id=cluster_id,
        name=name or id,
        gpu_model=gpu_model,
        gpus_per_node=gpus_per_node,
        cpu_millis=cpu_millis,
        memory_mib=memory_mib,
        sharing=SharingMode.parse(sharing),
        taints=tuple(taints),
    )


def make_cluster(id: str, *pools: NodePool, name: str | None = None) -> Cluster:
    assert all(p.cluster_id == id for p in pools), "pool built for another cluster"
    return Cluster(id=id, name=name or id, provider="sim", pools=tuple(pools))


def make_nodes(pool: NodePool, count: int, *, unschedulable: Iterable[int] = ()) -> tuple[Node, ...]:
    """`count` nodes named `<pool>-n<i>`; indexes in `unschedulable` are cordoned."""
    cordoned = set(unschedulable)
    return tuple(
        Node(
            id=f"{pool.id}-n{i}",
            cluster_id=pool.cluster_id,
            pool_id=pool.id,
            name=f"{pool.id}-n{i}",
            schedulable=i not in cordoned,
        )
        for i in range(count)
    )


def gpu_eq_limit(amount: float | None) -> Quota:
    return Quota({"gpu-eq": amount}) if amount is not None else Quota()


def make_queue(
    id: str, parent_id: str | None = None, *, limit: float | None = None, limits: Mapping[str, float] | None = None
) -> QueueNode:
    quota = Quota(dict(limits)) if limits is not None else gpu_eq_limit(limit)
    return QueueNode(id=id, name=id, parent_id=parent_id, limit=quota)


def default_tree(
    *, cohort_limit: float | None = None, team_limit: float | None = None, queue_limit: float | None = None
) -> dict[str, QueueNode]:
    """cohort -> team t1 -> queue q1."""
    return tree_of(
        make_queue("cohort", None, limit=cohort_limit),
        make_queue("t1", "cohort", limit=team_limit),
        make_queue("q1", "t1", limit=queue_limit),
    )


def tree_of(*nodes: QueueNode) -> dict[str, QueueNode]:
    return {n.id: n for n in nodes}


def gpus(
    n: int,
    replicas: int = 1,
    *,
    name: str = "worker",
    models: Iterable[str] = (),
    cpu_millis: int = 1000,
    memory_mib: int = 4096,
) -> PodSet:
    return PodSet(
        name=name, replicas=replicas, gpus=n, gpu_models=tuple(models), cpu_millis=cpu_millis, memory_mib=memory_mib
    )


def mig(profile: str, replicas: int = 1, *, name: str = "worker", models: Iterable[str] = ()) -> PodSet:
    return PodSet(name=name, replicas=replicas, mig_profile=profile, gpu_models=tuple(models))


def frac(fraction: float, replicas: int = 1, *, name: str = "worker", models: Iterable[str] = ()) -> PodSet:
    return PodSet(name=name, replicas=replicas, gpu_fraction=fraction, gpu_models=tuple(models))


def cpu_only(replicas: int = 1, *, name: str = "launcher", cpu_millis: int = 1000) -> PodSet:
    return PodSet(name=name, replicas=replicas, cpu_millis=cpu_millis)


def make_workload(
    id: str,
    *pod_sets: PodSet,
    queue: str = "q1",
    team: str = "t1",
    priority: int = 0,
    seq: int = 0,
    min_available: int | None = None,
    isolation: bool = False,
    tolerations: Iterable[Toleration] = (),
    kind: WorkloadKind = WorkloadKind.TRAINING,
) -> Workload:
    pod_sets = pod_sets or (gpus(1),)
    total = sum(ps.replicas for ps in pod_sets)
    return Workload(
        id=id,
        team_id=team,
        queue_id=queue,
        name=id,
        priority_class=f"p{priority}",
        priority=priority,
        kind=kind,
        pod_sets=tuple(pod_sets),
        min_available=total if min_available is None else min_available,
        requires_isolation=isolation,
        tolerations=tuple(tolerations),
        created_seq=seq,
    )


def make_snapshot(
    clusters: Iterable[Cluster],
    nodes: Iterable[Node],
    pending: Iterable[Workload] = (),
    *,
    tree: Mapping[str, QueueNode] | None = None,
    live: Iterable[LiveRun] = (),
) -> Snapshot:
    return Snapshot(
        clusters=tuple(clusters),
        nodes=tuple(nodes),
        queue_tree=dict(tree) if tree is not None else default_tree(),
        pending=tuple(pending),
        live_runs=tuple(live),
    )


def single_pool_fleet(
    *, nodes: int = 1, gpus_per_node: int = 8, sharing: str = "exclusive", gpu_model: str = "H100-80GB"
) -> tuple[tuple[Cluster, ...], tuple[Node, ...]]:
    pool = make_pool(gpus_per_node=gpus_per_node, sharing=sharing, gpu_model=gpu_model)
    return (make_cluster("c1", pool),), make_nodes(pool, nodes)


def run_schedule(snapshot: Snapshot, policy: Policy | None = None) -> Decision:
    return schedule(snapshot, policy or Policy(), NOW)


def live_run_of(admission: Admission, workload: Workload) -> LiveRun:
    assert admission.workload_id == workload.id
    return LiveRun(
        workload_id=workload.id,
        queue_id=workload.queue_id,
        cluster_id=admission.cluster_id,
        priority=workload.priority,
        assignments=admission.assignments,
        lent_to=admission.lent_to,
    )


def admitted_ids(decision: Decision) -> list[str]:
    return [a.workload_id for a in decision.admissions]


def reason_of(decision: Decision, workload_id: str) -> str:
    (reason,) = [pending_text(p) for p in decision.pending if p.workload_id == workload_id]
    return reason


def nodes_used(admission: Admission) -> set[str]:
    return {a.node_id for a in admission.assignments}
