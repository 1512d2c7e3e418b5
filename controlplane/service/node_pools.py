"""Pools made from the nodes a cluster reports, joined with what only the cloud knows (pure).

A pool is the set of GPU nodes that share a pool key (`InventoryNode.pool`). Its capacity is what
every one of its nodes can hold: the smallest allocatable CPU and memory less what pods gpufleet did
not place request there (DaemonSets, other tenants), not the instance type's totals. A node where such
pods hold GPUs takes no new work. Its GPUs, sharing and resource names are what its nodes say; when they disagree (a MIG
reconfiguration rolling through the pool, a node with a different driver config) the pool is planned
as most of its nodes are, the others are held back from new work, and the pool carries an issue that
says so. Cloud discovery adds what nodes cannot tell: bounds, instance type, scaling, and pools that
have no node right now (scaled to zero).
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from controlplane.service.cloud_ports import DiscoveredPool, UnmappablePool, to_pool_spec
from controlplane.service.cloud_state import SyncedPool
from controlplane.service.cluster_specs import PoolSpec
from controlplane.service.inventory_node import InventoryNode

MIB = 1024 * 1024
CLOUD_ISSUE = "cloud: "  # prefix of the issues fleet sync (cloud discovery) finds, kept between node syncs
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SHOWN = 5


@dataclass(frozen=True)
class NodePlan:
    pools: tuple[SyncedPool, ...]
    issues: tuple[str, ...]
    held_back: frozenset[str]  # nodes that disagree with their pool: present, but take no new work


def pool_name(key: str) -> str:
    """A gpufleet pool name (DNS label, 63 at most) for a pool key; stable, and unchanged when it is one."""
    if len(key) <= 63 and _NAME.fullmatch(key):
        return key
    digest = hashlib.sha256(key.encode()).hexdigest()[:8]
    if key.startswith("ocid1."):  # an OKE node pool OCID with no discovered name (yet)
        tail = re.sub(r"[^a-z0-9]", "", key.rsplit(".", 1)[-1].lower())[-10:]
        return f"np-{tail}-{digest}"
    cleaned = re.sub(r"[^a-z0-9-]+", "-", key.lower()).strip("-")[:54].strip("-")
    return f"{cleaned}-{digest}" if cleaned else f"pool-{digest}"


def _shown(names: Sequence[str]) -> str:
    names = sorted(names)
    more = f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
    return ", ".join(names[:_SHOWN]) + more


def _signature(node: InventoryNode) -> tuple[str, int, str, tuple[tuple[str, str], ...], int]:
    return (
        node.gpu_model,
        node.gpu_count,
        node.sharing or "exclusive",
        tuple(sorted(node.gpu_resources.items())),
        node.shares_per_container,
    )


def _describe(signature: tuple[str, int, str, tuple[tuple[str, str], ...], int]) -> str:
    model, count, sharing, _, _ = signature
    return f"{count} x {model} {sharing}"


def _cloud_index(cloud: Sequence[DiscoveredPool]) -> dict[str, DiscoveredPool]:
    index: dict[str, DiscoveredPool] = {}
    for found in cloud:
        index[found.name] = found
        if found.pool_id:
            index[found.pool_id] = found
    return index


def plan_node_pools(
    nodes: Sequence[InventoryNode],
    cloud: Sequence[DiscoveredPool] = (),
    prices: Mapping[str, float] | None = None,
    *,
    one_share_per_container: bool = False,
) -> NodePlan:
    """The pools `nodes` form, joined by pool name or id with the `cloud`'s pools.

    `one_share_per_container` is the cluster's setting for time-slicing configured with
    `failRequestsGreaterThanOne` (nodes cannot tell it). A cloud pool no node belongs to becomes a pool
    without nodes when the cloud's description maps; GPU nodes without a pool key are grouped by model.
    """
    prices = prices or {}
    index = _cloud_index(cloud)
    groups: dict[str, list[InventoryNode]] = {}
    unkeyed: list[str] = []
    for node in nodes:
        if not node.has_gpus or not node.gpu_model:
            continue
        key = node.pool
        if not key:
            key = node.gpu_model.lower()
            unkeyed.append(node.name)
        groups.setdefault(key, []).append(node)
    issues: list[str] = []
    if unkeyed:
        issues.append(
            f"nodes {_shown(unkeyed)} carry no pool label; grouped by GPU model "
            "(set kubernetes.pool_label_key to the label that names their pool)"
        )
    pools: list[SyncedPool] = []
    held: set[str] = set()
    joined: set[str] = set()
    for key in sorted(groups):
        found = index.get(key)
        if found is not None:
            joined.add(found.name)
        synced, pool_issues, pool_held = _pool_from_nodes(key, groups[key], found, prices, one_share_per_container)
        issues.extend(pool_issues)
        held |= pool_held
        if synced is not None:
            pools.append(synced)
    for found in cloud:
        if found.name in joined:
            continue
        try:
            spec = to_pool_spec(found)
        except UnmappablePool as exc:
            if found.gpus_per_node > 0 or found.gpu_model or found.issues:
                issues.append(f"{CLOUD_ISSUE}{exc}")  # a GPU pool we cannot use is worth telling
            continue
        if found.name in prices:
            spec = spec.model_copy(update={"price_per_gpu_hour": prices[found.name]})
        pools.append(
            SyncedPool(spec, found.min_size, found.max_size, found.instance_type, found.pool_id, node_names=())
        )
    return NodePlan(tuple(pools), tuple(issues), frozenset(held))


def _pool_from_nodes(
    key: str,
    members: list[InventoryNode],
    found: DiscoveredPool | None,
    prices: Mapping[str, float],
    one_share_per_container: bool,
) -> tuple[SyncedPool | None, list[str], set[str]]:
    name = found.name if found is not None else pool_name(key)
    issues: list[str] = []
    counts = Counter(_signature(n) for n in members)
    # Most nodes win; a tie goes to the signature that sorts first, so the choice is stable.
    chosen = min(counts, key=lambda s: (-counts[s], s))
    agreeing = [n for n in members if _signature(n) == chosen]
    others = [n for n in members if _signature(n) != chosen]
    if others:
        kinds = sorted({_describe(_signature(n)) for n in others})
        issues.append(
            f"pool {name}: nodes disagree; planned as {_describe(chosen)} like {len(agreeing)} of its nodes, "
            f"{_shown([n.name for n in others])} ({'; '.join(kinds)}) take no new work until they agree"
        )
    for node in members:
        for issue in node.issues[:2]:
            issues.append(f"pool {name}: node {node.name}: {issue}")
    model, gpus, sharing, resources, shares_per_container = chosen
    # A node whose GPUs are partly held by pods gpufleet did not place cannot take a gang's whole node.
    occupied = {n.name: held for n in agreeing if (held := _foreign_gpus(n, dict(resources)))}
    if occupied:
        issues.append(
            f"pool {name}: pods gpufleet did not place hold GPUs on {_shown(list(occupied))} "
            f"({'; '.join(f'{n}: {occupied[n]}' for n in sorted(occupied)[:_SHOWN])}); they take no new work"
        )
    cpu = [_available(n, "cpu") for n in agreeing if "cpu" in n.allocatable]
    memory = [_available(n, "memory") // MIB for n in agreeing if "memory" in n.allocatable]
    if not cpu or not memory:
        issues.append(f"pool {name}: nodes report no allocatable cpu or memory")
        return None, issues, set()
    if model == "unknown-gpu" and found is not None and found.gpu_model:
        model = found.gpu_model
    if found is not None and found.issues:
        issues.extend(f"{CLOUD_ISSUE}pool {name}: {i}" for i in found.issues)
    if found is not None and not found.gpu_model:
        issues.append(
            f"{CLOUD_ISSUE}pool {name}: instance type {found.instance_type or 'unknown'} is not in gpufleet's "
            "tables; the pool is built from its nodes"
        )
    taints: dict[tuple[str, str, str], dict[str, str]] = {}
    for node in agreeing:
        for t in node.taints:
            taints[(t.key, t.value, t.effect)] = {"key": t.key, "value": t.value, "effect": t.effect}
    for c in found.taints if found is not None else ():
        taints.setdefault((c.key, c.value, c.effect), {"key": c.key, "value": c.value, "effect": c.effect})
    zones = {n.labels.get("topology.kubernetes.io/zone", "") for n in agreeing}
    labels = {"topology.kubernetes.io/zone": zones.pop()} if len(zones) == 1 and "" not in zones else {}
    try:
        spec = PoolSpec.model_validate(
            {
                "name": name,
                "gpu_model": model,
                "gpus_per_node": gpus,
                "cpu_millis": min(cpu),
                "memory_mib": min(memory),
                "sharing": sharing,
                "taints": list(taints.values())[:32],
                "labels": labels,
                "price_per_gpu_hour": prices.get(name, 0.0),
                "spot": any(n.spot for n in agreeing) or (found is not None and found.spot),
                "node_count": found.node_count if found is not None else len(members),
            }
        )
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        first = str(exc).splitlines()
        issues.append(f"pool {name}: its nodes do not make a gpufleet pool: {' '.join(first[:3])}"[:500])
        return None, issues, set()
    if one_share_per_container and spec.sharing.startswith("timeslice:"):
        shares_per_container = 1
    instance_types = {n.instance_type for n in agreeing if n.instance_type}
    instance_type = found.instance_type if found is not None else ",".join(sorted(instance_types))[:80]
    pool_id = found.pool_id if found is not None else (key if key.startswith("ocid1.") else "")
    min_size, max_size = (found.min_size, found.max_size) if found is not None else (len(members), len(members))
    synced = SyncedPool(
        spec=spec,
        min_size=min_size,
        max_size=max_size,
        instance_type=instance_type,
        cloud_pool_id=pool_id,
        node_names=tuple(sorted(n.name for n in members)),
        resource_names=dict(resources),
        max_shares_per_pod=shares_per_container,
    )
    return synced, issues, {n.name for n in others} | set(occupied)


def _available(node: InventoryNode, resource: str) -> int:
    """What gangs can have of a node: its allocatable less what other pods request there."""
    return max(0, node.allocatable[resource] - (node.reserved or {}).get(resource, 0))


def _foreign_gpus(node: InventoryNode, resources: Mapping[str, str]) -> str:
    """The GPU resources other pods request on `node` ("2 nvidia.com/gpu"), or "" when none."""
    held = [(n, r) for r in sorted(set(resources.values())) if (n := (node.reserved or {}).get(r, 0)) > 0]
    return ", ".join(f"{n} {r}" for n, r in held)
