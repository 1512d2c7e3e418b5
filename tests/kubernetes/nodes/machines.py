"""Machines (instance types, shapes, servers), the kubelet's reservations on them, and `build_node`:
the one place a Node object is put together (provenance: the package docstring)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from tests.kubernetes.nodes.gpus import GpuSetup


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
    "g6e.12xlarge": Machine(48, 384, "L40S", 4),
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
    "g2-standard-24": Machine(24, 96, "L4", 2),
    "e2-standard-4": Machine(4, 16),
    # OCI shapes (an OCPU is two vCPUs)
    "BM.GPU.H100.8": Machine(224, 2048, "H100-80GB", 8),
    "BM.GPU.A100-v2.8": Machine(256, 2048, "A100-80GB", 8),
    "VM.GPU.A10.1": Machine(30, 240, "A10", 1),
    "VM.Standard.E4.Flex": Machine(8, 64),
    # On-prem servers (`onprem_node` drops the instance-type labels: the key only names the hardware)
    "DGX-A100-640GB": Machine(256, 2048, "A100-80GB", 8),
    "DGX-Station-A100-160GB": Machine(128, 512, "A100-40GB", 4),
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
