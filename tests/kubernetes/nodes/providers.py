"""Nodes per provider flavour: names, provider IDs and labels as each provider sets them (provenance:
the package docstring)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, Literal

from tests.kubernetes.nodes.gpus import GPU_MODELS, MIG_PROFILES, GpuSetup, Sharing
from tests.kubernetes.nodes.machines import GKE_ACCELERATORS, INSTANCE_TYPES, build_node


def eks_managed_node(
    index: int,
    *,
    nodegroup: str,
    instance_type: str = "p5.48xlarge",
    zone: str = "us-east-1a",
    capacity_type: Literal["ON_DEMAND", "SPOT"] = "ON_DEMAND",
    gpu: GpuSetup | None = None,
    taints: list[dict[str, str]] | None = None,
    name: str | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    ip = f"10.0.{16 + index // 250}.{10 + index % 250}"
    region = zone[:-1]
    name = (
        name or f"ip-{ip.replace('.', '-')}.{'ec2.internal' if region == 'us-east-1' else region + '.compute.internal'}"
    )
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
    name: str | None = None,
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
    name = name or f"ip-{ip.replace('.', '-')}.{region}.compute.internal"
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
    name: str | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    scale_set = f"aks-{pool}-{int(hashlib.sha256(pool.encode()).hexdigest()[:7], 16) % 10**8:08d}-vmss"
    name = name or f"{scale_set}{index:06x}"
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
    gpu_sharing: str | None = None,  # the label's value: time-sharing | mps (read case-blind)
    max_shared_clients: int = 1,
    partition_size: str | None = None,
    spot: bool = False,
    gfd: bool = False,
    name: str | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    machine = INSTANCE_TYPES[machine_type]
    suffix = hashlib.sha256(f"{cluster}/{pool}".encode()).hexdigest()[:8]
    name = name or f"gke-{cluster}-{pool}-{suffix}-{hashlib.sha256(str(index).encode()).hexdigest()[:4]}"
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
            kind: Sharing = "mps" if gpu_sharing.lower() == "mps" else "time-slicing"
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
    extra_labels: dict[str, str] | None = None,
    name: str | None = None,
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
        **(extra_labels or {}),
    }
    annotations = {
        "oci.oraclecloud.com/node-pool-id": node_pool_id,
        "oci.oraclecloud.com/compartment-id": "ocid1.compartment.oc1..aaaaaaaa4vq2ezj7lzr6wfyfw3vdp4fx4x3g3rjcc6hmd",
    }
    instance = "ocid1.instance.oc1.iad." + hashlib.sha256(f"{node_pool_id}/{index}".encode()).hexdigest()[:60]
    return build_node(
        name or ip, provider="oke", instance_type=shape, labels=labels, annotations=annotations, gpu=gpu,
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
