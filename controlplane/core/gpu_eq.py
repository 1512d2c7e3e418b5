"""GPU-equivalents (gpu-eq): how much of a GPU a demand holds, in one place.

A whole GPU is 1, a MIG slice its compute sevenths, a time-slicing or MPS share 1 / the pool's
replicas.

Quota arithmetic is exact and in integers: amounts are counted in units of 1/D GPU, where for one
snapshot D = lcm(7, the replica count of every pool, the denominator of every quota amount of the
queue tree). Then every demand holds a whole number of units (a MIG slice of k sevenths is
k*D/7, a share D/replicas), and so does every bound, so sums and comparisons are plain integer
arithmetic with no rounding anywhere. A fixed unit cannot promise that: 1/840 GPU covers
replicas 1-8, 10, 12, 14, 15, 20, ... but not 9, 11 or 16, and a quota of 0.001 gpu-eq needs a
factor 125. A typical fleet (MIG, time-slicing with 4 or 8 replicas, quotas with up to two
decimals) gets D = lcm(7, 8, 100) = 1400. Quota amounts arrive as floats from the API and the
database and are read as the fraction with the smallest denominator within 10^-6 of them (at most
10^6), the decimal people wrote; their numbers and text at the edges stay decimal.

A scheduler that keeps units across cycles recomputes D when a pool's replica count or a quota
amount changes (then every stored amount is rescaled by the same factor).

Scores and reports use the floating-point twin, `gpu_eq_float`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fractions import Fraction
from math import floor, lcm

from controlplane.domain.model import GPU_EQ, NodePool, PodAssignment, PodSet, QueueNode, Workload
from controlplane.domain.sharing import mig_compute_slices

Units = dict[str, int]  # gpu-eq and per GPU model, in units of 1/D GPU
MIG_SLICES_PER_GPU = 7


def exact_amount(value: float) -> Fraction:
    """A quota amount as the decimal it was written as (the simplest fraction within 10^-6)."""
    return Fraction(value).limit_denominator(10**6)


class GpuEqUnit:
    """The integer unit of one snapshot's quota arithmetic: `per_gpu` units make one GPU."""

    __slots__ = ("_per_pod", "_per_share", "_per_slice", "per_gpu")

    def __init__(self, per_gpu: int) -> None:
        if per_gpu < 1 or per_gpu % MIG_SLICES_PER_GPU:
            raise ValueError(f"a unit must keep MIG sevenths whole: {per_gpu} units per GPU")
        self.per_gpu = per_gpu
        self._per_slice = per_gpu // MIG_SLICES_PER_GPU
        self._per_share: dict[int, int] = {}
        self._per_pod: dict[PodSet, int] = {}  # a backlog repeats a few pod sets many times

    @staticmethod
    def for_fleet(pools: Iterable[NodePool], amounts: Iterable[float]) -> GpuEqUnit:
        """The unit that keeps every pool's shares and every one of `amounts` whole."""
        per_gpu = MIG_SLICES_PER_GPU
        for pool in pools:
            per_gpu = lcm(per_gpu, max(1, pool.sharing.replicas))
        for value in amounts:
            per_gpu = lcm(per_gpu, exact_amount(value).denominator)
        return GpuEqUnit(per_gpu)

    def of_demand(self, demand: Mapping[str, int], pool: NodePool) -> int:
        """Units one pod's (or one node's) demand holds on a node of `pool`."""
        total = demand.get("gpu", 0) * self.per_gpu
        shares = demand.get("share")
        if shares:
            replicas = max(1, pool.sharing.replicas)
            per_share = self._per_share.get(replicas)
            if per_share is None:
                if self.per_gpu % replicas:
                    raise ValueError(f"pool {pool.name}: {replicas} replicas do not divide {self.per_gpu} units")
                per_share = self._per_share[replicas] = self.per_gpu // replicas
            total += shares * per_share
        if len(demand) > 3 or "gpu" not in demand:  # MIG keys (the common whole-GPU pod has none)
            for key, count in demand.items():
                if key.startswith("mig:"):
                    total += count * mig_compute_slices(key[4:]) * self._per_slice
        return total

    def usage(self, assignments: Iterable[PodAssignment], pool_of_node: Mapping[str, NodePool]) -> Units:
        """Units a set of pod assignments holds, model-agnostic (`gpu-eq`) and per GPU model."""
        usage: Units = {}
        for assignment in assignments:
            pool = pool_of_node[assignment.node_id]
            amount = self.of_demand(assignment.demand, pool)
            if amount:
                usage[GPU_EQ] = usage.get(GPU_EQ, 0) + amount
                usage[pool.gpu_model] = usage.get(pool.gpu_model, 0) + amount
        return usage

    def of_amount(self, value: float) -> int:
        """A quota amount in units: exact, since D is a multiple of its denominator."""
        scaled = exact_amount(value) * self.per_gpu
        if scaled.denominator != 1:
            raise ValueError(f"quota amount {value!r} is not a whole number of 1/{self.per_gpu} GPU")
        return scaled.numerator

    def least(self, workload: Workload) -> int:
        """A lower bound, in units, of what the gang's cheapest `min_available` pods hold anywhere.

        A fractional pod holds at least its fraction (it gets whole shares of it); the fraction is
        rounded down to a unit, so the bound stays a bound."""
        per_pod: list[int] = []
        for pod_set in workload.pod_sets:
            units = self._per_pod.get(pod_set)
            if units is None:
                units = self._per_pod[pod_set] = floor(pod_set.gpu_eq_per_pod() * self.per_gpu)
            per_pod.extend([units] * pod_set.replicas)
        per_pod.sort()
        return sum(per_pod[: workload.min_available])

    def gpus(self, units: int) -> float:
        """Units as GPUs, for people and reasons."""
        return units / self.per_gpu


def quota_amounts(tree: Mapping[str, QueueNode]) -> list[float]:
    """Every quota amount of the queue tree (they must be finite: see `schedule`'s quarantine)."""
    return [
        value
        for node in tree.values()
        for quota in (node.guaranteed, node.limit, node.borrowing_limit, node.lending_limit)
        for value in quota.amounts.values()
    ]


def gpu_eq_float(demand: Mapping[str, int], pool: NodePool) -> float:
    """gpu-eq of one pod's demand on a node of `pool` in floating point, for scores and reports."""
    return gpu_eq_with_replicas(demand, pool.sharing.replicas)


def gpu_eq_with_replicas(demand: Mapping[str, int], replicas: int) -> float:
    """`gpu_eq_float` for a pool known only by its replica count (the report reads pool rows)."""
    total = float(demand.get("gpu", 0))
    shares = demand.get("share")
    if shares:
        total += shares / max(1, replicas)
    for key, count in demand.items():
        if key.startswith("mig:"):
            total += mig_compute_slices(key[4:]) * count / MIG_SLICES_PER_GPU
    return total


def held_gpu_eq(assignments: Iterable[PodAssignment], pool_of_node: Mapping[str, NodePool]) -> float:
    """Model-agnostic gpu-eq a set of pod assignments holds, in floating point (history, reports)."""
    return sum(gpu_eq_float(a.demand, pool_of_node[a.node_id]) for a in assignments)
