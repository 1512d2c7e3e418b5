"""A node's GPUs read from its labels and advertised resources: model, count, sharing mode, MIG layout.

Pure. GPU Feature Discovery and the NVIDIA device plugin label and advertise GPUs one way, GKE's own
device plugin another (everything is `nvidia.com/gpu`, the partition and sharing are labels), and
Karpenter / EKS Auto Mode name the GPU when GFD does not run. `read_gpus` reads whichever is there;
what it cannot read it says in the issues list it is given.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from controlplane.domain.resource_names import GPU_RESOURCE
from controlplane.domain.sharing import MIG_PROFILES, InvalidSharingMode, SharingMode

SHARED_SUFFIX = ".shared"  # the device plugin's renameByDefault suffix
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"

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
# Karpenter (AWS) and EKS Auto Mode name the GPU of the instance when GFD does not run.
AWS_GPU_NAME_LABELS = ("karpenter.k8s.aws/instance-gpu-name", "eks.amazonaws.com/instance-gpu-name")
AWS_GPU_MEMORY_LABELS = ("karpenter.k8s.aws/instance-gpu-memory", "eks.amazonaws.com/instance-gpu-memory")

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

_MIG_PROFILE = re.compile(r"[1-7]g\.[0-9]+gb")
_MIG_RESOURCE = re.compile(r"^nvidia\.com/mig-([1-7]g\.[0-9]+gb)(\.shared)?$")
ISSUE_MAX = 300


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


class _Gpus:
    """What the node's labels and advertised resources say about its GPUs."""

    def __init__(self) -> None:
        self.model = ""
        self.count = 0
        self.sharing = ""
        self.shares_per_container = 0
        self.resources: dict[str, str] = {}


def read_gpus(labels: Mapping[str, str], allocatable: Mapping[str, int], issues: list[str]) -> _Gpus:
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
