"""The plain values of placement: free capacity, a placement, a miss, and the slot arithmetic."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from controlplane.domain.model import GPU, SHARE, Cluster, NodePool, PodAssignment, Workload

FreeCapacity = dict[str, dict[str, int]]  # node id -> dimension -> free amount


@dataclass(frozen=True)
class Placement:
    cluster_id: str
    assignments: tuple[PodAssignment, ...]
    leftover_gpu_slots: int  # free GPU slots left on the nodes it touched: lower packs tighter
    spread: bool = False  # over several pools although one pool alone could hold the gang


@dataclass(frozen=True)
class Miss:
    """Why a gang did not fit one cluster: how many of its pods the best attempt placed."""

    cluster_id: str
    placed: int
    detail: str


def gpu_slots(amounts: Mapping[str, int]) -> int:
    """GPU slots in a demand or a node's free capacity: whole GPUs, MIG slices and shares."""
    return sum(value for key, value in amounts.items() if is_slot(key))


def is_slot(key: str) -> bool:
    return key in (GPU, SHARE) or key.startswith("mig:")


def candidate_pools(workload: Workload, cluster: Cluster) -> list[NodePool]:
    """Pools of `cluster` this workload may use at all (isolation, taints, spot)."""
    pools = []
    for pool in cluster.pools:
        if workload.requires_isolation and not pool.sharing.isolated:
            continue
        if pool.spot and workload.spot == "never":
            continue
        if pool.untolerated_taints(workload.tolerations):
            continue
        pools.append(pool)
    return pools
