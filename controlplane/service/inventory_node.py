"""One node as its cluster reports it: the value the inventory report carries and node pools are planned from.

A leaf module, so `node_pools.py` (the plan) and `inventory.py` (which applies it) both import it
without importing each other.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from controlplane.service.commands import TaintSpec
from controlplane.service.constraints import Strict

ResourceName = Annotated[str, Field(min_length=1, max_length=253)]
# A resource amount as the adapter parsed it: never negative (a negative `reserved` would add capacity).
Amount = Annotated[int, Field(ge=0, le=2**63 - 1)]
LabelKey = Annotated[str, Field(min_length=1, max_length=317)]  # 253 prefix + "/" + 63 name
LabelValue = Annotated[str, Field(max_length=63)]
AnnotationValue = Annotated[str, Field(max_length=1024)]
DemandKey = Annotated[str, Field(min_length=1, max_length=40, pattern=r"^(gpu|share|mig:[1-7]g\.[0-9]+gb)$")]


PodName = Annotated[str, Field(min_length=1, max_length=317)]  # namespace/name


class NonGpuPods(Strict):
    """Live pods on a GPU node that gpufleet did not place, that ask for no GPU resource and belong to
    no DaemonSet (nor are a node's static pods): work that the pool's GPU taint should keep off."""

    count: int = Field(ge=0, le=100_000)
    sample: list[PodName] = Field(default_factory=list, max_length=8)  # up to 8 `namespace/name`


class InventoryNode(Strict):
    """One node as its cluster reports it. The adapter that lists nodes reads the provider's and NVIDIA's
    labels (`adapters/kubernetes/nodes.py`) into the interpreted fields; `labels` and `annotations` keep
    the subset it read them from, for operators and for audit."""

    name: str = Field(min_length=1, max_length=253)
    pool: str = Field(default="", max_length=255)  # the pool key's value (label, or OKE's node-pool OCID)
    schedulable: bool  # not cordoned (spec.unschedulable is false)
    ready: bool  # the Ready condition is True
    gpu_product: str = Field(default="", max_length=100)  # GFD `nvidia.com/gpu.product`, as the node says
    gpu_model: str = Field(default="", max_length=40)  # gpufleet's name for it; "" when the node says none
    gpu_count: int = Field(default=0, ge=0, le=1024)  # physical GPUs
    sharing: str = Field(default="", max_length=80)  # gpufleet sharing mode; "" = not read (exclusive)
    # 1 when the device plugin refuses more than one shared replica per container (MPS, GKE sharing).
    shares_per_container: int = Field(default=0, ge=0, le=1024)
    # Extended resource that serves each gpufleet demand key here: gpu, share, mig:<profile>.
    gpu_resources: dict[DemandKey, ResourceName] = Field(default_factory=dict, max_length=16)
    # Quantities as integers: cpu in millicores, everything else in its base unit (memory in bytes).
    allocatable: dict[ResourceName, Amount] = Field(default_factory=dict, max_length=64)
    capacity: dict[ResourceName, Amount] = Field(default_factory=dict, max_length=64)
    # Requested by live pods gpufleet did not place (DaemonSets, system pods, other tenants), in the
    # units of `allocatable`: what a gang cannot have of this node. None: not known (pods not listed).
    reserved: dict[ResourceName, Amount] | None = Field(default=None, max_length=64)
    # GPU nodes only; None: not known (pods not listed, or a node without GPUs).
    non_gpu_pods: NonGpuPods | None = None
    instance_type: str = Field(default="", max_length=80)
    spot: bool = False
    taints: list[TaintSpec] = Field(default_factory=list, max_length=32)
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=64)
    annotations: dict[LabelKey, AnnotationValue] = Field(default_factory=dict, max_length=8)
    issues: list[Annotated[str, Field(max_length=300)]] = Field(default_factory=list, max_length=8)

    @property
    def has_gpus(self) -> bool:
        return self.gpu_count > 0 or bool(self.gpu_resources)
