"""The order pending gangs are decided in: fair share across queues, priority then FIFO inside one.

A queue's share is its weighted dominant share of what it uses above its guarantee (DRF over GPU
models), plus its weighted part of the fleet's recent consumption when the policy keeps history.
Queues are compared on the share each would have *after* admitting its head (Kueue's fair sharing
does the same): a queue whose next gang is large does not go ahead of one whose next gang keeps
it lower. Shares are read from the quota ledger as the cycle admits and evicts, so the order is
lazy: the next queue is picked after the previous gang was decided.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from fractions import Fraction

from controlplane.core.history import decayed_gpu_hours, history_shares
from controlplane.core.quota import ZERO, Usage
from controlplane.core.snapshot import Policy, Snapshot
from controlplane.core.state import CycleState
from controlplane.domain.model import GPU_EQ, QueueNode, Workload


class FairShare:
    def __init__(self, snapshot: Snapshot, policy: Policy, now: datetime, state: CycleState) -> None:
        self.tree: Mapping[str, QueueNode] = snapshot.queue_tree
        self.policy = policy
        self.state = state
        self.shares: dict[str, tuple[int, Fraction]] = {}  # queue id -> (ledger version, share)
        # (queue id, gpu-eq units of its head, models it may use) -> (ledger version, (borrowing, share) after)
        self.shares_after: dict[tuple[str, int, tuple[str, ...]], tuple[int, tuple[bool, Fraction]]] = {}
        self.history: dict[str, Fraction] = {}
        self.weights: dict[str, Fraction] = {}  # queue id -> its weight as a ratio, worked out once
        if policy.usage_history_weight > 0 and snapshot.usage_history:
            decayed = decayed_gpu_hours(snapshot.usage_history, now, policy.usage_half_life_seconds)
            weight = Fraction(policy.usage_history_weight).limit_denominator(1000)
            self.history = {
                queue_id: weight * Fraction(part).limit_denominator(10**6)
                for queue_id, part in history_shares(decayed).items()
            }

    def order(self, pending: Iterable[Workload]) -> Iterator[Workload]:
        """`pending` in order. Within a queue: priority, then FIFO. Across queues: the lowest
        weighted dominant share above guarantee goes first (or, without fair share, one global
        priority/FIFO order)."""
        by_priority = sorted(pending, key=lambda w: (-w.priority, w.created_seq, w.id))
        if not self.policy.fair_share:
            yield from by_priority
            return
        queues: dict[str, list[Workload]] = {}
        for workload in by_priority:
            queues.setdefault(workload.queue_id, []).append(workload)
        heads = dict.fromkeys(queues, 0)
        heap = [self._queue_key(queue_id, items[0]) for queue_id, items in queues.items()]
        heapq.heapify(heap)
        turn = heapq.heappop(heap) if heap else None
        while turn is not None:
            queue_id = turn[-1]
            items = queues[queue_id]
            yield items[heads[queue_id]]
            heads[queue_id] += 1
            if heads[queue_id] < len(items):
                # Push the queue's next head and pop the lowest in one step: when that is the same
                # queue again (a queue whose gangs keep waiting), the heap is not touched at all.
                turn = heapq.heappushpop(heap, self._queue_key(queue_id, items[heads[queue_id]]))
            else:
                turn = heapq.heappop(heap) if heap else None

    def _queue_key(self, queue_id: str, head: Workload) -> tuple[int, float, Fraction, int, int, str]:
        try:
            borrowing, share = self.after(queue_id, head)
        except Exception:  # a gang that cannot be sized is set aside when its turn comes (`schedule`)
            borrowing, share = self.state.ledger.borrowing(queue_id), self.share(queue_id)
        # The float goes first only for speed: a correctly rounded division never orders two
        # ratios the other way round, and the exact Fraction settles equal floats.
        return (int(borrowing), float(share), share, -head.priority, head.created_seq, queue_id)

    def after(self, queue_id: str, head: Workload) -> tuple[bool, Fraction]:
        """Whether the queue borrows, and its share, once `head` is admitted: the head's least
        gpu-eq added on the GPU model it may land on (the most favourable one when it may land on
        several: the model is only known once placed). Queues whose head stays within their
        guarantee go first."""
        amount = self.state.facts.least(head)
        if not amount:
            return self.state.ledger.borrowing(queue_id), self.share(queue_id)
        models = self.state.facts.allowed_models(head)
        memo_key = (queue_id, amount, models)
        version = self.state.ledger.versions.get(queue_id, 0)
        cached = self.shares_after.get(memo_key)
        if cached is not None and cached[0] == version:
            return cached[1]
        ledger = self.state.ledger
        guaranteed = ledger.guarantees.get(queue_id, {})
        if GPU_EQ in guaranteed and len(guaranteed) == 1:
            models = models[:1]  # a model-agnostic guarantee: shares are on gpu-eq, the model is moot
        extras = [{GPU_EQ: amount, model: amount} for model in models]
        borrowing = ledger.borrowing(queue_id) or not any(
            ledger.within_guarantee(queue_id, extra, queue_only=True) for extra in extras
        )
        answer = borrowing, min(self.share_of(queue_id, extra=extra) for extra in extras)
        self.shares_after[memo_key] = (version, answer)
        return answer

    def share(self, queue_id: str) -> Fraction:
        """`share_of` the queue, recomputed only when its usage changed."""
        version = self.state.ledger.versions.get(queue_id, 0)
        cached = self.shares.get(queue_id)
        if cached is not None and cached[0] == version:
            return cached[1]
        share = self.share_of(queue_id)
        self.shares[queue_id] = (version, share)
        return share

    def share_of(self, queue_id: str, extra: Usage | None = None) -> Fraction:
        """The queue's weighted dominant share, plus its weighted part of recent consumption when
        the policy keeps history; `extra` is usage it would add (for rebalancing trials)."""
        weight = self.weights.get(queue_id)
        if weight is None:
            node = self.tree.get(queue_id)
            weight = self.weights[queue_id] = Fraction(node.weight).limit_denominator(1000) if node else Fraction(1)
        ledger = self.state.ledger
        guaranteed = ledger.guarantees.get(queue_id, {})
        usage = ledger.usage.get(queue_id, {})
        if extra:
            usage = {key: usage.get(key, ZERO) + extra.get(key, ZERO) for key in usage.keys() | extra.keys()}
        # Shares are compared on the keys the guarantee speaks of: per GPU model (DRF over models)
        # when it names models or names nothing, on gpu-eq when it is model-agnostic.
        model_keys = [k for k in usage if k != GPU_EQ]
        if GPU_EQ in guaranteed and not any(k in guaranteed for k in model_keys):
            keys = [GPU_EQ]
        else:
            keys = model_keys or [GPU_EQ]
        # A share is a ratio (exact, of integer units), not a quota amount. The largest is found by
        # cross-multiplying integers; one Fraction is made at the end (this runs for every head).
        top, bottom = 0, 1
        capacity = self.state.capacity
        for key in keys:
            total = capacity.get(key)
            if not total:
                continue
            above = usage.get(key, ZERO) - guaranteed.get(key, ZERO)
            if above > 0 and above * bottom > top * total:
                top, bottom = above, total
        share = Fraction(top, bottom)
        history = self.history.get(queue_id)
        if history:
            share += history
        return share if weight == 1 else share / weight
