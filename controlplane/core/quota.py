"""The quota ledger of one cycle: usage per node of the queue tree, and the rules on it.

Amounts are kept per resource key: `gpu-eq` (model-agnostic) and one key per GPU model, as
exact integers in the snapshot's unit (`gpu_eq.GpuEqUnit`): usage and bounds alike.
A key missing from a `limit` or `borrowing_limit` means unbounded; a key missing from
`guaranteed` means nothing is guaranteed for it.

Rules (issue 3):
- nobody goes above a `limit`, anywhere on its chain (queue -> team -> cohort);
- usage above a node's guarantee is borrowed and bounded by its `borrowing_limit`;
- a node under its guarantee keeps the part it does not lend (`guaranteed - usage -
  lending_limit`) out of reach of borrowers;
- non-preemptible work runs only within guarantees, so a lender can always get its guarantee back;
- a queue whose usage is above its guarantee runs (part of) its work on borrowed capacity, and
  that work may be reclaimed by a queue that is below its own guarantee.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from controlplane.core.decision import BorrowingLimit, QuotaLimit
from controlplane.core.gpu_eq import GpuEqUnit
from controlplane.domain.model import GPU_EQ, QueueNode

Usage = dict[str, int]  # per key, in units of 1/D GPU
ZERO = 0


class Ledger:
    """Usage of every node of the queue tree, updated as the cycle admits and evicts."""

    def __init__(self, tree: Mapping[str, QueueNode], unit: GpuEqUnit) -> None:
        self.tree = tree
        self.unit = unit
        self.usage: dict[str, Usage] = {}
        self.versions: dict[str, int] = {}  # bumped on every change of a node's usage
        self._chains: dict[str, tuple[QueueNode, ...]] = {}
        self._lowest_holders: list[str] | None = None  # see `idle_guarantee`

        # Bounds in units, converted once: the rules below run for every placement tried.
        def units(amounts: Mapping[str, float]) -> dict[str, int]:
            return {key: unit.of_amount(value) for key, value in amounts.items()}

        self.limits = {i: units(n.limit.amounts) for i, n in tree.items()}
        self.guarantees = {i: units(n.guaranteed.amounts) for i, n in tree.items()}
        self.borrowing_limits = {i: units(n.borrowing_limit.amounts) for i, n in tree.items()}
        self.lending_limits = {i: units(n.lending_limit.amounts) for i, n in tree.items()}

    def chain(self, queue_id: str) -> tuple[QueueNode, ...]:
        """The queue and its ancestors, bottom up."""
        cached = self._chains.get(queue_id)
        if cached is None:
            nodes = []
            current: str | None = queue_id
            while current is not None and current in self.tree:
                nodes.append(self.tree[current])
                current = self.tree[current].parent_id
            cached = self._chains[queue_id] = tuple(nodes)
        return cached

    def used(self, node_id: str, key: str) -> int:
        return self.usage.get(node_id, {}).get(key, ZERO)

    def charge(self, queue_id: str, amounts: Mapping[str, int], sign: int = 1) -> None:
        """Add (or with `sign` -1 take back) usage on the queue's chain. Usage that comes back to
        zero is removed: a ledger holds the same entries however it got to its amounts (a state
        kept across cycles charges and refunds, a fresh one never held them)."""
        for node in self.chain(queue_id):
            self.versions[node.id] = self.versions.get(node.id, 0) + 1
            bucket = self.usage.setdefault(node.id, {})
            for key, value in amounts.items():
                total = bucket.get(key, ZERO) + sign * value
                if total:
                    bucket[key] = total
                else:
                    bucket.pop(key, None)
            if not bucket:
                del self.usage[node.id]

    # -- rules ---------------------------------------------------------------------------------

    def limit_block(self, queue_id: str, amounts: Mapping[str, int], least: bool = False) -> QuotaLimit | None:
        found = self.limit_block_at(queue_id, amounts, least)
        return None if found is None else found[1]

    def limit_block_at(
        self, queue_id: str, amounts: Mapping[str, int], least: bool = False
    ) -> tuple[int, QuotaLimit] | None:
        """The limit on the chain that blocks `amounts` and its depth (0: the queue): the lowest
        one that usage fills; when `amounts` is the least any start of the gang holds (`least`),
        first one they exceed on their own (the gang can never run under it, whatever ends). The
        reason holds no usage figure: it stays the same while the gang waits on it (usage is read
        where the reason is shown)."""
        chain = self.chain(queue_id)
        for depth, node in enumerate(chain if least else ()):
            for key, bound in self.limits[node.id].items():
                want = amounts.get(key, ZERO)
                if want > bound:
                    return depth, QuotaLimit(node.name, key, node.limit.amounts[key], self.unit.gpus(want), never=True)
        for depth, node in enumerate(chain):
            for key, bound in self.limits[node.id].items():
                want = amounts.get(key, ZERO)
                if want and self.used(node.id, key) + want > bound:
                    return depth, QuotaLimit(node.name, key, node.limit.amounts[key], self.unit.gpus(want))
        return None

    def ancestor_limit_block(self, queue_id: str, amounts: Mapping[str, int]) -> str | None:
        """The id of the highest team or cohort whose limit blocks `amounts` when none of the
        queue's own limits does (that limit is shared with, and maybe used up by, queues under it);
        None otherwise."""
        chain = self.chain(queue_id)
        blocking: str | None = None
        for depth, node in enumerate(chain):
            for key, bound in self.limits[node.id].items():
                want = amounts.get(key, ZERO)
                if want and self.used(node.id, key) + want > bound:
                    if depth == 0:
                        return None
                    blocking = node.id
        return blocking

    def under(self, queue_id: str, ancestor_id: str) -> bool:
        return any(node.id == ancestor_id for node in self.chain(queue_id))

    def borrowing_block(self, queue_id: str, amounts: Mapping[str, int]) -> BorrowingLimit | None:
        for node in self.chain(queue_id):
            for key, bound in self.borrowing_limits[node.id].items():
                want = amounts.get(key, ZERO)
                if not want:
                    continue
                guaranteed = self.guarantees[node.id].get(key, ZERO)
                borrowed = max(ZERO, self.used(node.id, key) + want - guaranteed)
                if borrowed > bound:
                    return BorrowingLimit(node.name, key, node.borrowing_limit.amounts[key])
        return None

    def within_guarantee(self, queue_id: str, amounts: Mapping[str, int], queue_only: bool = False) -> bool:
        """True when the queue has a guarantee covering `amounts` on top of its usage, and so do
        all its ancestors that declare guarantees (only the queue itself with `queue_only`)."""
        chain = self.chain(queue_id)
        if not chain or not _covers_any(chain[0], amounts):
            return False
        for node in chain[:1] if queue_only else chain:
            for key, bound in self.guarantees[node.id].items():
                want = amounts.get(key, ZERO)
                if want and self.used(node.id, key) + want > bound:
                    return False
        return True

    def guarantee_holder(self, queue_id: str) -> int | None:
        """Where on the queue's chain (0: the queue itself) the guarantee it may reclaim is held:
        the queue's own, else the nearest team's or cohort's, which belongs to its queues together.
        None when nothing on the chain declares one."""
        for depth, node in enumerate(self.chain(queue_id)):
            if node.guaranteed.amounts:
                return depth
        return None

    def within_shared_guarantee(
        self,
        queue_id: str,
        amounts: Mapping[str, int],
        holder_only: bool = False,
        given_back: Mapping[str, int] | None = None,
    ) -> bool:
        """`within_guarantee` where a queue without a guarantee of its own counts on the one its
        nearest team or cohort holds: that holder and every ancestor above it that declares one
        must cover `amounts` on top of their usage (only the holder with `holder_only`).
        `given_back`: usage of the queue's own runs counted as gone (it leaves its whole chain),
        the what-if of evicting them, asked without touching the ledger."""
        depth = self.guarantee_holder(queue_id)
        if depth is None:
            return False
        chain = self.chain(queue_id)[depth:]
        if not _covers_any(chain[0], amounts):
            return False
        less = given_back or {}
        for node in chain[:1] if holder_only else chain:
            for key, bound in self.guarantees[node.id].items():
                want = amounts.get(key, ZERO)
                if want and self.used(node.id, key) - less.get(key, ZERO) + want > bound:
                    return False
        return True

    def borrowing_beyond_holder(self, queue_id: str) -> bool:
        """Whether the queue's work runs on borrowed capacity, counting a queue without a guarantee
        of its own against the guarantee its nearest team or cohort holds for its queues together."""
        depth = self.guarantee_holder(queue_id)
        if not depth:  # its own guarantee, or none anywhere: `borrowing` says
            return self.borrowing(queue_id)
        holder = self.chain(queue_id)[depth]
        if not any(value > 0 for value in self.usage.get(queue_id, {}).values()):
            return False
        usage = self.usage.get(holder.id, {})
        return any(usage.get(key, ZERO) > bound for key, bound in self.guarantees[holder.id].items())

    def idle_guarantee(self, excluding: str) -> Usage:
        """Unused guarantee of the nodes that hold one for themselves (the lowest holders on every
        chain, so a team's guarantee and its queues' are not counted twice), outside the chain of
        `excluding`: what borrowers may use now and those holders may reclaim later."""
        if self._lowest_holders is None:
            holders = [i for i, g in self.guarantees.items() if g]
            above = {node.id for h in holders for node in self.chain(h)[1:]}
            self._lowest_holders = [h for h in holders if h not in above]
        own = {node.id for node in self.chain(excluding)}
        total: Usage = {}
        for holder_id in self._lowest_holders:
            if holder_id in own:
                continue
            for key, bound in self.guarantees[holder_id].items():
                unused = bound - self.used(holder_id, key)
                if unused > 0:
                    total[key] = total.get(key, ZERO) + unused
        return total

    def borrowing(self, queue_id: str) -> bool:
        """Whether the queue uses more than it is guaranteed (all of it, without a guarantee)."""
        node = self.tree.get(queue_id)
        if node is None:
            return True
        usage = self.usage.get(queue_id, {})
        if not node.guaranteed.amounts:
            return any(value > 0 for value in usage.values())
        return any(usage.get(key, ZERO) > bound for key, bound in self.guarantees[queue_id].items())

    def protected(
        self, lenders: Iterable[str], excluding: str, awaited: Mapping[tuple[str, str], int] | None = None
    ) -> Usage:
        """Unused guarantee other queues do not lend: borrowers must leave it free.

        `awaited`: (guarantee holder id, GPU model) -> units gangs within that guarantee wait for
        this cycle on that model. That much of the holder's unused guarantee is not lent on that
        model this cycle (to anyone outside the holder)."""
        keeps: dict[tuple[str, str], int] = {}
        for queue_id in lenders:
            if queue_id == excluding or queue_id not in self.tree:
                continue
            for key, bound in self.guarantees[queue_id].items():
                lend = self.lending_limits[queue_id].get(key)
                if lend is None:
                    continue  # without a lending limit a queue lends all it does not use
                unused = max(ZERO, bound - self.used(queue_id, key))
                keeps[(queue_id, key)] = max(ZERO, unused - lend)
        for (holder_id, model), amount in (awaited or {}).items():
            if self.under(excluding, holder_id):
                continue  # its own (team's) guarantee
            guaranteed = self.guarantees[holder_id]
            key = model if model in guaranteed else GPU_EQ
            if key not in guaranteed:
                continue
            unused = max(ZERO, guaranteed[key] - self.used(holder_id, key))
            keeps[(holder_id, model)] = max(keeps.get((holder_id, model), ZERO), min(unused, amount))
        total: Usage = {}
        for (_, key), keep in keeps.items():
            if keep:
                total[key] = total.get(key, ZERO) + keep
        return total


def _covers_any(node: QueueNode, amounts: Mapping[str, int]) -> bool:
    keys = set(node.guaranteed.amounts)
    return bool(keys) and all(key in keys or key == GPU_EQ or GPU_EQ in keys for key in amounts if amounts[key])
