"""Node objects as real GPU clusters report them, per provider flavour, for the fake API server.

Where each label comes from (names and value formats taken from the upstream sources):

- GPU Feature Discovery / GPU Operator: NVIDIA/k8s-device-plugin `internal/lm` (GFD lives there):
  `resource.go` baseLabeler -> `<resource>.product|count|replicas|sharing-strategy` where
  `<resource>` is `nvidia.com/gpu` or, under the MIG `mixed` strategy, `nvidia.com/mig-<profile>`;
  the product is the sanitised device name (spaces -> '-') with `-MIG-<profile>` for MIG devices and
  `-SHARED` appended when the resource is replicated (time-slicing/MPS) and NOT renamed (with
  `renameByDefault` the advertised resource becomes `nvidia.com/gpu.shared` and the product keeps
  its plain name); replicas 0 when sharing is disabled for the resource (MIG parents), else the
  configured replicas; sharing-strategy `none` | `time-slicing` | `mps`. `<resource>.memory` (MiB),
  `.family` (getArchFamily: ampere, ada-lovelace, hopper, blackwell...), `.compute.major|minor`;
  MIG devices add their attributes (`.memory`, `.multiprocessors`, `.slices.gi|ci`, `.engines.*`).
  `nvml.go`: `nvidia.com/cuda.driver.major|minor|rev`, `cuda.driver-version.*`, `cuda.runtime.*`,
  `nvidia.com/mig.capable`, `nvidia.com/mps.capable`, `nvidia.com/gpu.mode`; `mig-strategy.go`:
  `nvidia.com/mig.strategy` (single | mixed); `machine-type.go`: `nvidia.com/gpu.machine`;
  `timestamp.go`: `nvidia.com/gfd.timestamp`. GPU Operator: `nvidia.com/gpu.present=true`;
  MIG manager: `nvidia.com/mig.config` (e.g. `all-1g.10gb`) and `nvidia.com/mig.config.state`.
- EKS managed node groups: `eks.amazonaws.com/nodegroup`, `eks.amazonaws.com/capacityType`
  (ON_DEMAND | SPOT), `eks.amazonaws.com/nodegroup-image`, node names `ip-<a>-<b>-<c>-<d>.<region>.compute.internal`,
  providerID `aws:///<zone>/<instance-id>`. Karpenter: `karpenter.sh/nodepool`,
  `karpenter.sh/capacity-type` (on-demand | spot), `karpenter.sh/registered|initialized`,
  `karpenter.k8s.aws/instance-family|instance-gpu-name|instance-gpu-count|instance-gpu-manufacturer|instance-gpu-memory`.
- AKS: `kubernetes.azure.com/agentpool` and the legacy `agentpool`, `kubernetes.azure.com/mode`,
  `kubernetes.azure.com/cluster`, `kubernetes.azure.com/accelerator=nvidia`; spot pools carry
  `kubernetes.azure.com/scalesetpriority=spot` as label and NoSchedule taint; GPU pools commonly
  taint `sku=gpu:NoSchedule`; names `aks-<pool>-<8 digits>-vmss<6 base-36>`.
- GKE: `cloud.google.com/gke-nodepool`, `cloud.google.com/gke-accelerator` (e.g. nvidia-h100-80gb),
  `cloud.google.com/gke-gpu=true`, `cloud.google.com/gke-gpu-sharing-strategy` (time-sharing | mps),
  `cloud.google.com/gke-max-shared-clients-per-gpu`, `cloud.google.com/gke-gpu-partition-size`
  (MIG profile), `cloud.google.com/gke-spot`, `cloud.google.com/machine-family`; GPU nodes are
  tainted `nvidia.com/gpu=present:NoSchedule`; GKE's own device plugin advertises `nvidia.com/gpu`
  for whole GPUs, MIG partitions and time-shared/MPS GPUs alike (GFD labels only with the GPU Operator).
- OKE (Oracle docs "Supported Labels for Different Usecases"): `topology.kubernetes.io/zone` (the
  availability domain, e.g. US-ASHBURN-AD-1), `oci.oraclecloud.com/fault-domain` (FAULT-DOMAIN-1),
  `node.kubernetes.io/instance-type` with the shape (BM.GPU.H100.8); the node pool is the
  annotation `oci.oraclecloud.com/node-pool-id` (an OCID), not a label; node names are private IPs.

Allocatable is capacity minus the kubelet's reservations as each provider computes them (CPU:
6% of the first core, 1% of the second, 0.5% of the next two, 0.25% above four; memory per the
provider's table or formula) minus the 100Mi hard eviction threshold. The MIG attribute values are
representative (A100/H100), not per-SKU exact.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

Sharing = Literal["none", "time-slicing", "mps", "mig"]


@dataclass(frozen=True)
class GpuModel:
    product: str  # nvidia.com/gpu.product as GFD sanitises the NVML name
    memory_mib: int
    compute: tuple[int, int]
    sms_per_slice: int = 14


GPU_MODELS: dict[str, GpuModel] = {
    "H100-80GB": GpuModel("NVIDIA-H100-80GB-HBM3", 81559, (9, 0), 16),
    "H200": GpuModel("NVIDIA-H200", 143771, (9, 0), 16),
    "B200": GpuModel("NVIDIA-B200", 183359, (10, 0), 18),
    "A100-80GB": GpuModel("NVIDIA-A100-SXM4-80GB", 81920, (8, 0)),
    "A100-40GB": GpuModel("NVIDIA-A100-SXM4-40GB", 40960, (8, 0)),
    "A10G": GpuModel("NVIDIA-A10G", 23028, (8, 6)),
    "A10": GpuModel("NVIDIA-A10", 23028, (8, 6)),
    "L4": GpuModel("NVIDIA-L4", 23034, (8, 9)),
    "T4": GpuModel("Tesla-T4", 15360, (7, 5)),
}

# MIG profile -> (compute slices, memory MiB of one instance); per-GPU counts come from the layout.
MIG_PROFILES: dict[str, tuple[int, int]] = {
    "1g.5gb": (1, 4864),
    "1g.10gb": (1, 9728),
    "1g.20gb": (1, 19968),
    "2g.10gb": (2, 9728),
    "2g.20gb": (2, 19968),
    "3g.20gb": (3, 19968),
    "3g.40gb": (3, 40192),
    "4g.20gb": (4, 19968),
    "4g.40gb": (4, 40192),
    "7g.40gb": (7, 40192),
    "7g.80gb": (7, 80896),
}


def arch_family(major: int, minor: int) -> str:
    """getArchFamily in k8s-device-plugin internal/lm/resource.go."""
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ampere" if minor < 9 else "ada-lovelace"
    return {
        1: "tesla",
        2: "fermi",
        3: "kepler",
        5: "maxwell",
        6: "pascal",
        9: "hopper",
        10: "blackwell",
        12: "blackwell",
        13: "rubin",
    }.get(major, "undefined")


@dataclass(frozen=True)
class GpuSetup:
    """The GPUs of a node and how the device plugin shares them."""

    model: str = "H100-80GB"
    count: int = 8
    sharing: Sharing = "none"
    replicas: int = 1  # time-slicing / MPS replicas per GPU
    rename_by_default: bool = False  # device plugin `renameByDefault`: nvidia.com/gpu.shared
    mig_strategy: Literal["mixed", "single"] = "mixed"
    mig_layout: dict[str, int] = field(default_factory=dict)  # profile -> instances per GPU
    mig_config: str | None = None  # nvidia.com/mig.config as the MIG manager labels it
    gfd: bool = True  # GPU Operator / GFD installed (GKE's managed driver stack has none)
    driver: tuple[int, int, int] = (570, 133, 20)
    cuda: tuple[int, int] = (12, 8)

    @property
    def info(self) -> GpuModel:
        return GPU_MODELS[self.model]

    def resources(self, *, gke: bool = False) -> dict[str, int]:
        """What the device plugin advertises (capacity == allocatable)."""
        if self.sharing == "mig":
            total = {p: n * self.count for p, n in self.mig_layout.items()}
            if gke or self.mig_strategy == "single":
                return {"nvidia.com/gpu": sum(total.values())}
            return {f"nvidia.com/mig-{p}": n for p, n in total.items()}
        if self.sharing in ("time-slicing", "mps"):
            name = "nvidia.com/gpu.shared" if self.rename_by_default and not gke else "nvidia.com/gpu"
            return {name: self.count * self.replicas}
        return {"nvidia.com/gpu": self.count}

    def labels(self, machine: str) -> dict[str, str]:
        """GFD + GPU Operator labels (empty without GFD)."""
        if not self.gfd:
            return {}
        info = self.info
        major, minor, rev = self.driver
        labels = {
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.machine": machine,
            "nvidia.com/gpu.mode": "compute",
            "nvidia.com/cuda.driver.major": str(major),
            "nvidia.com/cuda.driver.minor": str(minor),
            "nvidia.com/cuda.driver.rev": str(rev),
            "nvidia.com/cuda.driver-version.major": str(major),
            "nvidia.com/cuda.driver-version.minor": str(minor),
            "nvidia.com/cuda.driver-version.revision": str(rev),
            "nvidia.com/cuda.driver-version.full": f"{major}.{minor}.{rev}",
            "nvidia.com/cuda.runtime.major": str(self.cuda[0]),
            "nvidia.com/cuda.runtime.minor": str(self.cuda[1]),
            "nvidia.com/cuda.runtime-version.major": str(self.cuda[0]),
            "nvidia.com/cuda.runtime-version.minor": str(self.cuda[1]),
            "nvidia.com/cuda.runtime-version.full": f"{self.cuda[0]}.{self.cuda[1]}",
            "nvidia.com/mig.capable": str(self.model.startswith(("A100", "H100", "H200", "B200"))).lower(),
            "nvidia.com/mps.capable": str(self.sharing == "mps").lower(),
            "nvidia.com/gfd.timestamp": "1767225600",
        }
        full = "nvidia.com/gpu"
        arch = {
            f"{full}.family": arch_family(*info.compute),
            f"{full}.compute.major": str(info.compute[0]),
            f"{full}.compute.minor": str(info.compute[1]),
        }
        if self.sharing == "mig":
            labels["nvidia.com/mig.strategy"] = self.mig_strategy
            labels["nvidia.com/mig.config"] = self.mig_config or "all-" + next(iter(self.mig_layout))
            labels["nvidia.com/mig.config.state"] = "success"
            if self.mig_strategy == "mixed":
                # the MIG-enabled parents, labelled without sharing (replicas 0)
                labels |= {
                    f"{full}.product": info.product,
                    f"{full}.count": str(self.count),
                    f"{full}.replicas": "0",
                    f"{full}.sharing-strategy": "none",
                    f"{full}.memory": str(info.memory_mib),
                } | arch
                for profile, per_gpu in self.mig_layout.items():
                    labels |= _mig_labels(f"nvidia.com/mig-{profile}", info, profile, per_gpu * self.count)
            else:
                [(profile, per_gpu)] = self.mig_layout.items()
                labels |= _mig_labels(full, info, profile, per_gpu * self.count)
            return labels
        shared = self.sharing in ("time-slicing", "mps") and self.replicas > 1
        product = info.product + ("-SHARED" if shared and not self.rename_by_default else "")
        labels |= {
            f"{full}.product": product,
            f"{full}.count": str(self.count),
            f"{full}.replicas": str(self.replicas if shared else 1),
            f"{full}.sharing-strategy": self.sharing if shared else "none",
            f"{full}.memory": str(info.memory_mib),
        } | arch
        return labels


def _mig_labels(resource: str, info: GpuModel, profile: str, count: int) -> dict[str, str]:
    slices, memory = MIG_PROFILES[profile]
    return {
        f"{resource}.product": f"{info.product}-MIG-{profile}",
        f"{resource}.count": str(count),
        f"{resource}.replicas": "1",
        f"{resource}.sharing-strategy": "none",
        f"{resource}.memory": str(memory),
        f"{resource}.multiprocessors": str(slices * info.sms_per_slice),
        f"{resource}.slices.gi": str(slices),
        f"{resource}.slices.ci": str(slices),
        f"{resource}.engines.copy": str(slices),
        f"{resource}.engines.decoder": str({1: 0, 2: 1, 3: 2, 4: 2, 7: 5}[slices]),
        f"{resource}.engines.encoder": "0",
        f"{resource}.engines.jpeg": str(int(slices == 7)),
        f"{resource}.engines.ofa": str(int(slices == 7)),
    }


# -- machines ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Machine:
    cpus: int
    memory_gib: int
    gpu_model: str | None = None
    gpus: int = 0


INSTANCE_TYPES: dict[str, Machine] = {
    # EC2
    "p5.48xlarge": Machine(192, 2048, "H100-80GB", 8),
    "p4de.24xlarge": Machine(96, 1152, "A100-80GB", 8),
    "p4d.24xlarge": Machine(96, 1152, "A100-40GB", 8),
    "g5.12xlarge": Machine(48, 192, "A10G", 4),
    "g6.xlarge": Machine(4, 16, "L4", 1),
    "m6i.2xlarge": Machine(8, 32),
    # Azure
    "Standard_ND96isr_H100_v5": Machine(96, 1900, "H100-80GB", 8),
    "Standard_NC24ads_A100_v4": Machine(24, 220, "A100-80GB", 1),
    "Standard_NC4as_T4_v3": Machine(4, 28, "T4", 1),
    "Standard_D4s_v5": Machine(4, 16),
    # Google Cloud (accelerator name in ACCELERATORS)
    "a3-highgpu-8g": Machine(208, 1872, "H100-80GB", 8),
    "a2-ultragpu-8g": Machine(96, 1360, "A100-80GB", 8),
    "g2-standard-8": Machine(8, 32, "L4", 1),
    "e2-standard-4": Machine(4, 16),
    # OCI shapes (an OCPU is two vCPUs)
    "BM.GPU.H100.8": Machine(224, 2048, "H100-80GB", 8),
    "BM.GPU.A100-v2.8": Machine(256, 2048, "A100-80GB", 8),
    "VM.GPU.A10.1": Machine(30, 240, "A10", 1),
    "VM.Standard.E4.Flex": Machine(8, 64),
}
GKE_ACCELERATORS = {
    "H100-80GB": "nvidia-h100-80gb",
    "A100-80GB": "nvidia-a100-80gb",
    "L4": "nvidia-l4",
    "T4": "nvidia-tesla-t4",
}


def _cpu_reserved_millis(cpus: int) -> int:
    """GKE/EKS/AKS kube-reserved CPU: 6% of the first core, 1% of the next, 0.5% of the next 2,
    0.25% of every core above 4."""
    millis = 60 if cpus >= 1 else 0
    millis += 10 if cpus >= 2 else 0
    millis += 5 * max(0, min(cpus, 4) - 2)
    millis += int(2.5 * max(0, cpus - 4))
    return millis


def _gke_memory_reserved_mib(memory_mib: int) -> int:
    """GKE: 25% of the first 4 GiB, 20% of the next 4, 10% of the next 8, 6% of the next 112, 2% above 128 GiB."""
    bands = [(4096, 0.25), (4096, 0.20), (8192, 0.10), (114688, 0.06), (float("inf"), 0.02)]
    left, reserved = float(memory_mib), 0.0
    for size, rate in bands:
        part = min(left, size)
        reserved += part * rate
        left -= part
        if left <= 0:
            break
    return int(reserved)


def _memory_reserved_mib(provider: str, memory_mib: int, max_pods: int) -> int:
    if provider == "eks":
        return 11 * max_pods + 255  # EKS AMI bootstrap: 11 MiB per pod + 255 MiB
    if provider == "aks":
        return 20 * max_pods + 50  # AKS (1.29+): 20 MB per pod + 50 MB
    return _gke_memory_reserved_mib(memory_mib)


EVICTION_HARD_MIB = 100


def _resources(
    provider: str, machine: Machine, gpu: GpuSetup | None, max_pods: int
) -> tuple[dict[str, str], dict[str, str]]:
    memory_mib = machine.memory_gib * 1024
    capacity = {
        "cpu": str(machine.cpus),
        "memory": f"{memory_mib * 1024}Ki",
        "ephemeral-storage": f"{200 * 1024 * 1024}Ki",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
        "pods": str(max_pods),
    }
    allocatable = {
        "cpu": f"{machine.cpus * 1000 - _cpu_reserved_millis(machine.cpus)}m",
        "memory": f"{(memory_mib - _memory_reserved_mib(provider, memory_mib, max_pods) - EVICTION_HARD_MIB) * 1024}Ki",
        "ephemeral-storage": str(int(200 * 1024**3 * 0.9)),
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
        "pods": str(max_pods),
    }
    if gpu is not None:
        for name, amount in gpu.resources(gke=provider == "gke").items():
            capacity[name] = allocatable[name] = str(amount)
    return capacity, allocatable


def _ip(seed: str) -> str:
    digest = hashlib.sha256(seed.encode()).digest()
    return f"10.0.{digest[0]}.{1 + digest[1] % 254}"


def build_node(
    name: str,
    *,
    provider: str,
    instance_type: str,
    labels: dict[str, str],
    annotations: dict[str, str] | None = None,
    gpu: GpuSetup | None = None,
    taints: list[dict[str, str]] | None = None,
    provider_id: str | None = None,
    ip: str | None = None,
    ready: bool = True,
    unschedulable: bool = False,
    max_pods: int = 110,
    os_image: str = "Ubuntu 22.04.5 LTS",
) -> dict[str, Any]:
    """A Node as the kubelet registers it (plus the labels the provider and GFD add)."""
    machine = INSTANCE_TYPES[instance_type]
    if gpu is None and machine.gpu_model is not None:
        gpu = GpuSetup(model=machine.gpu_model, count=machine.gpus)
    capacity, allocatable = _resources(provider, machine, gpu, max_pods)
    address = ip or _ip(name)
    all_labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": instance_type,
        "beta.kubernetes.io/instance-type": instance_type,
        **labels,
    }
    if gpu is not None:
        all_labels |= gpu.labels(instance_type)
    now = "2026-01-01T00:00:00Z"
    conditions = [
        {
            "type": t,
            "status": "False",
            "reason": f"KubeletHasSufficient{t[:-8]}" if t != "PIDPressure" else "KubeletHasSufficientPID",
            "message": "",
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
        for t in ("MemoryPressure", "DiskPressure", "PIDPressure")
    ]
    conditions.append(
        {
            "type": "Ready",
            "status": "True" if ready else "False",
            "reason": "KubeletReady" if ready else "KubeletNotReady",
            "message": "kubelet is posting ready status" if ready else "container runtime network not ready",
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
    )
    spec: dict[str, Any] = {}
    if provider_id:
        spec["providerID"] = provider_id
    if taints:
        spec["taints"] = taints
    if unschedulable:
        spec["unschedulable"] = True
        spec.setdefault("taints", []).append(
            {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule", "timeAdded": now}
        )
    digest = hashlib.sha256(name.encode()).hexdigest()
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": all_labels, "annotations": dict(annotations or {})},
        "spec": spec,
        "status": {
            "capacity": capacity,
            "allocatable": allocatable,
            "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": address}, {"type": "Hostname", "address": name}],
            "nodeInfo": {
                "machineID": digest[:32],
                "systemUUID": f"{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}",
                "bootID": digest[32:64],
                "kernelVersion": "6.8.0-1021-aws" if provider == "eks" else "6.8.0-1021",
                "osImage": os_image,
                "containerRuntimeVersion": "containerd://1.7.27",
                "kubeletVersion": "v1.33.4",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        },
    }


# -- per provider --------------------------------------------------------------------------------


def eks_managed_node(
    index: int,
    *,
    nodegroup: str,
    instance_type: str = "p5.48xlarge",
    zone: str = "us-east-1a",
    capacity_type: Literal["ON_DEMAND", "SPOT"] = "ON_DEMAND",
    gpu: GpuSetup | None = None,
    taints: list[dict[str, str]] | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    ip = f"10.0.{16 + index // 250}.{10 + index % 250}"
    region = zone[:-1]
    name = f"ip-{ip.replace('.', '-')}.{'ec2.internal' if region == 'us-east-1' else region + '.compute.internal'}"
    instance = "i-0" + hashlib.sha256(f"{nodegroup}/{index}".encode()).hexdigest()[:16]
    labels = {
        "eks.amazonaws.com/nodegroup": nodegroup,
        "eks.amazonaws.com/capacityType": capacity_type,
        "eks.amazonaws.com/nodegroup-image": "ami-0c1a2b3c4d5e6f708",
        "eks.amazonaws.com/sourceLaunchTemplateId": "lt-0a1b2c3d4e5f60718",
        "eks.amazonaws.com/sourceLaunchTemplateVersion": "1",
        "topology.kubernetes.io/region": region,
        "topology.kubernetes.io/zone": zone,
        "k8s.io/cloud-provider-aws": "a1b2c3d4e5f60718293a4b5c6d7e8f90",
    }
    return build_node(
        name, provider="eks", instance_type=instance_type, labels=labels, gpu=gpu, taints=taints,
        provider_id=f"aws:///{zone}/{instance}", ip=ip, os_image="Amazon Linux 2023.8.20250915", **kwargs,
    )  # fmt: skip


def eks_karpenter_node(
    index: int,
    *,
    nodepool: str,
    instance_type: str = "p5.48xlarge",
    zone: str = "us-west-2b",
    capacity_type: Literal["on-demand", "spot"] = "on-demand",
    gpu: GpuSetup | None = None,
    taints: list[dict[str, str]] | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    ip = f"10.1.{32 + index // 250}.{10 + index % 250}"
    region = zone[:-1]
    machine = INSTANCE_TYPES[instance_type]
    labels = {
        "karpenter.sh/nodepool": nodepool,
        "karpenter.sh/capacity-type": capacity_type,
        "karpenter.sh/registered": "true",
        "karpenter.sh/initialized": "true",
        "karpenter.k8s.aws/ec2nodeclass": "default",
        "karpenter.k8s.aws/instance-family": instance_type.split(".", maxsplit=1)[0],
        "karpenter.k8s.aws/instance-size": instance_type.split(".")[1],
        "karpenter.k8s.aws/instance-cpu": str(machine.cpus),
        "karpenter.k8s.aws/instance-memory": str(machine.memory_gib * 1024),
        "topology.kubernetes.io/region": region,
        "topology.kubernetes.io/zone": zone,
    }
    if machine.gpu_model:
        labels |= {
            "karpenter.k8s.aws/instance-gpu-name": machine.gpu_model.split("-")[0].lower(),
            "karpenter.k8s.aws/instance-gpu-count": str(machine.gpus),
            "karpenter.k8s.aws/instance-gpu-manufacturer": "nvidia",
            "karpenter.k8s.aws/instance-gpu-memory": str(GPU_MODELS[machine.gpu_model].memory_mib),
        }
    instance = "i-0" + hashlib.sha256(f"{nodepool}/{index}".encode()).hexdigest()[:16]
    name = f"ip-{ip.replace('.', '-')}.{region}.compute.internal"
    return build_node(
        name, provider="eks", instance_type=instance_type, labels=labels, gpu=gpu, taints=taints,
        provider_id=f"aws:///{zone}/{instance}", ip=ip,
        os_image="Bottlerocket OS 1.44.0 (aws-k8s-1.33-nvidia)", **kwargs,
    )  # fmt: skip


def aks_node(
    index: int,
    *,
    pool: str,
    vm_size: str = "Standard_ND96isr_H100_v5",
    zone: str = "eastus-1",
    spot: bool = False,
    sku_gpu_taint: bool = False,
    gpu: GpuSetup | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    scale_set = f"aks-{pool}-{int(hashlib.sha256(pool.encode()).hexdigest()[:7], 16) % 10**8:08d}-vmss"
    name = f"{scale_set}{index:06x}"
    labels = {
        "kubernetes.azure.com/agentpool": pool,
        "agentpool": pool,
        "kubernetes.azure.com/mode": "user",
        "kubernetes.azure.com/cluster": "MC_ml-rg_ml-aks_eastus",
        "kubernetes.azure.com/node-image-version": "AKSUbuntu-2204gen2containerd-202509.02.0",
        "kubernetes.azure.com/os-sku": "Ubuntu",
        "kubernetes.azure.com/role": "agent",
        "topology.kubernetes.io/region": zone.rsplit("-", 1)[0],
        "topology.kubernetes.io/zone": zone,
    }
    taints: list[dict[str, str]] = []
    if INSTANCE_TYPES[vm_size].gpu_model:
        labels["kubernetes.azure.com/accelerator"] = "nvidia"
    if spot:
        labels["kubernetes.azure.com/scalesetpriority"] = "spot"
        taints.append({"key": "kubernetes.azure.com/scalesetpriority", "value": "spot", "effect": "NoSchedule"})
    if sku_gpu_taint:
        taints.append({"key": "sku", "value": "gpu", "effect": "NoSchedule"})
    provider_id = (
        "azure:///subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/mc_ml-rg_ml-aks_eastus/providers/"
        f"Microsoft.Compute/virtualMachineScaleSets/{scale_set}/virtualMachines/{index}"
    )
    return build_node(
        name, provider="aks", instance_type=vm_size, labels=labels, gpu=gpu, taints=taints or None,
        provider_id=provider_id, max_pods=kwargs.pop("max_pods", 250), **kwargs,
    )  # fmt: skip


def gke_node(
    index: int,
    *,
    pool: str,
    cluster: str = "ml",
    machine_type: str = "a3-highgpu-8g",
    zone: str = "us-central1-a",
    gpu_sharing: Literal["time-sharing", "mps"] | None = None,
    max_shared_clients: int = 1,
    partition_size: str | None = None,
    spot: bool = False,
    gfd: bool = False,
    **kwargs: Any,
) -> dict[str, Any]:
    machine = INSTANCE_TYPES[machine_type]
    suffix = hashlib.sha256(f"{cluster}/{pool}".encode()).hexdigest()[:8]
    name = f"gke-{cluster}-{pool}-{suffix}-{hashlib.sha256(str(index).encode()).hexdigest()[:4]}"
    labels = {
        "cloud.google.com/gke-nodepool": pool,
        "cloud.google.com/gke-os-distribution": "cos",
        "cloud.google.com/gke-boot-disk": "pd-balanced",
        "cloud.google.com/machine-family": machine_type.split("-", maxsplit=1)[0],
        "cloud.google.com/gke-provisioning": "spot" if spot else "standard",
        "topology.kubernetes.io/region": zone[:-2],
        "topology.kubernetes.io/zone": zone,
    }
    if spot:
        labels["cloud.google.com/gke-spot"] = "true"
    gpu: GpuSetup | None = None
    taints: list[dict[str, str]] = []
    if machine.gpu_model:
        labels |= {
            "cloud.google.com/gke-accelerator": GKE_ACCELERATORS[machine.gpu_model],
            "cloud.google.com/gke-gpu": "true",
            "cloud.google.com/gke-gpu-driver-version": "latest",
        }
        taints.append({"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"})
        if partition_size:
            labels["cloud.google.com/gke-gpu-partition-size"] = partition_size
            per_gpu = 7 // MIG_PROFILES[partition_size][0]
            gpu = GpuSetup(
                machine.gpu_model,
                machine.gpus,
                "mig",
                mig_strategy="single",
                mig_layout={partition_size: per_gpu},
                gfd=gfd,
            )
        elif gpu_sharing:
            labels["cloud.google.com/gke-gpu-sharing-strategy"] = gpu_sharing
            labels["cloud.google.com/gke-max-shared-clients-per-gpu"] = str(max_shared_clients)
            kind: Sharing = "time-slicing" if gpu_sharing == "time-sharing" else "mps"
            gpu = GpuSetup(machine.gpu_model, machine.gpus, kind, replicas=max_shared_clients, gfd=gfd)
        else:
            gpu = GpuSetup(machine.gpu_model, machine.gpus, gfd=gfd)
    provider_id = f"gce://ml-project/{zone}/{name}"
    return build_node(
        name, provider="gke", instance_type=machine_type, labels=labels, gpu=gpu, taints=taints or None,
        provider_id=provider_id, os_image="Container-Optimized OS from Google", **kwargs,
    )  # fmt: skip


def oke_node(
    index: int,
    *,
    node_pool_id: str = "ocid1.nodepool.oc1.iad.aaaaaaaaq3xo2yzyx5qj7t4mvbp5hkbiwnkgpz6r2d7cwjqz4tsnvdmfhgvq",
    shape: str = "BM.GPU.H100.8",
    availability_domain: str = "US-ASHBURN-AD-1",
    fault_domain: str = "FAULT-DOMAIN-1",
    gpu: GpuSetup | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    ip = f"10.0.10.{10 + index}"
    labels = {
        "topology.kubernetes.io/zone": availability_domain,
        "failure-domain.beta.kubernetes.io/zone": availability_domain,
        "topology.kubernetes.io/region": "us-ashburn-1",
        "oci.oraclecloud.com/fault-domain": fault_domain,
        "node.info.ds_proxymux_client": "true",
        "node-role.kubernetes.io/node": "",
    }
    annotations = {
        "oci.oraclecloud.com/node-pool-id": node_pool_id,
        "oci.oraclecloud.com/compartment-id": "ocid1.compartment.oc1..aaaaaaaa4vq2ezj7lzr6wfyfw3vdp4fx4x3g3rjcc6hmd",
    }
    instance = "ocid1.instance.oc1.iad." + hashlib.sha256(f"{node_pool_id}/{index}".encode()).hexdigest()[:60]
    return build_node(
        ip, provider="oke", instance_type=shape, labels=labels, annotations=annotations, gpu=gpu,
        provider_id=instance, ip=ip, os_image="Oracle Linux Server 8.10", **kwargs,
    )  # fmt: skip


def onprem_node(
    name: str,
    *,
    instance_type: str = "BM.GPU.H100.8",
    gpu: GpuSetup | None = None,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """A kubeadm node: no cloud labels, only what the admin added (`labels`) plus GFD."""
    node = build_node(
        name,
        provider="onprem",
        instance_type=instance_type,
        labels=dict(labels or {}),
        gpu=gpu,
        taints=taints,
        **kwargs,
    )
    for key in ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type"):
        node["metadata"]["labels"].pop(key, None)  # set by cloud providers only
    return node


# One node of each flavour the tests (and the end-to-end tests) use.
EXAMPLES: dict[str, Callable[[], dict[str, Any]]] = {
    "eks-managed": lambda: eks_managed_node(3, nodegroup="gpu-h100"),
    "eks-managed-spot-l4": lambda: eks_managed_node(1, nodegroup="l4", instance_type="g6.xlarge", capacity_type="SPOT"),
    "eks-karpenter": lambda: eks_karpenter_node(0, nodepool="gpu", capacity_type="spot"),
    "aks": lambda: aks_node(0, pool="gpuh100", sku_gpu_taint=True),
    "aks-spot": lambda: aks_node(2, pool="t4spot", vm_size="Standard_NC4as_T4_v3", spot=True),
    "gke": lambda: gke_node(0, pool="a3"),
    "gke-mig": lambda: gke_node(1, pool="a2-mig", machine_type="a2-ultragpu-8g", partition_size="1g.10gb"),
    "gke-time-sharing": lambda: gke_node(
        0, pool="l4-ts", machine_type="g2-standard-8", gpu_sharing="time-sharing", max_shared_clients=4
    ),
    "oke": lambda: oke_node(0),
    "onprem-mig-mixed": lambda: onprem_node("dgx-1", gpu=GpuSetup("A100-80GB", 8, "mig", mig_layout={"1g.10gb": 7})),
    "onprem-mig-single": lambda: onprem_node(
        "dgx-2", gpu=GpuSetup("H100-80GB", 8, "mig", mig_strategy="single", mig_layout={"3g.40gb": 2})
    ),
    "onprem-time-slicing": lambda: onprem_node(
        "ts", instance_type="VM.GPU.A10.1", gpu=GpuSetup("A10", 1, "time-slicing", replicas=4)
    ),
    "onprem-renamed": lambda: onprem_node(
        "ren",
        instance_type="VM.GPU.A10.1",
        gpu=GpuSetup("A10", 1, "time-slicing", replicas=4, rename_by_default=True),
    ),
    "onprem-mps": lambda: onprem_node("mps", instance_type="VM.GPU.A10.1", gpu=GpuSetup("A10", 1, "mps", replicas=2)),
    "cpu-only": lambda: eks_managed_node(9, nodegroup="system", instance_type="m6i.2xlarge"),
}
