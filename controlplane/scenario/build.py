"""Domain values from a scenario document, with ids derived from names so runs are reproducible.

Ids: a cluster is its name, a pool `<cluster>/<pool>`, a node `<cluster>/<pool>/<index>`, a
workload its name, a tree node `<level>/<name>` (a team and a queue may share a name).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from controlplane.domain.model import (
    Cluster,
    Node,
    PriorityClass,
    QueueNode,
    Quota,
    Toleration,
    Workload,
    WorkloadKind,
)
from controlplane.scenario.format import QuotaChange, ScenarioDoc, TreeNodeDoc, WorkloadDoc
from controlplane.service.commands import gang_minimum


def tree_id(level: str, name: str) -> str:
    return f"{level}/{name}"


@dataclass(frozen=True)
class World:
    """The scenario's fixed facts; nodes and the queue tree are only the starting state."""

    clusters: tuple[Cluster, ...]
    nodes: tuple[Node, ...]
    tree: dict[str, QueueNode]
    workloads: tuple[Workload, ...]  # in submission order: (submit_at, place in the document)


def build_world(doc: ScenarioDoc) -> World:
    clusters, nodes = _fleet(doc)
    return World(clusters, nodes, _tree(doc), _workloads(doc))


def _fleet(doc: ScenarioDoc) -> tuple[tuple[Cluster, ...], tuple[Node, ...]]:
    clusters: list[Cluster] = []
    nodes: list[Node] = []
    for spec in doc.fleet:
        pools = tuple(p.to_pool(f"{spec.name}/{p.name}", spec.name) for p in spec.pools)
        clusters.append(Cluster(spec.name, spec.name, spec.provider, spec.region, pools))
        for pool in pools:
            for index in range(pool.node_count):
                node_id = f"{pool.id}/{index}"
                nodes.append(Node(node_id, spec.name, pool.id, node_id))
    return tuple(clusters), tuple(nodes)


def _tree_node(level: str, spec: TreeNodeDoc, parent_id: str | None) -> QueueNode:
    return QueueNode(
        id=tree_id(level, spec.name),
        name=spec.name,
        parent_id=parent_id,
        guaranteed=Quota(dict(spec.guaranteed)),
        limit=Quota(dict(spec.limit)),
        weight=spec.weight,
        borrowing_limit=Quota(dict(spec.borrowing_limit)),
        lending_limit=Quota(dict(spec.lending_limit)),
    )


def _tree(doc: ScenarioDoc) -> dict[str, QueueNode]:
    nodes = [_tree_node("cohort", c, None) for c in doc.cohorts]
    nodes += [_tree_node("team", t, tree_id("cohort", t.parent) if t.parent else None) for t in doc.teams]
    nodes += [_tree_node("queue", q, tree_id("team", q.parent)) for q in doc.queues]
    return {node.id: node for node in nodes}


def change_quota(tree: dict[str, QueueNode], change: QuotaChange) -> None:
    level, name = change.target
    node_id = tree_id(level, name)
    current = tree[node_id]
    tree[node_id] = replace(
        current,
        guaranteed=Quota(dict(change.guaranteed)) if change.guaranteed is not None else current.guaranteed,
        limit=Quota(dict(change.limit)) if change.limit is not None else current.limit,
        weight=change.weight if change.weight is not None else current.weight,
        borrowing_limit=(
            Quota(dict(change.borrowing_limit)) if change.borrowing_limit is not None else current.borrowing_limit
        ),
        lending_limit=Quota(dict(change.lending_limit)) if change.lending_limit is not None else current.lending_limit,
    )


def submission_order(doc: ScenarioDoc) -> list[WorkloadDoc]:
    # sorted() is stable: workloads submitted at the same moment keep their document order.
    return sorted(doc.workloads, key=lambda w: w.submit_at)


def _workloads(doc: ScenarioDoc) -> tuple[Workload, ...]:
    classes = {
        pc.name: PriorityClass(pc.name, pc.value, pc.preemptible, pc.min_runtime_seconds) for pc in doc.priority_classes
    }
    default = next((pc.name for pc in doc.priority_classes if pc.default), None)
    team_of = {q.name: q.parent for q in doc.queues}
    workloads = []
    for seq, spec in enumerate(submission_order(doc)):
        class_name = spec.priority_class or default
        assert class_name is not None, "validated: a workload without a class needs a default class"
        pc = classes[class_name]
        pod_sets = tuple(p.to_pod_set() for p in spec.pod_sets)
        isolation = spec.requires_isolation
        if isolation is None:  # the API's default
            isolation = spec.kind is WorkloadKind.INFERENCE
        workloads.append(
            Workload(
                id=spec.name,
                team_id=tree_id("team", team_of[spec.queue]),
                queue_id=tree_id("queue", spec.queue),
                name=spec.name,
                priority_class=pc.name,
                priority=pc.value,
                kind=spec.kind,
                pod_sets=pod_sets,
                min_available=gang_minimum(spec.pod_sets, spec.min_available),
                requires_isolation=isolation,
                tolerations=tuple(Toleration(t.key, t.operator, t.value, t.effect) for t in spec.tolerations),
                duration_seconds=spec.duration,
                created_seq=seq,
                preemptible=pc.preemptible,
                min_runtime_seconds=pc.min_runtime_seconds,
                max_runtime_seconds=spec.max_runtime_seconds,
                spot=spec.spot,
                same_pool=spec.same_pool,
            )
        )
    return tuple(workloads)
