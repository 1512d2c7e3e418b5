"""Facts shared by the cloud adapters: GPU machine shapes and the MIG profile a cloud's setting names."""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.domain.sharing import MIG_PROFILES, mig_compute_slices


@dataclass(frozen=True)
class GpuShape:
    """A machine type's GPUs and capacity. `vcpus` and `memory_gib` are the instance's, not the node's
    allocatable (kubelet and system reservations are taken off by the cluster, not the cloud API)."""

    gpu_model: str
    gpus: int
    vcpus: int
    memory_gib: int

    @property
    def cpu_millis(self) -> int:
        return self.vcpus * 1000

    @property
    def memory_mib(self) -> int:
        return self.memory_gib * 1024


def mig_profile_for_slices(gpu_model: str, compute_slices: int) -> str | None:
    """The MIG profile with `compute_slices` compute slices and the least memory on `gpu_model`.

    Clouds that name MIG by compute slices only (AKS `MIG1g` ... `MIG7g`) mean the smallest-memory profile:
    on an A100-80GB `MIG1g` is 1g.10gb, not 1g.20gb. None when the model has no such profile.
    """
    table = MIG_PROFILES.get(gpu_model, {})
    candidates = [p for p in table if mig_compute_slices(p) == compute_slices]
    if not candidates:
        return None
    return min(candidates, key=lambda p: int(p.split(".")[1].removesuffix("gb")))


def mig_sharing(gpu_model: str, profile: str) -> tuple[str, str | None]:
    """The sharing string for a pool whose every GPU is cut into `profile`, or an issue when gpufleet's
    MIG tables do not know that (model, profile) pair."""
    if profile not in MIG_PROFILES.get(gpu_model, {}):
        return "exclusive", f"MIG profile {profile} on {gpu_model or 'an unknown GPU'} is not in gpufleet's MIG tables"
    return f"mig:all-{profile}", None
