"""Real Node objects read into gpufleet's inventory vocabulary (pure: no I/O, no client library).

What a node is worth to gpufleet is spread over labels written by different parties:

- the pool it belongs to: the provider's node-pool label (EKS managed node groups
  `eks.amazonaws.com/nodegroup`, Karpenter `karpenter.sh/nodepool`, AKS
  `kubernetes.azure.com/agentpool` and the legacy `agentpool`, GKE `cloud.google.com/gke-nodepool`),
  OKE's annotation `oci.oraclecloud.com/node-pool-id`, or a label key the operator configures;
- its GPUs: GPU Feature Discovery (`nvidia.com/gpu.product`, `gpu.count`, `gpu.replicas`,
  `gpu.sharing-strategy`, `mig.strategy`, `mig.config`, `mig-<profile>.count`), or on GKE, whose own
  device plugin runs without GFD, `cloud.google.com/gke-accelerator`, `gke-gpu-partition-size`,
  `gke-gpu-sharing-strategy` and `gke-max-shared-clients-per-gpu`;
- what it can really hold: `status.allocatable` (capacity minus kubelet and system reservations),
  including the extended resources the device plugin advertises (`nvidia.com/gpu`,
  `nvidia.com/gpu.shared` with `renameByDefault`, `nvidia.com/mig-<profile>` under the mixed strategy).

`observe_node` turns one Node (a dict, as the API returns it) into an `InventoryNode`; grouping nodes
into pools is the service layer's (`controlplane/service/node_pools.py`). Reading the GPUs is
`node_gpus.py`'s, reading resource quantities `quantities.py`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from adapters.kubernetes.node_gpus import (
    AWS_GPU_MEMORY_LABELS,
    AWS_GPU_NAME_LABELS,
    GFD_COUNT,
    GFD_MIG_STRATEGY,
    GFD_PRODUCT,
    GFD_REPLICAS,
    GFD_SHARING,
    GKE_ACCELERATOR,
    GKE_MAX_CLIENTS,
    GKE_PARTITION,
    GKE_SHARING,
    ISSUE_MAX,
    MIG_CONFIG,
    read_gpus,
)
from adapters.kubernetes.quantities import quantities
from controlplane.service.commands import TaintSpec
from controlplane.service.inventory import InventoryNode

# Label keys that name a node's pool, most specific first. The OKE key is an annotation.
POOL_LABEL_KEYS = (
    "eks.amazonaws.com/nodegroup",
    "karpenter.sh/nodepool",
    "kubernetes.azure.com/agentpool",
    "agentpool",
    "cloud.google.com/gke-nodepool",
)
OKE_POOL_ANNOTATION = "oci.oraclecloud.com/node-pool-id"

INSTANCE_TYPE_LABELS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")
SPOT_LABELS = {
    "eks.amazonaws.com/capacityType": "SPOT",
    "karpenter.sh/capacity-type": "spot",
    "kubernetes.azure.com/scalesetpriority": "spot",
    "cloud.google.com/gke-spot": "true",
    "cloud.google.com/gke-preemptible": "true",
}
ZONE_LABEL = "topology.kubernetes.io/zone"


# Taints that say something about one node's state, not about its pool.
_TRANSIENT_TAINT_PREFIXES = ("node.kubernetes.io/", "node.cloudprovider.kubernetes.io/", "karpenter.sh/disrupt")
_TRANSIENT_TAINTS = frozenset({"ToBeDeletedByClusterAutoscaler", "DeletionCandidateOfClusterAutoscaler"})


def pool_key(
    labels: Mapping[str, str], annotations: Mapping[str, str], pool_label_key: str | None = None
) -> tuple[str, str]:
    """(key, value) naming the node's pool, or ("", "") when nothing names one."""
    keys = ((pool_label_key,) if pool_label_key else ()) + POOL_LABEL_KEYS
    for key in keys:
        if labels.get(key):
            return key, labels[key]
    if annotations.get(OKE_POOL_ANNOTATION):
        return OKE_POOL_ANNOTATION, annotations[OKE_POOL_ANNOTATION]
    return "", ""


def observe_node(node: Mapping[str, Any], pool_label_key: str | None = None) -> InventoryNode:
    """One Node (as the API returns it) in gpufleet's terms. Never raises on odd content: what cannot be
    read is said in `issues`, and a node whose GPUs cannot be read is reported without GPUs."""
    meta = _mapping(node.get("metadata"))
    spec = _mapping(node.get("spec"))
    status = _mapping(node.get("status"))
    labels: dict[str, str] = {str(k): str(v) for k, v in _mapping(meta.get("labels")).items()}
    annotations: dict[str, str] = {str(k): str(v) for k, v in _mapping(meta.get("annotations")).items()}
    issues: list[str] = []
    allocatable, bad = quantities(_mapping(status.get("allocatable")))
    capacity, bad_capacity = quantities(_mapping(status.get("capacity")))
    if bad or bad_capacity:
        issues.append(f"unreadable quantities: {', '.join(bad + bad_capacity)}"[:ISSUE_MAX])
    key, pool = pool_key(labels, annotations, pool_label_key)
    conditions = _list(status.get("conditions"))
    ready = any(isinstance(c, dict) and c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    product = labels.get(GFD_PRODUCT, "")
    gpu = read_gpus(labels, allocatable, issues)
    instance_type = next((labels[k] for k in INSTANCE_TYPE_LABELS if labels.get(k)), "")
    kept = {
        k: v[:63]
        for k, v in labels.items()
        if k == key
        or k in _KEPT_LABELS
        or (k.startswith("nvidia.com/mig-") and k.endswith(".count"))
        or k in AWS_GPU_NAME_LABELS
        or k in AWS_GPU_MEMORY_LABELS
    }
    return InventoryNode(
        name=str(meta.get("name", ""))[:253],
        pool=pool[:255],
        schedulable=not bool(spec.get("unschedulable", False)),
        ready=ready,
        gpu_product=product[:100],
        gpu_model=gpu.model[:40],
        gpu_count=min(gpu.count, 1024),
        sharing=gpu.sharing,
        shares_per_container=gpu.shares_per_container,
        gpu_resources=dict(gpu.resources),
        allocatable=allocatable,
        capacity=capacity,
        instance_type=instance_type[:80],
        spot=any(labels.get(k, "").lower() == v.lower() for k, v in SPOT_LABELS.items()),
        taints=_pool_taints(_list(spec.get("taints"))),
        labels=dict(sorted(kept.items())[:64]),
        annotations={k: v[:1024] for k, v in annotations.items() if k == OKE_POOL_ANNOTATION},
        issues=[i[:ISSUE_MAX] for i in issues][:8],
    )


_KEPT_LABELS = frozenset(
    {
        GFD_PRODUCT,
        GFD_COUNT,
        GFD_REPLICAS,
        GFD_SHARING,
        GFD_MIG_STRATEGY,
        MIG_CONFIG,
        GKE_ACCELERATOR,
        GKE_PARTITION,
        GKE_SHARING,
        GKE_MAX_CLIENTS,
        ZONE_LABEL,
        *INSTANCE_TYPE_LABELS,
        *SPOT_LABELS,
    }
)


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _pool_taints(raw: list[Any]) -> list[TaintSpec]:
    taints: list[TaintSpec] = []
    for t in raw:
        if not isinstance(t, dict):
            continue
        key = str(t.get("key") or "")
        if not key or key in _TRANSIENT_TAINTS or key.startswith(_TRANSIENT_TAINT_PREFIXES):
            continue
        effect = t.get("effect") or "NoSchedule"
        if effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            continue
        try:
            taints.append(TaintSpec.model_validate({"key": key, "value": str(t.get("value") or ""), "effect": effect}))
        except ValueError:  # a taint the API server would not have accepted: not one to plan with
            continue
    return taints[:32]
