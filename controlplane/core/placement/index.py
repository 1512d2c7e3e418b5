"""Indexes of one pool's nodes by free GPU slots, and the per-shape, per-pool demands they answer."""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Mapping
from dataclasses import dataclass

from controlplane.core.placement.types import FreeCapacity, is_slot
from controlplane.domain.model import Cluster, Node, NodePool, PodSet, Workload


class PoolIndex:
    """The nodes of one pool bucketed by free GPU slots, each bucket sorted by node id."""

    __slots__ = ("buckets", "counts", "free_of", "keys", "maxima", "negative", "nodes", "pool", "size", "slots")

    def __init__(self, pool: NodePool, nodes: list[Node], free: FreeCapacity) -> None:
        self.pool = pool
        self.nodes = nodes  # the caller's list: a different list means a different layout
        self.size = len(nodes)
        self.free_of: dict[str, dict[str, int]] = {}
        self.slots: dict[str, int] = {}
        self.buckets: dict[int, list[str]] = {}
        # per slot dimension: free amount -> number of nodes with it (for the largest free amount)
        self.counts: dict[str, dict[int, int]] = {}
        self.maxima: dict[str, int] = {}
        self.negative: set[str] = set()  # nodes with a negative slot amount (an over-committed snapshot)
        # Built once per pool per cycle on tracked capacity, but once per call on a plain trial
        # copy: kept to one pass with the slot keys worked out once per key layout.
        free_of, slots_of, buckets, counts = self.free_of, self.slots, self.buckets, self.counts
        layout: object = None
        slot_keys: tuple[str, ...] = ()
        for node in nodes:
            node_id = node.id
            node_free = free[node_id]
            free_of[node_id] = node_free
            keys = node_free.keys()
            if keys != layout:
                layout = keys
                slot_keys = tuple(key for key in node_free if is_slot(key))
            total = 0
            for key in slot_keys:
                value = node_free[key]
                total += value
                per_value = counts.get(key)
                if per_value is None:
                    per_value = counts[key] = {}
                per_value[value] = per_value.get(value, 0) + 1
                if value < 0:
                    self.negative.add(node_id)
            slots_of[node_id] = total
            bucket = buckets.get(total)
            if bucket is None:
                buckets[total] = [node_id]
            else:
                bucket.append(node_id)
        for bucket in buckets.values():
            bucket.sort()
        self.keys = sorted(buckets)

    def refresh(self, node_id: str, previous: Mapping[str, int]) -> None:
        """Re-file a node whose free capacity changed; `previous` is what the index knew."""
        for key, value in previous.items():
            if is_slot(key):
                per_value = self.counts[key]
                per_value[value] -= 1
                if not per_value[value]:
                    del per_value[value]
        old = self.slots[node_id]
        bucket = self.buckets[old]
        del bucket[bisect_left(bucket, node_id)]
        if not bucket:
            del self.buckets[old]
            del self.keys[bisect_left(self.keys, old)]
        self.negative.discard(node_id)
        node_free = self.free_of[node_id]
        total = 0
        for key, value in node_free.items():
            if is_slot(key):
                total += value
                per_value = self.counts.setdefault(key, {})
                per_value[value] = per_value.get(value, 0) + 1
                if value < 0:
                    self.negative.add(node_id)
        self.slots[node_id] = total
        target = self.buckets.get(total)
        if target is None:
            self.buckets[total] = [node_id]
            insort(self.keys, total)
        else:
            insort(target, node_id)
        self.maxima.clear()

    def most_free(self, key: str) -> int:
        """The largest free amount of slot dimension `key` on any node of the pool."""
        found = self.maxima.get(key)
        if found is None:
            per_value = self.counts.get(key, {})
            having = sum(per_value.values())
            found = max(per_value) if per_value else 0
            if having < self.size:  # nodes without the key offer none of it
                found = max(found, 0)
            self.maxima[key] = found
        return found

    def room_for(self, demand: Demand, wanted: int) -> int:
        """At most how many pods of `demand` the pool's nodes could take (slots only), capped at
        `wanted`."""
        room = wanted
        for key, amount in demand.slot_items:
            if amount > 0:
                fit = 0
                for value, nodes in self.counts.get(key, {}).items():
                    if value >= amount:
                        fit += nodes * (value // amount)
                room = min(room, fit)
        return room

    def best(
        self, demand: tuple[tuple[str, int], ...], need: int, taken: Mapping[str, object]
    ) -> tuple[int, str] | None:
        """(slots left, node id) of the tightest node not in `taken` that fits, or None."""
        keys = self.keys
        # A node that fits has at least `need` free slots, unless some slot amount is negative.
        start = 0 if self.negative else bisect_left(keys, need)
        free_of = self.free_of
        for position in range(start, len(keys)):
            slots = keys[position]
            for node_id in self.buckets[slots]:
                if node_id in taken:
                    continue
                node_free = free_of[node_id]
                for key, amount in demand:
                    if node_free.get(key, 0) < amount:
                        break
                else:
                    return slots - need, node_id
        return None


@dataclass(frozen=True)
class Demand:
    """What one pod of a pod set takes from a node of one pool."""

    pool_id: str
    items: tuple[tuple[str, int], ...]
    slot_items: tuple[tuple[str, int], ...]  # the GPU-slot part of `items`
    slots: int  # GPU slots it takes in all

    @staticmethod
    def of(pod_set: PodSet, pool: NodePool) -> Demand | None:
        demand = pod_set.demand_on(pool)
        if demand is None:
            return None
        slot_items = tuple((key, amount) for key, amount in demand.items() if is_slot(key))
        return Demand(pool.id, tuple(demand.items()), slot_items, sum(amount for _, amount in slot_items))


@dataclass(frozen=True)
class GangShape:
    """What placement depends on in a workload: gangs of one shape fit or fail alike."""

    pod_sets: tuple[PodSet, ...]
    min_available: int
    requires_isolation: bool
    tolerations: tuple[object, ...]
    no_spot: bool  # spot pools are not candidates

    @staticmethod
    def of(workload: Workload) -> GangShape:
        return GangShape(
            workload.pod_sets,
            workload.min_available,
            workload.requires_isolation,
            workload.tolerations,
            workload.spot == "never",
        )

    @property
    def one_pod(self) -> bool:
        """A gang of one pod (most of a real backlog): best fit is the tightest node of any pool."""
        return len(self.pod_sets) == 1 and self.pod_sets[0].replicas == 1


@dataclass(frozen=True)
class Plan:
    """A gang shape in one cluster: its candidate pools and the pools it can use at all."""

    cluster: Cluster
    pools: list[NodePool]  # candidate pools (isolation, taints), in the cluster's order
    relevant: tuple[str, ...]  # ids of candidate pools serving at least one of its pod sets
