"""GPU-equivalents: how much of a GPU a demand holds, in one place.

A whole GPU is 1, a MIG slice its compute sevenths (`mig_gpu_eq`), a time-slicing or MPS share
1 / the pool's replicas. Quota arithmetic is exact; scores use the floating-point twin.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction

from controlplane.domain.model import GPU_EQ, NodePool, PodAssignment, Workload
from controlplane.domain.sharing import mig_gpu_eq


def gpu_eq_of_demand(demand: Mapping[str, int], pool: NodePool) -> Fraction:
    """Exact gpu-eq of one pod's (or one node's) demand on a node of `pool`."""
    total = Fraction(demand.get("gpu", 0))
    if demand.get("share"):
        total += Fraction(demand["share"], pool.sharing.replicas)
    for key, count in demand.items():
        if key.startswith("mig:"):
            total += mig_gpu_eq(key[4:]) * count
    return total


def gpu_eq_float(demand: Mapping[str, int], pool: NodePool) -> float:
    """`gpu_eq_of_demand` in floating point, for scores (quota maths stays exact)."""
    total = float(demand.get("gpu", 0))
    shares = demand.get("share")
    if shares:
        total += shares / pool.sharing.replicas
    for key, count in demand.items():
        if key.startswith("mig:"):
            total += float(mig_gpu_eq(key[4:])) * count
    return total


def usage_of(assignments: tuple[PodAssignment, ...], pools_by_node: Mapping[str, NodePool]) -> dict[str, Fraction]:
    """GPU-equivalents (and per GPU model) that a set of pod assignments holds."""
    usage: dict[str, Fraction] = {}
    for assignment in assignments:
        pool = pools_by_node[assignment.node_id]
        amount = gpu_eq_of_demand(assignment.demand, pool)
        if amount:
            usage[GPU_EQ] = usage.get(GPU_EQ, Fraction(0)) + amount
            usage[pool.gpu_model] = usage.get(pool.gpu_model, Fraction(0)) + amount
    return usage


def least_gpu_eq(workload: Workload) -> Fraction:
    """The gpu-eq of the cheapest `min_available` pods: what the gang needs at the very least."""
    per_pod = sorted(ps.gpu_eq_per_pod() for ps in workload.pod_sets for _ in range(ps.replicas))
    return sum(per_pod[: workload.min_available], Fraction(0))
