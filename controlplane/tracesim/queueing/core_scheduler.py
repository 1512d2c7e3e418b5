"""The policies driven by the real scheduling core (`controlplane.core.schedule`): `fifo`,
`priority` and `gpufleet`, as one `SimScheduler` implementation.

Bounded pending set. The core examines every pending gang it is shown, so a backlog of thousands
would make each cycle cost seconds. Like Kueue, which looks at the heads of its queues each
cycle, the core is shown at most `heads_per_queue` gangs of each queue (in the queue's own order:
priority, then arrival) and at most `max_pending` in all. Without fair share the order is one
global priority/arrival order and the cap takes its first `max_pending`. When the cap hid gangs
and the cycle admitted something, another cycle follows (new heads).
"""

from __future__ import annotations

import heapq
import itertools
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from controlplane.core.invariants import check_decision
from controlplane.core.schedule import schedule
from controlplane.core.snapshot import Decision, LiveRun, Policy, Snapshot
from controlplane.domain.model import PodAssignment
from controlplane.tracesim.queueing.scheduler import CycleResult, CycleView, PendingGang

# Virtual time zero; the core only compares instants.
EPOCH = datetime(2030, 1, 1, tzinfo=UTC)

CORE_POLICIES: dict[str, Policy] = {
    # One priority for everyone (the engine flattens it), global arrival order, no fair share,
    # no preemption or reclaim, no reservations: the gangs shown are tried oldest first and any
    # that fits starts.
    "fifo": Policy(name="fifo", fair_share=False, preemption=False, reclaim=False, max_reservations=0),
    # Strict priority, then arrival, over all queues; the rest of the default policy stays on.
    "priority": Policy(name="priority", fair_share=False),
    # The default policy: fair share above guarantees, reclaim, preemption, reservations/backfill.
    "gpufleet": Policy(),
}

# The policies with anti-hoarding on: the engine gives them the idle marks the idle-GPU detection
# would set on live runs (the baselines run without it, as a plain queue would).
IDLE_RECLAIM_POLICIES = frozenset({"gpufleet"})


@dataclass(frozen=True)
class CoreLimits:
    heads_per_queue: int = 8
    max_pending: int = 64
    check_invariants: bool = False  # the core's own invariant checks after every cycle (slow)


class CoreScheduler:
    def __init__(self, name: str, limits: CoreLimits) -> None:
        self.policy = CORE_POLICIES[name]
        self._name = name
        self.limits = limits
        self.schedule_seconds = 0.0  # wall time inside schedule(), for the record
        self.pending_shown_max = 0

    @property
    def name(self) -> str:
        return self._name

    @property
    def one_priority(self) -> bool:
        # FIFO means one priority for all: arrival order alone decides.
        return self._name == "fifo"

    def decide(self, view: CycleView) -> CycleResult:
        shown, hidden = self._shown(view)
        if not shown:
            return CycleResult(Decision())
        snapshot = Snapshot(
            clusters=view.fleet.clusters,
            nodes=view.fleet.nodes,
            queue_tree=view.fleet.tree,
            pending=tuple(gang.workload for gang in shown),
            live_runs=self._live_runs(view),
        )
        self.pending_shown_max = max(self.pending_shown_max, len(shown))
        began = time.perf_counter()  # measures the core's cost only; never drives the simulation
        decision = schedule(snapshot, self.policy, EPOCH + timedelta(seconds=view.now))
        self.schedule_seconds += time.perf_counter() - began
        if self.limits.check_invariants:
            check_decision(snapshot, decision)
        return CycleResult(decision, more=bool(decision.evictions) or (hidden and bool(decision.admissions)))

    def _shown(self, view: CycleView) -> tuple[list[PendingGang], bool]:
        """The pending gangs this cycle shows the core, and whether the cap hid any."""
        cap = self.limits.max_pending
        queues = view.pending
        total = sum(len(q) for q in queues.values())
        if not self.policy.fair_share:
            merged = heapq.merge(*queues.values(), key=lambda gang: gang.order)
            chosen = list(itertools.islice(merged, cap))
            return chosen, total > len(chosen)
        chosen = []
        # Round-robin by rank (every queue's first, then every queue's second, ...) so the overall
        # cap never starves a queue of its head.
        names = sorted(name for name, items in queues.items() if items)
        for rank in range(self.limits.heads_per_queue):
            for name in names:
                items = queues[name]
                if rank < len(items) and len(chosen) < cap:
                    chosen.append(items[rank])
        return chosen, total > len(chosen)

    def _live_runs(self, view: CycleView) -> tuple[LiveRun, ...]:
        """The live runs as the core sees them. A policy that never evicts and plans no reservations
        uses live runs only for the capacity and quota they hold, so their sum per queue and
        cluster (one assignment per node) decides exactly the same, and the core's per-run setup
        cost (most of a cycle with a thousand runs) drops to a few dozen runs."""
        runs = [gang.run for gang in view.running]
        policy = self.policy
        if policy.preemption or policy.reclaim or policy.rebalance or policy.max_reservations:
            return tuple(runs)
        merged: dict[tuple[str, str], dict[str, dict[str, int]]] = {}
        for run in runs:
            per_node = merged.setdefault((run.queue_id, run.cluster_id), {})
            for a in run.assignments:
                held = per_node.setdefault(a.node_id, {})
                for key, amount in a.demand.items():
                    held[key] = held.get(key, 0) + amount
        return tuple(
            LiveRun(
                workload_id=f"merged:{queue_id}:{cluster_id}",
                queue_id=queue_id,
                cluster_id=cluster_id,
                priority=0,
                assignments=tuple(
                    PodAssignment("merged", i, node_id, demand)
                    for i, (node_id, demand) in enumerate(sorted(nodes.items()))
                ),
                run_id=f"merged:{queue_id}:{cluster_id}",
            )
            for (queue_id, cluster_id), nodes in sorted(merged.items())
        )
