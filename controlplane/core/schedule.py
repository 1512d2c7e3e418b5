"""The pure scheduling core: `schedule(snapshot, policy, now) -> Decision`.

No I/O, no clock reads, no globals: the same snapshot gives the same decision. This first
policy admits by priority, then FIFO, respects every `limit` of the queue tree, and places each
gang all-or-nothing on the real free capacity of one cluster. Later work deepens it with
guarantees, fair share, preemption and reservations.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from fractions import Fraction

from controlplane.core.placement import FreeCapacity, Miss, Placement, empty_capacity, placements_in_cluster
from controlplane.core.snapshot import Admission, Decision, PendingReason, Policy, Snapshot, usage_of
from controlplane.domain.model import GPU_EQ, Node, NodePool, QueueNode, Workload


def _ancestors(queue_id: str, tree: Mapping[str, QueueNode]) -> list[QueueNode]:
    chain = []
    current: str | None = queue_id
    while current is not None and current in tree:
        chain.append(tree[current])
        current = tree[current].parent_id
    return chain


def _add(usage: dict[str, dict[str, Fraction]], node_id: str, amounts: Mapping[str, Fraction]) -> None:
    bucket = usage.setdefault(node_id, {})
    for key, value in amounts.items():
        bucket[key] = bucket.get(key, Fraction(0)) + value


def _fmt(value: Fraction) -> str:
    return f"{float(value):g}"


def schedule(snapshot: Snapshot, policy: Policy, now: datetime) -> Decision:  # noqa: ARG001
    pools_by_id: dict[str, NodePool] = snapshot.pools_by_id()
    schedulable = [node for node in snapshot.nodes if node.schedulable]
    pool_of_node = {node.id: pools_by_id[node.pool_id] for node in snapshot.nodes}
    nodes_by_pool: dict[str, list[Node]] = {}
    for node in schedulable:
        nodes_by_pool.setdefault(node.pool_id, []).append(node)
    free: FreeCapacity = empty_capacity(schedulable, pools_by_id)

    tree_usage: dict[str, dict[str, Fraction]] = {}
    for run in snapshot.live_runs:
        for assignment in run.assignments:
            node_free = free.get(assignment.node_id)
            if node_free is not None:
                for key, amount in assignment.demand.items():
                    node_free[key] = node_free.get(key, 0) - amount
        held = usage_of(run.assignments, pool_of_node)
        for tree_node in _ancestors(run.queue_id, snapshot.queue_tree):
            _add(tree_usage, tree_node.id, held)

    order = sorted(snapshot.pending, key=lambda w: (-w.priority, w.created_seq, w.id))
    admissions: list[Admission] = []
    pending: list[PendingReason] = []
    positions: dict[str, int] = {}
    for workload in order:
        outcome = _try_admit(workload, snapshot, policy, nodes_by_pool, free, pool_of_node, tree_usage)
        if isinstance(outcome, Admission):
            admissions.append(outcome)
            continue
        positions[workload.queue_id] = positions.get(workload.queue_id, 0) + 1
        pending.append(PendingReason(workload.id, outcome, positions[workload.queue_id]))
    return Decision(
        admissions=tuple(admissions),
        pending=tuple(pending),
        stats={"pending": len(order), "admitted": len(admissions)},
    )


def _try_admit(
    workload: Workload,
    snapshot: Snapshot,
    policy: Policy,
    nodes_by_pool: Mapping[str, list[Node]],
    free: FreeCapacity,
    pool_of_node: Mapping[str, NodePool],
    tree_usage: dict[str, dict[str, Fraction]],
) -> Admission | str:
    chain = _ancestors(workload.queue_id, snapshot.queue_tree)
    wanted = workload.gpu_eq()
    for tree_node in chain:
        bound = tree_node.limit.amounts.get(GPU_EQ)
        used = tree_usage.get(tree_node.id, {}).get(GPU_EQ, Fraction(0))
        if bound is not None and used + wanted > Fraction(bound).limit_denominator(10**6):
            return (
                f"quota: {tree_node.name} limit is {bound:g} gpu-eq, {_fmt(used)} in use, "
                f"this gang needs {_fmt(wanted)}"
            )

    placements: list[Placement] = []
    best_miss: Miss | None = None
    for cluster in snapshot.clusters:
        result = placements_in_cluster(workload, cluster, nodes_by_pool, free, policy.prefer_same_pool)
        if isinstance(result, Miss):
            if best_miss is None or result.placed > best_miss.placed:
                best_miss = result
        else:
            placements.extend(result)
    if not placements:
        best = f"best cluster {best_miss.detail} has room for {best_miss.placed}" if best_miss else "no clusters"
        return f"no-fit: needs {workload.min_available} pods placed at once in one cluster; {best}"

    for placement in sorted(placements, key=lambda p: (p.spread, p.leftover_gpu_slots, p.cluster_id)):
        held = usage_of(placement.assignments, pool_of_node)
        over = _model_limit_hit(chain, tree_usage, held)
        if over is not None:
            continue
        for assignment in placement.assignments:
            node_free = free[assignment.node_id]
            for key, amount in assignment.demand.items():
                node_free[key] -= amount
        for tree_node in chain:
            _add(tree_usage, tree_node.id, held)
        return Admission(workload.id, placement.cluster_id, placement.assignments)
    over_name, key = _model_limit_hit(chain, tree_usage, usage_of(placements[0].assignments, pool_of_node)) or ("", "")
    return f"quota: {over_name} limit on {key} would be exceeded by every feasible placement"


def _model_limit_hit(
    chain: list[QueueNode],
    tree_usage: Mapping[str, Mapping[str, Fraction]],
    held: Mapping[str, Fraction],
) -> tuple[str, str] | None:
    for tree_node in chain:
        current = tree_usage.get(tree_node.id, {})
        combined = {key: current.get(key, Fraction(0)) + held.get(key, Fraction(0)) for key in held}
        key = tree_node.limit.exceeded_by(combined)
        if key is not None:
            return tree_node.name, key
    return None
