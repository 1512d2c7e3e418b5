"""EC2 GPU instance types and EKS GPU AMI types.

EKS reports only the instance type of a node group; GPUs, vCPUs and memory come from the EC2 instance
type pages (p3/p4/p5/p6 "Accelerated computing", g4dn/g5/g6/g6e). Memory is GiB as EC2 states it.
"""

from __future__ import annotations

from adapters.clouds.shapes import GpuShape


def _family(model: str, sizes: dict[str, tuple[int, int, int]]) -> dict[str, GpuShape]:
    return {size: GpuShape(model, gpus, vcpus, mem) for size, (gpus, vcpus, mem) in sizes.items()}


# (gpus, vcpus, memory GiB) per size; g5 and g6 share their size ladder.
_G5_LADDER = {
    "xlarge": (1, 4, 16),
    "2xlarge": (1, 8, 32),
    "4xlarge": (1, 16, 64),
    "8xlarge": (1, 32, 128),
    "16xlarge": (1, 64, 256),
    "12xlarge": (4, 48, 192),
    "24xlarge": (4, 96, 384),
    "48xlarge": (8, 192, 768),
}

_FAMILIES: dict[str, dict[str, GpuShape]] = {
    "p3": _family("V100-16GB", {"2xlarge": (1, 8, 61), "8xlarge": (4, 32, 244), "16xlarge": (8, 64, 488)}),
    "p3dn": _family("V100-32GB", {"24xlarge": (8, 96, 768)}),
    "p4d": _family("A100-40GB", {"24xlarge": (8, 96, 1152)}),
    "p4de": _family("A100-80GB", {"24xlarge": (8, 96, 1152)}),
    "p5": _family("H100-80GB", {"4xlarge": (1, 16, 256), "48xlarge": (8, 192, 2048)}),
    "p5e": _family("H200-141GB", {"48xlarge": (8, 192, 2048)}),
    "p5en": _family("H200-141GB", {"48xlarge": (8, 192, 2048)}),
    "p6-b200": _family("B200", {"48xlarge": (8, 192, 2048)}),
    # Newer families: the instance type names are in botocore's EC2 `InstanceType` enum (2016-11-15
    # model); GPUs, vCPUs and memory from the EC2 accelerated-computing pages. Pools are planned with
    # their nodes' allocatable anyway; these sizes only matter for a pool scaled to zero.
    "p6-b300": _family("B300", {"48xlarge": (8, 192, 4096)}),
    "p6e-gb200": _family("GB200", {"36xlarge": (4, 144, 960)}),
    "g7e": _family(
        "RTX-PRO-6000",
        {
            "2xlarge": (1, 8, 64),
            "4xlarge": (1, 16, 128),
            "8xlarge": (1, 32, 256),
            "12xlarge": (2, 48, 512),
            "24xlarge": (4, 96, 1024),
            "48xlarge": (8, 192, 2048),
        },
    ),
    "g4dn": _family(
        "T4",
        {
            "xlarge": (1, 4, 16),
            "2xlarge": (1, 8, 32),
            "4xlarge": (1, 16, 64),
            "8xlarge": (1, 32, 128),
            "16xlarge": (1, 64, 256),
            "12xlarge": (4, 48, 192),
            "metal": (8, 96, 384),
        },
    ),
    "g5": _family("A10G", _G5_LADDER),
    "g6": _family("L4", _G5_LADDER),
    "g6e": _family(
        "L40S",
        {
            "xlarge": (1, 4, 32),
            "2xlarge": (1, 8, 64),
            "4xlarge": (1, 16, 128),
            "8xlarge": (1, 32, 256),
            "16xlarge": (1, 64, 512),
            "12xlarge": (4, 48, 384),
            "24xlarge": (4, 96, 768),
            "48xlarge": (8, 192, 1536),
        },
    ),
}

# AMI types that ship the NVIDIA driver (the EKS API's `amiType` enum). `CUSTOM` means a launch template
# chooses the image, so the API cannot tell.
GPU_AMI_TYPES = frozenset(
    {
        "AL2_x86_64_GPU",
        "AL2023_x86_64_NVIDIA",
        "AL2023_ARM_64_NVIDIA",
        "BOTTLEROCKET_x86_64_NVIDIA",
        "BOTTLEROCKET_ARM_64_NVIDIA",
        "BOTTLEROCKET_x86_64_NVIDIA_FIPS",
        "BOTTLEROCKET_ARM_64_NVIDIA_FIPS",
    }
)
CUSTOM_AMI = "CUSTOM"


def gpu_shape(instance_type: str) -> GpuShape | None:
    family, _, size = instance_type.partition(".")
    return _FAMILIES.get(family, {}).get(size)


def is_gpu_family(instance_type: str) -> bool:
    """Whether the type belongs to a GPU family gpufleet tracks, even if this size is missing."""
    return instance_type.partition(".")[0] in _FAMILIES
