"""What pods gpufleet did not place already request on each node (pure).

A node's `status.allocatable` is not what a gang can have: DaemonSet pods (the GPU Operator's device
plugin, dcgm-exporter, CNI, log shippers) and any other tenant's pods hold part of it. Planning a pool
with the bare allocatable admits gangs that the cluster's scheduler then leaves Pending. This module
sums the requests of every live pod bound to a node that does not carry gpufleet's run label, the way
kube-scheduler counts a pod (`resourcehelper.PodRequests` in kubernetes/component-helpers):

- app containers and sidecars (init containers with `restartPolicy: Always`) add up;
- a regular init container runs alone with the sidecars started before it, so the pod needs at least
  that much while it initialises: the request is the larger of the two;
- `spec.overhead` (RuntimeClass pod overhead) comes on top.

Quantities are rounded up: a request of 0.5 millicores holds 1.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from adapters.kubernetes.manifest_model import LABEL_RUN
from adapters.kubernetes.quantities import BadQuantity, parse_quantity

TERMINAL_PHASES = ("Succeeded", "Failed")
# What the inventory asks the API server for: every pod that still holds its node's resources.
LIVE_POD_FIELD_SELECTOR = "status.phase!=Succeeded,status.phase!=Failed"
MAX_RESOURCES = 64


def _requests(container: Mapping[str, Any]) -> dict[str, int]:
    resources = container.get("resources")
    requests = resources.get("requests") if isinstance(resources, Mapping) else None
    if not isinstance(requests, Mapping):
        return {}
    out: dict[str, int] = {}
    for name, text in list(requests.items())[:MAX_RESOURCES]:
        try:
            amount = parse_quantity(str(text)) * (1000 if name == "cpu" else 1)
        except BadQuantity:
            continue  # the API server validated it; a value we cannot read is left out, not fatal
        out[str(name)] = max(0, math.ceil(amount))
    return out


def _add(total: dict[str, int], more: Mapping[str, int]) -> None:
    for name, amount in more.items():
        total[name] = total.get(name, 0) + amount


def _containers(spec: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    items = spec.get(key)
    return [c for c in items if isinstance(c, Mapping)] if isinstance(items, list) else []


def pod_requests(pod: Mapping[str, Any]) -> dict[str, int]:
    """What kube-scheduler counts a pod as requesting, per resource (cpu in millicores)."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return {}
    total: dict[str, int] = {}
    for container in _containers(spec, "containers"):
        _add(total, _requests(container))
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for container in _containers(spec, "initContainers"):
        own = _requests(container)
        if container.get("restartPolicy") == "Always":  # a sidecar: runs beside the app containers
            _add(total, own)
            _add(sidecars, own)
            continue
        for name in set(own) | set(sidecars):
            init_peak[name] = max(init_peak.get(name, 0), own.get(name, 0) + sidecars.get(name, 0))
    for name, peak in init_peak.items():
        total[name] = max(total.get(name, 0), peak)
    overhead = spec.get("overhead")
    if isinstance(overhead, Mapping):
        _add(total, _requests({"resources": {"requests": overhead}}))
    return total


def reserved_by_node(pods: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """Per node name, the summed requests of the live pods bound to it that gpufleet did not place."""
    reserved: dict[str, dict[str, int]] = {}
    for pod in pods:
        spec, status, meta = pod.get("spec"), pod.get("status"), pod.get("metadata")
        node = spec.get("nodeName") if isinstance(spec, Mapping) else None
        if not isinstance(node, str) or not node:
            continue  # not bound: holds nothing yet
        if isinstance(status, Mapping) and status.get("phase") in TERMINAL_PHASES:
            continue
        labels = meta.get("labels") if isinstance(meta, Mapping) else None
        if isinstance(labels, Mapping) and LABEL_RUN in labels:
            continue  # gpufleet's own: already counted as a run's assignment
        _add(reserved.setdefault(node, {}), pod_requests(pod))
    return {node: dict(sorted(r.items())[:MAX_RESOURCES]) for node, r in reserved.items()}


# Resources that are GPUs or parts of one: whole GPUs and their shared replicas (`nvidia.com/gpu`,
# `nvidia.com/gpu.shared`, renamed time-slicing or MPS resources), MIG instances (`nvidia.com/mig-*`),
# and AMD's. A node may advertise more under its own names (`InventoryNode.gpu_resources`).
GPU_RESOURCE_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-", "amd.com/gpu")
# Owners whose pods belong on every node: DaemonSet pods (device plugin, dcgm-exporter, CNI, log
# shippers) and a node's static pods (mirror pods, owned by the Node).
NODE_OWNER_KINDS = frozenset({"DaemonSet", "Node"})
MAX_SAMPLE = 8


def _asks_for_gpu(pod: Mapping[str, Any], extra: frozenset[str]) -> bool:
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return False
    for key in ("containers", "initContainers"):
        for container in _containers(spec, key):
            resources = container.get("resources")
            if not isinstance(resources, Mapping):
                continue
            for part in ("requests", "limits"):
                asked = resources.get(part)
                if isinstance(asked, Mapping) and any(
                    str(name).startswith(GPU_RESOURCE_PREFIXES) or name in extra for name in asked
                ):
                    return True
    return False


def _owned_by_node(meta: Mapping[str, Any]) -> bool:
    owners = meta.get("ownerReferences")
    return isinstance(owners, list) and any(
        isinstance(o, Mapping) and o.get("kind") in NODE_OWNER_KINDS for o in owners
    )


def non_gpu_pods_by_node(
    pods: Iterable[Mapping[str, Any]], gpu_resources: Iterable[str] = ()
) -> dict[str, tuple[int, tuple[str, ...]]]:
    """Per node name: the live pods bound to it that gpufleet did not place, that ask for no GPU
    resource (requests or limits) and that no DaemonSet or Node owns; their count and up to 8
    `namespace/name`, sorted. Whether a node has GPUs is the caller's to know."""
    extra = frozenset(gpu_resources)
    names: dict[str, list[str]] = {}
    for pod in pods:
        spec, status, meta = pod.get("spec"), pod.get("status"), pod.get("metadata")
        node = spec.get("nodeName") if isinstance(spec, Mapping) else None
        if not isinstance(node, str) or not node or not isinstance(meta, Mapping):
            continue
        if isinstance(status, Mapping) and status.get("phase") in TERMINAL_PHASES:
            continue
        labels = meta.get("labels")
        if isinstance(labels, Mapping) and LABEL_RUN in labels:
            continue
        if _owned_by_node(meta) or _asks_for_gpu(pod, extra):
            continue
        names.setdefault(node, []).append(f"{meta.get('namespace') or 'default'}/{meta.get('name') or '?'}")
    return {node: (len(found), tuple(sorted(found)[:MAX_SAMPLE])) for node, found in names.items()}
