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
into pools is the service layer's (`controlplane/service/node_pools.py`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from controlplane.domain.sharing import MIG_PROFILES, InvalidSharingMode, SharingMode
from controlplane.service.commands import TaintSpec
from controlplane.service.inventory import InventoryNode

GPU_RESOURCE = "nvidia.com/gpu"
SHARED_SUFFIX = ".shared"  # the device plugin's renameByDefault suffix
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"

# Label keys that name a node's pool, most specific first. The OKE key is an annotation.
POOL_LABEL_KEYS = (
    "eks.amazonaws.com/nodegroup",
    "karpenter.sh/nodepool",
    "kubernetes.azure.com/agentpool",
    "agentpool",
    "cloud.google.com/gke-nodepool",
)
OKE_POOL_ANNOTATION = "oci.oraclecloud.com/node-pool-id"

GFD_PRODUCT = "nvidia.com/gpu.product"
GFD_COUNT = "nvidia.com/gpu.count"
GFD_REPLICAS = "nvidia.com/gpu.replicas"
GFD_SHARING = "nvidia.com/gpu.sharing-strategy"
GFD_MIG_STRATEGY = "nvidia.com/mig.strategy"
MIG_CONFIG = "nvidia.com/mig.config"  # the GPU Operator's mig-manager profile, e.g. all-1g.10gb
GKE_ACCELERATOR = "cloud.google.com/gke-accelerator"
GKE_PARTITION = "cloud.google.com/gke-gpu-partition-size"
GKE_SHARING = "cloud.google.com/gke-gpu-sharing-strategy"
GKE_MAX_CLIENTS = "cloud.google.com/gke-max-shared-clients-per-gpu"
INSTANCE_TYPE_LABELS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")
# Karpenter (AWS) and EKS Auto Mode name the GPU of the instance when GFD does not run.
AWS_GPU_NAME_LABELS = ("karpenter.k8s.aws/instance-gpu-name", "eks.amazonaws.com/instance-gpu-name")
AWS_GPU_MEMORY_LABELS = ("karpenter.k8s.aws/instance-gpu-memory", "eks.amazonaws.com/instance-gpu-memory")
SPOT_LABELS = {
    "eks.amazonaws.com/capacityType": "SPOT",
    "karpenter.sh/capacity-type": "spot",
    "kubernetes.azure.com/scalesetpriority": "spot",
    "cloud.google.com/gke-spot": "true",
    "cloud.google.com/gke-preemptible": "true",
}
ZONE_LABEL = "topology.kubernetes.io/zone"

# GKE accelerator types (the `gke-accelerator` label) in gpufleet's model names.
GKE_ACCELERATORS = {
    "nvidia-tesla-t4": "T4",
    "nvidia-tesla-p4": "P4",
    "nvidia-tesla-p100": "P100-16GB",
    "nvidia-tesla-v100": "V100-16GB",
    "nvidia-l4": "L4",
    "nvidia-tesla-a100": "A100-40GB",
    "nvidia-a100-80gb": "A100-80GB",
    "nvidia-h100-80gb": "H100-80GB",
    "nvidia-h100-mega-80gb": "H100-80GB",
    "nvidia-h200-141gb": "H200-141GB",
    "nvidia-b200": "B200",
    "nvidia-gb200": "GB200",
    "nvidia-rtx-pro-6000": "RTX-PRO-6000",
}

# Taints that say something about one node's state, not about its pool.
_TRANSIENT_TAINT_PREFIXES = ("node.kubernetes.io/", "node.cloudprovider.kubernetes.io/", "karpenter.sh/disrupt")
_TRANSIENT_TAINTS = frozenset({"ToBeDeletedByClusterAutoscaler", "DeletionCandidateOfClusterAutoscaler"})

_SUFFIXES = {
    "n": Decimal(10) ** -9,
    "u": Decimal(10) ** -6,
    "m": Decimal(10) ** -3,
    "": Decimal(1),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}
# Kubernetes' quantity grammar: a signed decimal number, then a binary or decimal SI suffix or an exponent.
_QUANTITY = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))((?:[KMGTPE]i)|[numkMGTPE]|[eE][+-]?[0-9]+)?$")
_MIG_PROFILE = re.compile(r"[1-7]g\.[0-9]+gb")
_MIG_RESOURCE = re.compile(r"^nvidia\.com/mig-([1-7]g\.[0-9]+gb)(\.shared)?$")
_QUANTITY_MAX_CHARS = 64
ISSUE_MAX = 300


class BadQuantity(ValueError):
    pass


def parse_quantity(text: str) -> Decimal:
    """A Kubernetes resource quantity ("191450m", "2003307344Ki", "1.5Gi", "8", "1e3") as a Decimal."""
    value = str(text).strip()
    match = _QUANTITY.fullmatch(value) if len(value) <= _QUANTITY_MAX_CHARS else None
    if match is None:
        raise BadQuantity(f"{text!r} is not a Kubernetes quantity")
    number, suffix = match.group(1), match.group(2) or ""
    try:
        amount = Decimal(number)
        if suffix[:1] in ("e", "E"):
            exponent = int(suffix[1:])
            if abs(exponent) > 30:
                raise BadQuantity(f"{text!r}: exponent out of range")
            return amount.scaleb(exponent)
        return amount * _SUFFIXES[suffix]
    except (InvalidOperation, KeyError) as exc:
        raise BadQuantity(f"{text!r} is not a Kubernetes quantity") from exc


def quantity_units(name: str, text: str) -> int:
    """A quantity in gpufleet's integer unit for it: millicores for cpu, the base unit (bytes, devices)
    otherwise, rounded down (a node cannot hold a fraction of a device it advertises)."""
    amount = parse_quantity(text)
    if name == "cpu":
        amount *= 1000
    return max(0, math.floor(amount))


def quantities(raw: Mapping[str, Any]) -> tuple[dict[str, int], list[str]]:
    """Parsed quantities, and what could not be read."""
    parsed: dict[str, int] = {}
    bad: list[str] = []
    for name, text in sorted(raw.items())[:64]:
        try:
            parsed[str(name)[:253]] = quantity_units(str(name), str(text))
        except BadQuantity:
            bad.append(f"{name}={str(text)[:40]}")
    return parsed, bad


def gpu_model_name(product: str) -> str:
    """gpufleet's model name for a GFD product label (`NVIDIA-H100-80GB-HBM3` -> `H100-80GB`).

    Products gpufleet does not know keep their own (sanitised) name: a pool of them is planned like any
    other, its model just has no MIG table and no price defaults.
    """
    text = product.strip()
    upper = text.upper().removesuffix("-SHARED")
    upper = re.sub(r"-MIG-[0-9A-Z.+]+$", "", upper)
    tokens = set(re.split(r"[-_ ]", upper))

    def has(token: str) -> bool:
        return token in tokens

    if has("GB300"):
        return "GB300"
    if has("GB200"):
        return "GB200"
    if has("B300"):
        return "B300"
    if has("B200"):
        return "B200"
    if has("H200"):
        return "H200-141GB"
    if has("H100"):
        if has("NVL") or "94GB" in upper:
            return "H100-NVL-94GB"
        if "80GB" in upper or has("SXM5") or has("HBM3") or has("PCIE"):
            return "H100-80GB"
    if has("A100"):
        if "80GB" in upper:
            return "A100-80GB"
        if "40GB" in upper:
            return "A100-40GB"
    if has("V100"):
        return "V100-32GB" if "32GB" in upper else "V100-16GB"
    if has("P100"):
        return "P100-16GB"
    for simple in ("L40S", "L40", "L4", "A10G", "A10", "A30", "A40", "T4", "P4"):
        if has(simple):
            return simple
    if "RTX-PRO-6000" in upper:
        return "RTX-PRO-6000"
    sanitised = re.sub(r"[^A-Za-z0-9.-]+", "-", text).strip("-")[:40]
    return sanitised or "unknown-gpu"


def _aws_gpu_model(labels: Mapping[str, str]) -> str:
    """Karpenter / EKS Auto Mode name the GPU in lower case (`h100`, `a100`, `l40s`) and its memory in MiB."""
    name = next((labels[k] for k in AWS_GPU_NAME_LABELS if labels.get(k)), "")
    if not name:
        return ""
    memory = next((labels[k] for k in AWS_GPU_MEMORY_LABELS if labels.get(k)), "")
    gib = f"-{round(int(memory) / 1024)}GB" if memory.isdigit() else ""
    return gpu_model_name(f"{name}{gib}")


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


def _int_label(labels: Mapping[str, str], key: str) -> int | None:
    value = labels.get(key, "")
    return int(value) if value.isdigit() and len(value) <= 6 else None


def _mig_layout(model: str, counts: Mapping[str, int], config: str, issues: list[str]) -> tuple[str, int] | None:
    """(layout, physical GPUs) of a node whose MIG devices are `counts` (node totals per profile).

    The GPU Operator's `mig.config` names the layout when it is one gpufleet reads (`all-<profile>`,
    `all-balanced`); otherwise the per-GPU layout is the counts divided by their greatest common divisor,
    which is right whenever every GPU of the node is cut the same way (the only way the MIG manager cuts).
    """
    if not counts:
        return None
    if config:
        try:
            per_gpu = SharingMode.parse(f"mig:{config}").mig_slices_per_gpu(model)
        except InvalidSharingMode:
            per_gpu = {}
        if per_gpu and set(per_gpu) == set(counts):
            ratios = {counts[p] / per_gpu[p] for p in per_gpu}
            if len(ratios) == 1 and float(next(iter(ratios))).is_integer():
                return config, counts[next(iter(per_gpu))] // per_gpu[next(iter(per_gpu))]
    gpus = math.gcd(*counts.values())
    layout = "+".join(f"{p}*{n // gpus}" if n // gpus > 1 else p for p, n in sorted(counts.items()))
    try:
        SharingMode.parse(f"mig:{layout}").mig_slices_per_gpu(model)
    except InvalidSharingMode as exc:
        issues.append(f"MIG devices {dict(counts)} do not form a layout gpufleet reads: {exc}"[:ISSUE_MAX])
        return None
    return layout, gpus


def _per_gpu(model: str, profile: str) -> int | None:
    return MIG_PROFILES.get(model, {}).get(profile)


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
    gpu = _read_gpus(labels, allocatable, issues)
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


class _Gpus:
    """What the node's labels and advertised resources say about its GPUs."""

    def __init__(self) -> None:
        self.model = ""
        self.count = 0
        self.sharing = ""
        self.shares_per_container = 0
        self.resources: dict[str, str] = {}


def _read_gpus(labels: Mapping[str, str], allocatable: Mapping[str, int], issues: list[str]) -> _Gpus:
    gpus = _Gpus()
    if labels.get(GKE_ACCELERATOR):
        _read_gke(gpus, labels, allocatable, issues)
        return gpus
    product = labels.get(GFD_PRODUCT, "")
    gpus.model = gpu_model_name(product) if product else _aws_gpu_model(labels)
    whole = allocatable.get(GPU_RESOURCE, 0)
    shared = allocatable.get(GPU_RESOURCE + SHARED_SUFFIX, 0)
    mig = {m.group(1): n for name, n in allocatable.items() if (m := _MIG_RESOURCE.match(name)) and n > 0}
    mig_names = {m.group(1): name for name, n in allocatable.items() if (m := _MIG_RESOURCE.match(name)) and n > 0}
    if not (whole or shared or mig):
        if product or _int_label(labels, GFD_COUNT):
            issues.append("GPU labels but no GPU resource allocatable (device plugin not running?)")
        gpus.model = ""
        return gpus
    if not gpus.model:
        gpus.model = "unknown-gpu"
        issues.append("GPUs without a model label: install GPU Feature Discovery (nvidia.com/gpu.product)")
    strategy = labels.get(GFD_MIG_STRATEGY, "none")
    single_profile = re.search(r"-MIG-(" + _MIG_PROFILE.pattern + r")", product)
    if mig:
        if whole:
            issues.append("node has whole GPUs next to MIG devices; gpufleet plans its MIG devices only")
        layout = _mig_layout(gpus.model, mig, labels.get(MIG_CONFIG, ""), issues)
        if layout is not None:
            gpus.sharing, gpus.count = f"mig:{layout[0]}", layout[1]
            gpus.resources = {f"mig:{p}": mig_names[p] for p in sorted(mig)}
        return gpus
    if strategy == "single" and single_profile is not None:
        profile = single_profile.group(1)
        per_gpu = _per_gpu(gpus.model, profile)
        if per_gpu is None or whole % per_gpu:
            issues.append(f"MIG {profile} x{whole} on {gpus.model} does not fit gpufleet's MIG tables")
            return gpus
        gpus.sharing, gpus.count = f"mig:all-{profile}", whole // per_gpu
        gpus.resources = {f"mig:{profile}": GPU_RESOURCE}
        return gpus
    replicas = _int_label(labels, GFD_REPLICAS) or 1
    strategy_label = labels.get(GFD_SHARING, "")
    if replicas > 1 or strategy_label in ("time-slicing", "mps") or shared:
        kind = "mps" if strategy_label == "mps" else "timeslice"
        amount = shared or whole
        physical = _int_label(labels, GFD_COUNT) or (amount // replicas if replicas > 1 else 0)
        if replicas < 2 or physical < 1:
            issues.append(f"shared GPUs ({strategy_label or 'time-slicing'}) without a replica count above 1")
            return gpus
        gpus.sharing, gpus.count = f"{kind}:{replicas}", physical
        gpus.resources = {"share": GPU_RESOURCE + SHARED_SUFFIX if shared else GPU_RESOURCE}
        gpus.shares_per_container = 1 if kind == "mps" else 0  # the plugin refuses more on MPS
        if whole and shared:
            gpus.resources["gpu"] = GPU_RESOURCE  # renameByDefault leaves unshared GPUs as they were
        return gpus
    gpus.sharing, gpus.count = "exclusive", whole
    gpus.resources = {"gpu": GPU_RESOURCE}
    return gpus


def _read_gke(gpus: _Gpus, labels: Mapping[str, str], allocatable: Mapping[str, int], issues: list[str]) -> None:
    """GKE's device plugin advertises every GPU, MIG partition and shared slot as `nvidia.com/gpu`."""
    accelerator = labels[GKE_ACCELERATOR]
    product = labels.get(GFD_PRODUCT, "")
    gpus.model = GKE_ACCELERATORS.get(accelerator) or (gpu_model_name(product) if product else accelerator[:40])
    if accelerator not in GKE_ACCELERATORS and not product:
        issues.append(f"GKE accelerator {accelerator} is not in gpufleet's table; its name is kept as the model")
    advertised = allocatable.get(GPU_RESOURCE, 0)
    if advertised < 1:
        issues.append("GKE GPU node advertises no nvidia.com/gpu (driver not installed yet?)")
        gpus.model = ""
        return
    partition = labels.get(GKE_PARTITION, "")
    strategy = labels.get(GKE_SHARING, "").lower().replace("_", "-")
    clients = _int_label(labels, GKE_MAX_CLIENTS) or 0
    if partition:
        per_gpu = _per_gpu(gpus.model, partition)
        if per_gpu is None or advertised % per_gpu:
            issues.append(f"GKE partition {partition} x{advertised} on {gpus.model} does not fit gpufleet's MIG tables")
            return
        if strategy:
            issues.append("GKE GPU sharing on MIG partitions is planned as MIG partitions only")
        gpus.sharing, gpus.count = f"mig:all-{partition}", advertised // per_gpu
        gpus.resources = {f"mig:{partition}": GPU_RESOURCE}
        return
    if strategy:
        if clients < 2 or advertised % clients:
            issues.append(f"GKE {strategy} with {clients} clients per GPU cannot be read as shares of {advertised}")
            return
        kind = "mps" if strategy == "mps" else "timeslice"
        gpus.sharing, gpus.count = f"{kind}:{clients}", advertised // clients
        gpus.resources = {"share": GPU_RESOURCE}
        gpus.shares_per_container = 1  # GKE refuses more than one shared GPU per container
        return
    gpus.sharing, gpus.count = "exclusive", advertised
    gpus.resources = {"gpu": GPU_RESOURCE}


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
