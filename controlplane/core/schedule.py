"""The pure scheduling core: `schedule(snapshot, policy, now) -> Decision`.

No I/O, no clock reads, no globals: the same snapshot gives the same decision. The cycle itself
(`cycle.py`) runs the actions in their fixed order over a journaled state (`state.py`): admit,
reclaim idle GPUs, reclaim borrowed capacity, preempt, rebalance, reserve. This module keeps one
bad gang or queue from failing the cycle for the whole fleet.
"""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import datetime

from controlplane.core.cycle import Cycle
from controlplane.core.decision import Decision, NotConsidered, SchedulingFailed, UnusableQuota, Why
from controlplane.core.snapshot import Policy, Snapshot
from controlplane.domain.limits import MAX_QUOTA_AMOUNT
from controlplane.domain.model import QueueNode, Quota, Workload

# A gang whose scheduling raises is set aside with a reason and the cycle starts again without
# it (the cycle's working state may be half-updated by then); after this many such gangs in one
# cycle, the cycle keeps what it decided before the last failure and the rest wait for the next.
MAX_FAILED_GANGS_PER_CYCLE = 3


def schedule(snapshot: Snapshot, policy: Policy, now: datetime) -> Decision:
    """One cycle. One bad gang or queue never fails it for the whole fleet: a queue whose quota
    holds a value no arithmetic can use (an infinity, NaN, negative or beyond MAX_QUOTA_AMOUNT)
    keeps its gangs pending with that reason, and a gang whose scheduling raises gets an `error:`
    reason while the rest of the fleet is scheduled."""
    snapshot, held = quarantine_queues(snapshot)
    failed: dict[str, tuple[Workload, Why]] = {}
    while True:
        todo = tuple(w for w in snapshot.pending if w.id not in failed)
        cycle = Cycle(replace(snapshot, pending=todo), policy, now)
        failure = cycle.run()
        if failure is None:
            break
        workload, exc = failure
        failed[workload.id] = (workload, SchedulingFailed(type(exc).__name__, str(exc)[:200]))
        if len(failed) >= MAX_FAILED_GANGS_PER_CYCLE:
            decided = {a.workload_id for a in cycle.admissions} | {p.workload_id for p in cycle.pending}
            for rest in todo:
                if rest.id not in decided and rest.id not in failed:
                    cycle.leave_pending(rest, (NotConsidered(len(failed)), None))
            break
    return decision_of(cycle, snapshot, held, failed)


def decision_of(
    cycle: Cycle,
    snapshot: Snapshot,
    held: list[tuple[Workload, Why]],
    failed: dict[str, tuple[Workload, Why]],
) -> Decision:
    """The decision of a finished cycle, with the gangs set aside (`held`, `failed`) left pending."""
    for workload, why in [*failed.values(), *held]:
        cycle.leave_pending(workload, (why, None))
    return Decision(
        admissions=tuple(cycle.admissions),
        pending=tuple(cycle.pending),
        evictions=tuple(cycle.evictor.evictions),
        stats={
            "pending": len(snapshot.pending) + len(held),
            "admitted": len(cycle.admissions),
            "evicted": len(cycle.evictor.evictions),
            **({"failed": len(failed)} if failed else {}),
        },
    )


def _usable(value: object, positive: bool = False) -> bool:
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    return (value > 0 if positive else value >= 0) and value <= MAX_QUOTA_AMOUNT


def _harmless(quota: Quota) -> Quota:
    return Quota({key: value if _usable(value) else 0.0 for key, value in quota.amounts.items()})


def _unusable(node: QueueNode) -> UnusableQuota | None:
    """What in the node's quota no arithmetic can use, or None."""
    if not _usable(node.weight, positive=True):
        return UnusableQuota(node.name, "weight", None, repr(node.weight))
    for name in ("guaranteed", "limit", "borrowing_limit", "lending_limit"):
        quota: Quota = getattr(node, name)
        for key, value in quota.amounts.items():
            if not _usable(value):
                return UnusableQuota(node.name, name, key, repr(value))
    return None


def quarantine_queues(snapshot: Snapshot) -> tuple[Snapshot, list[tuple[Workload, Why]]]:
    """Set aside the pending gangs of queues under a node with an unusable quota (it got into the
    database before the API bounded it, or by hand), and make that node's quota harmless for the
    cycle: unusable amounts become 0, so its live runs still count and nothing more is admitted."""
    problems = {node_id: p for node_id, node in snapshot.queue_tree.items() if (p := _unusable(node)) is not None}
    if not problems:
        return snapshot, []
    tree = dict(snapshot.queue_tree)
    for node_id in problems:
        node = tree[node_id]
        tree[node_id] = replace(
            node,
            weight=node.weight if _usable(node.weight, positive=True) else 1.0,
            guaranteed=_harmless(node.guaranteed),
            limit=_harmless(node.limit),
            borrowing_limit=_harmless(node.borrowing_limit),
            lending_limit=_harmless(node.lending_limit),
        )

    def culprit(queue_id: str) -> str | None:
        current: str | None = queue_id
        while current is not None and current in tree:
            if current in problems:
                return current
            current = tree[current].parent_id
        return None

    held: list[tuple[Workload, Why]] = []
    pending: list[Workload] = []
    for workload in snapshot.pending:
        found = culprit(workload.queue_id)
        if found is None:
            pending.append(workload)
            continue
        held.append((workload, problems[found]))
    return replace(snapshot, queue_tree=tree, pending=tuple(pending), pending_delta=None), held
