"""The default simulated fleet of `gpufleet up`: one cluster shaped like each managed flavour."""

from __future__ import annotations

from typing import Any

GPU_TAINT = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]


def default_fleet() -> list[dict[str, Any]]:
    """Cluster specs (bodies of POST /v1/clusters) with different GPU models and sharing modes."""
    return [
        {
            "name": "eks-us-east-1",
            "region": "us-east-1",
            "pools": [
                {
                    "name": "p5-h100",
                    "gpu_model": "H100-80GB",
                    "gpus_per_node": 8,
                    "cpu_millis": 192000,
                    "memory_mib": 2_000_000,
                    "taints": GPU_TAINT,
                    "price_per_gpu_hour": 6.88,
                    "node_count": 6,
                    "labels": {"node.kubernetes.io/instance-type": "p5.48xlarge"},
                },
                {
                    "name": "g5-a10g-spot",
                    "gpu_model": "A10G",
                    "gpus_per_node": 4,
                    "cpu_millis": 96000,
                    "memory_mib": 384_000,
                    "taints": GPU_TAINT,
                    "price_per_gpu_hour": 0.61,
                    "spot": True,
                    "node_count": 4,
                    "labels": {"node.kubernetes.io/instance-type": "g5.12xlarge"},
                },
            ],
        },
        {
            "name": "aks-westeurope",
            "region": "westeurope",
            "pools": [
                {
                    "name": "nd96-a100",
                    "gpu_model": "A100-80GB",
                    "gpus_per_node": 8,
                    "cpu_millis": 96000,
                    "memory_mib": 1_800_000,
                    "taints": [{"key": "sku", "value": "gpu", "effect": "NoSchedule"}],
                    "price_per_gpu_hour": 4.10,
                    "node_count": 4,
                    "labels": {"node.kubernetes.io/instance-type": "Standard_ND96amsr_A100_v4"},
                },
                {
                    "name": "nc-a100-mig",
                    "gpu_model": "A100-80GB",
                    "gpus_per_node": 1,
                    "cpu_millis": 24000,
                    "memory_mib": 220_000,
                    "sharing": "mig:all-balanced",
                    "taints": [{"key": "sku", "value": "gpu", "effect": "NoSchedule"}],
                    "price_per_gpu_hour": 3.67,
                    "node_count": 4,
                    "labels": {"node.kubernetes.io/instance-type": "Standard_NC24ads_A100_v4"},
                },
            ],
        },
        {
            "name": "gke-us-central1",
            "region": "us-central1",
            "pools": [
                {
                    "name": "a3-h100",
                    "gpu_model": "H100-80GB",
                    "gpus_per_node": 8,
                    "cpu_millis": 208000,
                    "memory_mib": 1_870_000,
                    "taints": GPU_TAINT,
                    "price_per_gpu_hour": 11.06,
                    "node_count": 4,
                    "labels": {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},
                },
                {
                    "name": "g2-l4-shared",
                    "gpu_model": "L4",
                    "gpus_per_node": 4,
                    "cpu_millis": 48000,
                    "memory_mib": 192_000,
                    "sharing": "timeslice:4",
                    "taints": GPU_TAINT,
                    "price_per_gpu_hour": 0.71,
                    "node_count": 4,
                    "labels": {"cloud.google.com/gke-gpu-sharing-strategy": "time-sharing"},
                },
            ],
        },
        {
            "name": "oke-us-ashburn-1",
            "region": "us-ashburn-1",
            "pools": [
                {
                    "name": "bm-a100-40",
                    "gpu_model": "A100-40GB",
                    "gpus_per_node": 8,
                    "cpu_millis": 128000,
                    "memory_mib": 2_000_000,
                    "taints": GPU_TAINT,
                    "price_per_gpu_hour": 3.05,
                    "node_count": 4,
                    "labels": {"node.kubernetes.io/instance-type": "BM.GPU4.8"},
                },
            ],
        },
    ]
