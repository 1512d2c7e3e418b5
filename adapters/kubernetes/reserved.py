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
