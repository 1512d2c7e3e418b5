"""How a run's pods become Job units: placement groups (the pods of one pod set on one node) and,
under Kueue, their folding into at most `kueue_max_pod_sets` pod sets.

The design is explained in `manifests`; this module holds the grouping it rests on."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from adapters.kubernetes.manifest_model import (
    JobUnit,
    ManifestError,
    PlacementGroup,
    PodSetSpread,
)
from controlplane.domain.model import NodePool
from controlplane.service.ports import PodOrder


def placement_groups(pods: Sequence[PodOrder]) -> tuple[PlacementGroup, ...]:
    """Pods grouped by (pod set, node, pool, demand), in a deterministic order."""
    if not pods:
        raise ManifestError("the order has no pods")
    seen: set[tuple[str, int]] = set()
    set_order: list[str] = []
    buckets: dict[tuple[str, str, str, tuple[tuple[str, int], ...]], list[int]] = {}
    for pod in sorted(pods, key=lambda p: (p.pod_set, p.index)):
        if (pod.pod_set, pod.index) in seen:
            raise ManifestError(f"pod {pod.pod_set}-{pod.index} appears twice in the order")
        seen.add((pod.pod_set, pod.index))
        if pod.pod_set not in set_order:
            set_order.append(pod.pod_set)
        key = (pod.pod_set, pod.node, pod.pool, tuple(sorted(pod.demand.items())))
        buckets.setdefault(key, []).append(pod.index)
    groups: list[PlacementGroup] = []
    for pod_set in set_order:
        keyed = sorted(((k, v) for k, v in buckets.items() if k[0] == pod_set), key=lambda kv: kv[1][0])
        for ordinal, ((_, node, pool, demand), indices) in enumerate(keyed):
            groups.append(PlacementGroup(pod_set, ordinal, node, pool, dict(demand), tuple(indices)))
    return tuple(groups)


def kueue_units(
    groups: Sequence[PlacementGroup], max_pod_sets: int, pools: Mapping[str, NodePool]
) -> tuple[JobUnit, ...]:
    """Placement groups as at most `max_pod_sets` replicatedJobs, or ManifestError saying why not.

    Pod sets with the most groups are folded first (fewest folds); only a pod set with exactly one
    pod on each of its nodes, all of one demand, can be folded without losing the core's packing.
    """
    by_set: dict[str, list[PlacementGroup]] = {}
    for group in groups:
        by_set.setdefault(group.pod_set, []).append(group)
    if len(by_set) > max_pod_sets:
        raise ManifestError(
            f"the gang has {len(by_set)} pod sets; Kueue admits at most {max_pod_sets} pod sets per workload "
            "(kueue_max_pod_sets)"
        )
    folded: set[str] = set()
    total = len(groups)
    for pod_set, members in sorted(by_set.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        if total <= max_pod_sets:
            break
        if len(members) > 1 and _foldable(members):
            folded.add(pod_set)
            total -= len(members) - 1
    if total > max_pod_sets:
        packed = sorted(p for p, members in by_set.items() if p not in folded and len(members) > 1)
        raise ManifestError(
            f"the placement needs {total} Kueue pod sets (one per pod set and node group) but Kueue admits at most "
            f"{max_pod_sets} per workload (kueue_max_pod_sets); pod sets {', '.join(packed)} put different "
            "numbers of pods on their nodes, which one replicatedJob per pod set cannot pin"
        )
    units: list[JobUnit] = []
    for pod_set, members in by_set.items():
        if pod_set not in folded:
            units.extend(members)
            continue
        ordered = sorted(members, key=lambda g: g.indices[0])
        node_pools = tuple(dict.fromkeys(g.pool for g in ordered))
        if len({_pod_shape(pools.get(p)) for p in node_pools}) > 1:
            raise ManifestError(f"pod set {pod_set} spans pools that need different pod specs; it cannot be folded")
        units.append(
            PodSetSpread(
                pod_set=pod_set,
                nodes=tuple(g.node for g in ordered),
                per_node=len(ordered[0].indices),
                pool=ordered[0].pool,
                pools=node_pools,
                demand=ordered[0].demand,
                indices=tuple(i for g in ordered for i in g.indices),
            )
        )
    return tuple(units)


def _foldable(members: Sequence[PlacementGroup]) -> bool:
    """The same number of pods of the same demand on each node, every node once."""
    first = members[0]
    return all(len(g.indices) == len(first.indices) and g.demand == first.demand for g in members) and len(
        {g.node for g in members}
    ) == len(members)


def _pod_shape(pool: NodePool | None) -> tuple[object, ...] | None:
    """What of a pool shapes a pod spec: its taints (tolerations) and sharing (resource names)."""
    if pool is None:
        return None
    return (tuple(sorted((t.key, t.value, t.effect) for t in pool.taints)), pool.sharing)
