"""The GPUs of a node as GPU Feature Discovery labels them and the device plugin advertises them
(provenance: the package docstring)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

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
    "L40S": GpuModel("NVIDIA-L40S", 46068, (8, 9)),
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
