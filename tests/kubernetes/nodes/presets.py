"""Named nodes the inventory and integration tests share, one per flavour they read, built by the
provider builders (provenance: the package docstring). A test that needs an odd node edits the dict
it gets back."""

from __future__ import annotations

from typing import Any

from tests.kubernetes.nodes import providers
from tests.kubernetes.nodes.gpus import GpuSetup

OKE_POOL = "ocid1.nodepool.oc1.iad.aaaaaaaa4xzlh3qbvu2g3kqxw7ylmsp7hd3vqz5atk6zl5y2g3p4c5kq"
POOL_LABEL = "example.com/gpu-pool"  # an on-prem site's own pool label, configured as pool_label_key
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}

# GPU Operator mig-manager layouts (per GPU) the on-prem DGX A100 may be cut into.
A100_80GB_LAYOUTS = {
    "all-balanced": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1},
    "all-1g.10gb": {"1g.10gb": 7},
    "all-3g.40gb": {"3g.40gb": 2},
}


def eks_p5(name: str, group: str = "p5-reserved", **extra: Any) -> dict[str, Any]:
    """An EKS managed node group p5.48xlarge (8 x H100) with the GPU Operator (GFD), in us-east-1a."""
    return providers.eks_managed_node(0, name=name, nodegroup=group, **extra)


def karpenter_l40s(name: str) -> dict[str, Any]:
    """A Karpenter spot g6e.12xlarge without GFD: the GPU is named by Karpenter's instance labels."""
    return providers.eks_karpenter_node(
        0,
        name=name,
        nodepool="gpu-spot",
        instance_type="g6e.12xlarge",
        zone="us-east-1b",
        capacity_type="spot",
        gpu=GpuSetup("L40S", 4, gfd=False),
        taints=[{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}],
    )


def aks_h100_timeslice(name: str, renamed: bool = True) -> dict[str, Any]:
    """An AKS ND96isr_H100_v5 agent pool (tainted sku=gpu) with the GPU Operator's time-slicing, 4
    replicas per GPU; GFD appends -SHARED to the product only when the shared resource is not renamed."""
    return providers.aks_node(
        0,
        name=name,
        pool="gpunp",
        zone="westeurope-1",
        sku_gpu_taint=True,
        gpu=GpuSetup("H100-80GB", 8, "time-slicing", replicas=4, rename_by_default=renamed),
    )


def gke_h100_mig(name: str) -> dict[str, Any]:
    """A GKE a3-highgpu-8g pool with GPU partitions 1g.10gb (GKE's own device plugin, no GFD)."""
    return providers.gke_node(0, name=name, pool="h100-mig", cluster="train", partition_size="1g.10gb")


def gke_l4_time_sharing(name: str, strategy: str = "time-sharing") -> dict[str, Any]:
    """A GKE spot g2-standard-24 pool (2 x L4) sharing each GPU among 4 clients (`strategy` is the
    label's value as written, e.g. time-sharing, TIME_SHARING or MPS)."""
    return providers.gke_node(
        0,
        name=name,
        pool="l4-shared",
        cluster="train",
        machine_type="g2-standard-24",
        zone="us-central1-b",
        gpu_sharing=strategy,
        max_shared_clients=4,
        spot=True,
    )


def oke_h100_mps(name: str) -> dict[str, Any]:
    """An OKE BM.GPU.H100.8 node pool node with the GPU Operator's MPS sharing, 4 replicas per GPU (OKE's
    own device plugin switched off by its label so the operator's runs)."""
    return providers.oke_node(
        0,
        name=name,
        node_pool_id=OKE_POOL,
        fault_domain="FAULT-DOMAIN-2",
        gpu=GpuSetup("H100-80GB", 8, "mps", replicas=4),
        extra_labels={"oci.oraclecloud.com/disable-gpu-device-plugin": "true"},
    )


def onprem_a100_mixed(name: str, config: str = "all-balanced", pool: str = "rack-a") -> dict[str, Any]:
    """An on-prem DGX A100 (8 x A100-80GB) with the GPU Operator, MIG strategy mixed, cut per the
    mig-manager `config`; the pool is the site's label."""
    return providers.onprem_node(
        name,
        instance_type="DGX-A100-640GB",
        labels={POOL_LABEL: pool},
        gpu=GpuSetup("A100-80GB", 8, "mig", mig_layout=A100_80GB_LAYOUTS[config], mig_config=config),
    )


def onprem_a100_single(name: str) -> dict[str, Any]:
    """An on-prem DGX Station A100 (4 x A100-40GB), MIG strategy single, every GPU cut into 1g.5gb."""
    return providers.onprem_node(
        name,
        instance_type="DGX-Station-A100-160GB",
        labels={POOL_LABEL: "rack-b"},
        gpu=GpuSetup("A100-40GB", 4, "mig", mig_strategy="single", mig_layout={"1g.5gb": 7}),
    )


def cpu_node(name: str) -> dict[str, Any]:
    """An EKS system node group m6i.2xlarge: no GPUs."""
    return providers.eks_managed_node(0, name=name, nodegroup="system", instance_type="m6i.2xlarge")


def onprem_h100(name: str, pool: str = "h100", **extra: Any) -> dict[str, Any]:
    """An on-prem HGX H100 server (8 x H100, GPU Operator, GPUs tainted); its pool is the site's label."""
    return providers.onprem_node(
        name,
        labels={POOL_LABEL: pool, "topology.kubernetes.io/zone": "dc1-row4"},
        taints=[dict(GPU_TAINT)],
        **extra,
    )
