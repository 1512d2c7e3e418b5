"""GKE accelerator types and the capacity of the machine types GPUs run on.

GKE's node pool reports its accelerators (type and count) but not the machine's CPU and memory, which
are the Compute Engine machine type's. Memory below is what Compute Engine calls GB and reports as
`memoryMb` = GB x 1024, i.e. GiB.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# `cloud.google.com/gke-accelerator` values -> gpufleet's GPU model names.
ACCELERATORS = {
    "nvidia-tesla-t4": "T4",
    "nvidia-tesla-p4": "P4",
    "nvidia-tesla-p100": "P100-16GB",
    "nvidia-tesla-v100": "V100-16GB",
    "nvidia-l4": "L4",
    "nvidia-tesla-a100": "A100-40GB",
    "nvidia-a100-80gb": "A100-80GB",
    "nvidia-h100-80gb": "H100-80GB",
    "nvidia-h100-mega-80gb": "H100-80GB",  # the same GPU; "mega" is the A3 Mega machine's faster network
    "nvidia-h200-141gb": "H200-141GB",
    "nvidia-b200": "B200",
    "nvidia-gb200": "GB200",
    "nvidia-rtx-pro-6000": "RTX-PRO-6000",
}


@dataclass(frozen=True)
class MachineShape:
    vcpus: int
    memory_mib: int


def _gib(vcpus: int, gib: float) -> MachineShape:
    return MachineShape(vcpus, int(gib * 1024))


_MACHINES: dict[str, MachineShape] = {
    "a2-highgpu-1g": _gib(12, 85),
    "a2-highgpu-2g": _gib(24, 170),
    "a2-highgpu-4g": _gib(48, 340),
    "a2-highgpu-8g": _gib(96, 680),
    "a2-megagpu-16g": _gib(96, 1360),
    "a2-ultragpu-1g": _gib(12, 170),
    "a2-ultragpu-2g": _gib(24, 340),
    "a2-ultragpu-4g": _gib(48, 680),
    "a2-ultragpu-8g": _gib(96, 1360),
    "a3-highgpu-1g": _gib(26, 234),
    "a3-highgpu-2g": _gib(52, 468),
    "a3-highgpu-4g": _gib(104, 936),
    "a3-highgpu-8g": _gib(208, 1872),
    "a3-megagpu-8g": _gib(208, 1872),
    "a3-edgegpu-8g": _gib(208, 1872),
    "a3-ultragpu-8g": _gib(224, 2952),
    "a4-highgpu-8g": _gib(224, 3968),
    "g2-standard-4": _gib(4, 16),
    "g2-standard-8": _gib(8, 32),
    "g2-standard-12": _gib(12, 48),
    "g2-standard-16": _gib(16, 64),
    "g2-standard-24": _gib(24, 96),
    "g2-standard-32": _gib(32, 128),
    "g2-standard-48": _gib(48, 192),
    "g2-standard-96": _gib(96, 384),
}
# N1 is the family T4, P4, P100 and V100 attach to; its predefined types scale linearly with vCPUs.
_N1 = re.compile(r"^n1-(standard|highmem|highcpu)-([0-9]+)$")
_N1_GIB_PER_VCPU = {"standard": 3.75, "highmem": 6.5, "highcpu": 0.9}


def machine_shape(machine_type: str) -> MachineShape | None:
    if machine_type in _MACHINES:
        return _MACHINES[machine_type]
    match = _N1.match(machine_type)
    if match is None:
        return None
    vcpus = int(match.group(2))
    return _gib(vcpus, vcpus * _N1_GIB_PER_VCPU[match.group(1)])
