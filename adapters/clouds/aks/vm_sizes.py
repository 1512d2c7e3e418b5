"""Azure GPU VM sizes. AKS has no GPU field on an agent pool; the GPU comes from `vm_size`.

Figures are the Azure VM size pages' (ND A100 v4, NDm A100 v4, ND H100 v5, ND H200 v5, NC A100 v4,
NC H100 v5, NCasT4_v3, NVadsA10 v5, NCv3). Memory is GiB.
"""

from __future__ import annotations

from adapters.clouds.shapes import GpuShape

_SIZES: dict[str, GpuShape] = {
    "Standard_ND96asr_v4": GpuShape("A100-40GB", 8, 96, 900),
    "Standard_ND96amsr_A100_v4": GpuShape("A100-80GB", 8, 96, 1900),
    "Standard_ND96isr_H100_v5": GpuShape("H100-80GB", 8, 96, 1900),
    "Standard_ND96isr_H200_v5": GpuShape("H200-141GB", 8, 96, 1850),
    "Standard_NC24ads_A100_v4": GpuShape("A100-80GB", 1, 24, 220),
    "Standard_NC48ads_A100_v4": GpuShape("A100-80GB", 2, 48, 440),
    "Standard_NC96ads_A100_v4": GpuShape("A100-80GB", 4, 96, 880),
    "Standard_NC40ads_H100_v5": GpuShape("H100-NVL-94GB", 1, 40, 320),
    "Standard_NC80adis_H100_v5": GpuShape("H100-NVL-94GB", 2, 80, 640),
    "Standard_NC4as_T4_v3": GpuShape("T4", 1, 4, 28),
    "Standard_NC8as_T4_v3": GpuShape("T4", 1, 8, 56),
    "Standard_NC16as_T4_v3": GpuShape("T4", 1, 16, 110),
    "Standard_NC64as_T4_v3": GpuShape("T4", 4, 64, 440),
    "Standard_NV36ads_A10_v5": GpuShape("A10", 1, 36, 440),
    "Standard_NV72ads_A10_v5": GpuShape("A10", 2, 72, 880),
    "Standard_NC6s_v3": GpuShape("V100-16GB", 1, 6, 112),
    "Standard_NC12s_v3": GpuShape("V100-16GB", 2, 12, 224),
    "Standard_NC24s_v3": GpuShape("V100-16GB", 4, 24, 448),
    "Standard_NC24rs_v3": GpuShape("V100-16GB", 4, 24, 448),
}
# ARM is not consistent about the casing of size names it returns, so look them up case-blind.
_BY_LOWER = {name.lower(): shape for name, shape in _SIZES.items()}

# Sizes that get a slice of an A10 through vGPU (1/6, 1/3, 1/2): no whole GPU for the device plugin.
FRACTIONAL_GPU_SIZES = frozenset(
    s.lower() for s in ("Standard_NV6ads_A10_v5", "Standard_NV12ads_A10_v5", "Standard_NV18ads_A10_v5")
)


def gpu_shape(vm_size: str) -> GpuShape | None:
    return _BY_LOWER.get(vm_size.lower())


def is_gpu_size(vm_size: str) -> bool:
    """Whether the size is in an N-series (GPU) family, even one missing from the table."""
    name = vm_size.lower().removeprefix("standard_")
    return name.startswith(("nc", "nd", "nv")) or vm_size.lower() in FRACTIONAL_GPU_SIZES
