"""Node objects as real clusters return them, per provider flavour, for the inventory tests.

Label names and values come from the providers and NVIDIA (GPU Feature Discovery / GPU Operator
labels and the device plugin's resource names: NVIDIA/k8s-device-plugin `internal/lm/resource.go`,
`docs/gpu-feature-discovery/README.md`, the GPU Operator's mig-mixed node-label sample; GKE "Run GPUs
in GKE Standard node pools" and "About GPU sharing strategies"; AKS `use-labels.md`; EKS managed node
group and Karpenter well-known labels; OKE's `oci.oraclecloud.com/node-pool-id` annotation).
Allocatable is below capacity by the kubelet's and the system's reservations, as on real nodes.
"""

from __future__ import annotations

from typing import Any

OKE_POOL = "ocid1.nodepool.oc1.iad.aaaaaaaa4xzlh3qbvu2g3kqxw7ylmsp7hd3vqz5atk6zl5y2g3p4c5kq"

# GPU Feature Discovery labels common to every NVIDIA node it runs on.
_GFD_COMMON = {
    "nvidia.com/gpu.present": "true",
    "nvidia.com/cuda.driver-version.major": "570",
    "nvidia.com/cuda.driver-version.full": "570.124.06",
    "nvidia.com/gfd.timestamp": "1764720000",
}


def node(
    name: str,
    *,
    labels: dict[str, str],
    allocatable: dict[str, str],
    capacity: dict[str, str],
    annotations: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
    unschedulable: bool = False,
    ready: bool = True,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": "12345",
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                **labels,
            },
            "annotations": {"node.alpha.kubernetes.io/ttl": "0", **(annotations or {})},
        },
        "spec": {"taints": list(taints or [])},
        "status": {
            "capacity": {"pods": "110", "ephemeral-storage": "209702892Ki", "hugepages-1Gi": "0", **capacity},
            "allocatable": {"pods": "110", "ephemeral-storage": "192188443853", "hugepages-1Gi": "0", **allocatable},
            "conditions": [
                {"type": "MemoryPressure", "status": "False"},
                {"type": "DiskPressure", "status": "False"},
                {"type": "Ready", "status": "True" if ready else "Unknown"},
            ],
            "nodeInfo": {
                "architecture": "amd64",
                "bootID": "5a8f9c1e-3b2d-4e6f-9a7b-1c2d3e4f5a6b",
                "containerRuntimeVersion": "containerd://1.7.25",
                "kernelVersion": "6.1.119-129.201.amzn2023.x86_64",
                "kubeProxyVersion": "v1.31.4",
                "kubeletVersion": "v1.31.4",
                "machineID": "ec2b7f3c9d1e4a5b8c6d7e8f9a0b1c2d",
                "operatingSystem": "linux",
                "osImage": "Amazon Linux 2023.6.20250115",
                "systemUUID": "ec2b7f3c-9d1e-4a5b-8c6d-7e8f9a0b1c2d",
            },
        },
    }
    if unschedulable:
        body["spec"]["unschedulable"] = True
        body["spec"]["taints"].append({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"})
    return body


def eks_p5(name: str, group: str = "p5-reserved", **extra: Any) -> dict[str, Any]:
    """An EKS managed node group p5.48xlarge with the GPU Operator (GFD, MIG strategy single, no MIG)."""
    return node(
        name,
        labels={
            "eks.amazonaws.com/nodegroup": group,
            "eks.amazonaws.com/capacityType": "ON_DEMAND",
            "eks.amazonaws.com/nodegroup-image": "ami-0f1e2d3c4b5a69788",
            "node.kubernetes.io/instance-type": "p5.48xlarge",
            "topology.kubernetes.io/zone": "us-east-1a",
            "topology.kubernetes.io/region": "us-east-1",
            **_GFD_COMMON,
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            "nvidia.com/gpu.count": "8",
            "nvidia.com/gpu.memory": "81559",
            "nvidia.com/gpu.family": "hopper",
            "nvidia.com/gpu.replicas": "1",
            "nvidia.com/gpu.sharing-strategy": "none",
            "nvidia.com/mig.capable": "true",
            "nvidia.com/mig.strategy": "single",
        },
        capacity={"cpu": "192", "memory": "2097152000Ki", "nvidia.com/gpu": "8"},
        allocatable={"cpu": "191450m", "memory": "2003307344Ki", "nvidia.com/gpu": "8"},
        **extra,
    )


def karpenter_l40s(name: str) -> dict[str, Any]:
    """A Karpenter spot g6e.12xlarge without GFD: the GPU is named by Karpenter's instance labels."""
    return node(
        name,
        labels={
            "karpenter.sh/nodepool": "gpu-spot",
            "karpenter.sh/capacity-type": "spot",
            "karpenter.k8s.aws/instance-family": "g6e",
            "karpenter.k8s.aws/instance-gpu-name": "l40s",
            "karpenter.k8s.aws/instance-gpu-manufacturer": "nvidia",
            "karpenter.k8s.aws/instance-gpu-count": "4",
            "karpenter.k8s.aws/instance-gpu-memory": "46068",
            "node.kubernetes.io/instance-type": "g6e.12xlarge",
            "topology.kubernetes.io/zone": "us-east-1b",
        },
        capacity={"cpu": "48", "memory": "397594204Ki", "nvidia.com/gpu": "4"},
        allocatable={"cpu": "47810m", "memory": "388390492Ki", "nvidia.com/gpu": "4"},
        taints=[{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}],
    )


def aks_h100_timeslice(name: str, renamed: bool = True) -> dict[str, Any]:
    """An AKS ND96isr_H100_v5 agent pool with the GPU Operator's time-slicing, 4 replicas per GPU."""
    resource = "nvidia.com/gpu.shared" if renamed else "nvidia.com/gpu"
    return node(
        name,
        labels={
            "kubernetes.azure.com/agentpool": "gpunp",
            "agentpool": "gpunp",
            "kubernetes.azure.com/accelerator": "nvidia",
            "kubernetes.azure.com/mode": "user",
            "kubernetes.azure.com/cluster": "MC_rg-ml_aks-ml_westeurope",
            "node.kubernetes.io/instance-type": "Standard_ND96isr_H100_v5",
            "topology.kubernetes.io/zone": "westeurope-1",
            **_GFD_COMMON,
            # GFD appends -SHARED to the product only when the shared resource is not renamed.
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3" + ("" if renamed else "-SHARED"),
            "nvidia.com/gpu.count": "8",
            "nvidia.com/gpu.replicas": "4",
            "nvidia.com/gpu.sharing-strategy": "time-slicing",
            "nvidia.com/mig.strategy": "single",
        },
        capacity={"cpu": "96", "memory": "1936973400Ki", resource: "32"},
        allocatable={"cpu": "95690m", "memory": "1871218776Ki", resource: "32"},
        taints=[{"key": "sku", "value": "gpu", "effect": "NoSchedule"}],
    )


def gke_h100_mig(name: str) -> dict[str, Any]:
    """A GKE a3-highgpu-8g pool with GPU partitions 1g.10gb (GKE's own device plugin, no GFD)."""
    return node(
        name,
        labels={
            "cloud.google.com/gke-nodepool": "h100-mig",
            "cloud.google.com/gke-accelerator": "nvidia-h100-80gb",
            "cloud.google.com/gke-gpu-partition-size": "1g.10gb",
            "cloud.google.com/gke-gpu-driver-version": "latest",
            "cloud.google.com/machine-family": "a3",
            "node.kubernetes.io/instance-type": "a3-highgpu-8g",
            "topology.kubernetes.io/zone": "us-central1-a",
        },
        capacity={"cpu": "208", "memory": "1914044484Ki", "nvidia.com/gpu": "56"},
        allocatable={"cpu": "207690m", "memory": "1869432900Ki", "nvidia.com/gpu": "56"},
        taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
    )


def gke_l4_time_sharing(name: str, strategy: str = "time-sharing") -> dict[str, Any]:
    """A GKE g2-standard-24 pool (2 x L4) with time-sharing, 4 clients per GPU."""
    return node(
        name,
        labels={
            "cloud.google.com/gke-nodepool": "l4-shared",
            "cloud.google.com/gke-accelerator": "nvidia-l4",
            "cloud.google.com/gke-gpu-sharing-strategy": strategy,
            "cloud.google.com/gke-max-shared-clients-per-gpu": "4",
            "cloud.google.com/gke-spot": "true",
            "node.kubernetes.io/instance-type": "g2-standard-24",
            "topology.kubernetes.io/zone": "us-central1-b",
        },
        capacity={"cpu": "24", "memory": "98963380Ki", "nvidia.com/gpu": "8"},
        allocatable={"cpu": "23830m", "memory": "92471732Ki", "nvidia.com/gpu": "8"},
        taints=[
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
            {"key": "cloud.google.com/gke-spot", "value": "true", "effect": "NoSchedule"},
        ],
    )


def oke_h100_mps(name: str) -> dict[str, Any]:
    """An OKE BM.GPU.H100.8 node pool node with the GPU Operator's MPS sharing, 4 replicas per GPU."""
    return node(
        name,
        labels={
            "node.kubernetes.io/instance-type": "BM.GPU.H100.8",
            "oci.oraclecloud.com/fault-domain": "FAULT-DOMAIN-2",
            "topology.kubernetes.io/zone": "US-ASHBURN-AD-1",
            "oci.oraclecloud.com/disable-gpu-device-plugin": "true",
            **_GFD_COMMON,
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            "nvidia.com/gpu.count": "8",
            "nvidia.com/gpu.replicas": "4",
            "nvidia.com/gpu.sharing-strategy": "mps",
            "nvidia.com/mps.capable": "true",
            "nvidia.com/mig.strategy": "single",
        },
        annotations={
            "oci.oraclecloud.com/node-pool-id": OKE_POOL,
            "oci.oraclecloud.com/compartment-id": "ocid1.compartment.oc1..aaaaaaaaq3l",
        },
        capacity={"cpu": "224", "memory": "2113362948Ki", "nvidia.com/gpu": "32"},
        allocatable={"cpu": "223200m", "memory": "2050448388Ki", "nvidia.com/gpu": "32"},
    )


def onprem_a100_mixed(name: str, config: str = "all-balanced", pool: str = "rack-a") -> dict[str, Any]:
    """An on-prem DGX A100-80GB with the GPU Operator, MIG strategy mixed; the pool is the site's label."""
    per_gpu = {
        "all-balanced": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1},
        "all-1g.10gb": {"1g.10gb": 7},
        "all-3g.40gb": {"3g.40gb": 2},
    }[config]
    counts = {p: n * 8 for p, n in per_gpu.items()}
    labels = {
        "example.com/gpu-pool": pool,
        "node.kubernetes.io/instance-type": "DGX-A100-80GB",
        **_GFD_COMMON,
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
        "nvidia.com/gpu.count": "0",
        "nvidia.com/gpu.replicas": "0",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/mig.config": config,
        "nvidia.com/mig.config.state": "success",
    }
    for profile, count in counts.items():
        labels[f"nvidia.com/mig-{profile}.count"] = str(count)
        labels[f"nvidia.com/mig-{profile}.product"] = f"NVIDIA-A100-SXM4-80GB-MIG-{profile}"
    resources = {f"nvidia.com/mig-{p}": str(n) for p, n in counts.items()}
    return node(
        name,
        labels=labels,
        capacity={"cpu": "256", "memory": "2113407080Ki", **resources},
        allocatable={"cpu": "255", "memory": "2112256104Ki", **resources},
    )


def onprem_a100_single(name: str) -> dict[str, Any]:
    """An on-prem A100-40GB node, MIG strategy single, every GPU cut into 1g.5gb (7 per GPU, 4 GPUs)."""
    return node(
        name,
        labels={
            "example.com/gpu-pool": "rack-b",
            **_GFD_COMMON,
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
            "nvidia.com/gpu.count": "28",
            "nvidia.com/gpu.memory": "4864",
            "nvidia.com/gpu.replicas": "1",
            "nvidia.com/gpu.multiprocessors": "14",
            "nvidia.com/gpu.slices.gi": "1",
            "nvidia.com/gpu.slices.ci": "1",
            "nvidia.com/mig.strategy": "single",
            "nvidia.com/mig.config": "all-1g.5gb",
        },
        capacity={"cpu": "128", "memory": "1056446324Ki", "nvidia.com/gpu": "28"},
        allocatable={"cpu": "127900m", "memory": "1.5Ti", "nvidia.com/gpu": "28"},
    )


def cpu_node(name: str) -> dict[str, Any]:
    return node(
        name,
        labels={"eks.amazonaws.com/nodegroup": "system", "node.kubernetes.io/instance-type": "m6i.xlarge"},
        capacity={"cpu": "4", "memory": "16069876Ki"},
        allocatable={"cpu": "3920m", "memory": "15050004Ki"},
    )


def onprem_h100(name: str, pool: str = "h100", **extra: Any) -> dict[str, Any]:
    """An on-prem HGX H100 server with the GPU Operator; its pool is the site's `example.com/gpu-pool`."""
    return node(
        name,
        labels={
            "example.com/gpu-pool": pool,
            "topology.kubernetes.io/zone": "dc1-row4",
            **_GFD_COMMON,
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            "nvidia.com/gpu.count": "8",
            "nvidia.com/gpu.replicas": "1",
            "nvidia.com/gpu.sharing-strategy": "none",
            "nvidia.com/mig.strategy": "single",
        },
        capacity={"cpu": "224", "memory": "2113407080Ki", "nvidia.com/gpu": "8"},
        allocatable={"cpu": "223", "memory": "2101872744Ki", "nvidia.com/gpu": "8"},
        taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
        **extra,
    )
