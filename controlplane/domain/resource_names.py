"""Which Kubernetes extended resource a pod asks for each GPU demand, on a pool's nodes: one rule
for the dispatcher's pod templates and for the check that refuses an override the nodes do not
advertise (a pod asking for a resource no node offers stays Pending for ever).

A cluster's Kubernetes settings may override the names (`gpu_resource` for whole GPUs,
`timeslice_resource` and `mps_resource` for shares, `mig_strategy` for MIG slices); otherwise a
pod asks for what the pool's nodes advertise, and failing that the NVIDIA device plugin's defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from controlplane.domain.model import GPU, SHARE
from controlplane.domain.sharing import SharingKind

GPU_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True)
class ResourceOverrides:
    """A cluster's overrides of the names (None: what the nodes advertise)."""

    gpu_resource: str | None = None
    timeslice_resource: str | None = None
    mps_resource: str | None = None
    mig_strategy: str | None = None  # "mixed" | "single"

    @classmethod
    def of(cls, settings: Mapping[str, object]) -> ResourceOverrides:
        def text(key: str) -> str | None:
            value = settings.get(key)
            return value if isinstance(value, str) and value else None

        return cls(text("gpu_resource"), text("timeslice_resource"), text("mps_resource"), text("mig_strategy"))


def requested_resource(
    key: str, sharing: SharingKind, advertised: Mapping[str, str], overrides: ResourceOverrides
) -> str | None:
    """The resource a pod asks for demand `key` (gpu, share, mig:<profile>) on nodes that advertise
    `advertised` (demand key -> name); None for a key that is no GPU demand, or a share on a pool
    that shares no GPUs."""
    if key == GPU:
        return overrides.gpu_resource or advertised.get(GPU) or GPU_RESOURCE
    if key == SHARE:
        if sharing is SharingKind.MPS:
            override = overrides.mps_resource
        elif sharing is SharingKind.TIMESLICE:
            override = overrides.timeslice_resource
        else:
            return None
        return override or advertised.get(SHARE) or GPU_RESOURCE
    if key.startswith("mig:") and len(key) > 4:
        if overrides.mig_strategy is not None:  # the cluster's setting wins over what nodes said
            return f"nvidia.com/mig-{key[4:]}" if overrides.mig_strategy == "mixed" else GPU_RESOURCE
        return advertised.get(key) or f"nvidia.com/mig-{key[4:]}"
    return None


def unadvertised(
    pool: str, sharing: SharingKind, advertised: Mapping[str, str], overrides: ResourceOverrides
) -> list[str]:
    """Sentences for each GPU demand of the pool whose requested resource its nodes do not
    advertise (empty when the nodes advertise nothing gpufleet knows of: then the names are the
    device plugin's defaults, which nothing here can check)."""
    problems = []
    for key, name in sorted(advertised.items()):
        asked = requested_resource(key, sharing, advertised, overrides)
        if asked is not None and asked != name:
            problems.append(
                f"pool {pool}'s nodes advertise {name} for {key}, but this cluster's settings make its pods "
                f"ask for {asked}, which no node offers: they would stay Pending"
            )
    return problems
