"""Node scores of the placement policies the FGD paper compares, and gpufleet's own.

Every score here is computed for a node the pod fits (CPU, memory, GPUs, GPU model); higher wins
and ties go to the node with the lowest rank (FGD's randomly prefixed node name). The baselines
follow hkust-adsl/kubernetes-scheduler-simulator (`pkg/simulator/plugin/*_score.go`), including
their integer truncation, because truncation decides how often the tie-break picks the node.

A score also says which GPU a sharing pod takes, as the free milli of that GPU (the node's GPUs
are kept sorted, so a free amount names a GPU as well as an index would).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from controlplane.core.fragmentation import (
    MILLI,
    GpuFree,
    PodShape,
    WorkloadMix,
    fgd_delta,
    fgd_score,
    placement_choice,
)

MAX_SPEC_CPU = 128_000  # milli-CPU: the simulator's normalisation constants
MAX_SPEC_GPU = 8_000  # milli-GPU

NO_GPU = ""  # affinity class of a CPU-only pod (GpuClustering ignores it)

# (gpu model, free cpu, free GPUs, affinity classes on the node, pod) -> (score, GPU for a sharing pod)
ScoreFn = Callable[[str, int, GpuFree, frozenset[str], PodShape], tuple[float, int]]


def affinity_class(shape: PodShape) -> str:
    """GpuClustering's class of a pod: `share`, `<n>-gpu`, or none for CPU-only pods."""
    if shape.gpu_count == 0:
        return NO_GPU
    return "share" if shape.shares_gpu else f"{shape.gpu_count}-gpu"


def best_fit_gpu(gpus: GpuFree, shape: PodShape) -> int:
    """The fitting GPU with the least free milli (the simulator's default GPU selection)."""
    if not shape.shares_gpu:
        return MILLI
    chosen = MILLI
    for free in gpus:  # largest first: the last one that fits is the tightest
        if free < shape.gpu_milli:
            break
        chosen = free
    return chosen


def bestfit(_model: str, cpu: int, gpus: GpuFree, _tags: frozenset[str], shape: PodShape) -> tuple[float, int]:
    score = 0.0
    score += (cpu - shape.cpu_milli) / MAX_SPEC_CPU * 0.5
    score += (sum(gpus) - shape.total_gpu_milli) / MAX_SPEC_GPU * 0.5
    # int64 truncation as in the plugin (its min-max normalisation keeps the same maximum).
    return float(int((1.0 - score) * 100)), best_fit_gpu(gpus, shape)


def packing(_model: str, _cpu: int, gpus: GpuFree, _tags: frozenset[str], shape: PodShape) -> tuple[float, int]:
    if shape.gpu_count == 0:
        return 0.0, MILLI  # CPU-only pods: every node scores 0, node order decides
    fully_free = sum(1 for free in gpus if free == MILLI)
    if fully_free == len(gpus):  # case 3: an empty node
        return float(max(100 // 3 - fully_free, fully_free)), best_fit_gpu(gpus, shape)
    needed = shape.gpu_count
    fully_free_used = 0
    used: list[int] = []
    for free in reversed(gpus):  # least free first
        if needed == 0:
            break
        if shape.gpu_milli <= free:
            needed -= 1
            used.append(free)
            if free == MILLI:
                fully_free_used += 1
    if fully_free_used > 0:  # case 2: must open fully free GPUs on a used node
        return float(max(100 // 2 - fully_free_used, 100 // 3)), best_fit_gpu(gpus, shape)
    ratio = sum(free * 100 // MILLI for free in used)  # case 1: only already shared GPUs
    return float(max(100 - ratio // 10, 100 // 2)), best_fit_gpu(gpus, shape)


def clustering(_model: str, _cpu: int, gpus: GpuFree, tags: frozenset[str], shape: PodShape) -> tuple[float, int]:
    tag = affinity_class(shape)
    if tag == NO_GPU:
        return 0.0, MILLI
    busy = 100 // 4 * (MAX_SPEC_GPU - sum(gpus)) // MAX_SPEC_GPU
    # Bands: only this class on the node (75), this class among others (50), an idle node (25),
    # other classes only (0); within a band, busier nodes win.
    band = (75 if len(tags) == 1 else 50) if tag in tags else 25 if not tags else 0
    return float(busy + band), best_fit_gpu(gpus, shape)


def dotprod(_model: str, cpu: int, gpus: GpuFree, _tags: frozenset[str], shape: PodShape) -> tuple[float, int]:
    # dimExtMethod=merge, normMethod=max: (free CPU, total free GPU) . (request), both over max spec.
    dot = (cpu / MAX_SPEC_CPU) * (shape.cpu_milli / MAX_SPEC_CPU)
    dot += (sum(gpus) / MAX_SPEC_GPU) * (shape.total_gpu_milli / MAX_SPEC_GPU)
    return float(int(100 * (1 - dot / 2))), best_fit_gpu(gpus, shape)


@dataclass(frozen=True)
class FragmentationScore:
    """FGD (quantised, as published) or gpufleet's live placement score, against `mix`."""

    mix: WorkloadMix
    live: bool  # True: gpufleet's `placement_choice`; False: FGD's plugin

    def __call__(
        self, model: str, cpu: int, gpus: GpuFree, _tags: frozenset[str], shape: PodShape
    ) -> tuple[float, int]:
        if self.live:
            choice = placement_choice(self.mix, model, cpu, gpus, shape)
            return -choice.cost(), choice.share_from
        choice = fgd_delta(self.mix, model, cpu, gpus, shape)
        return float(fgd_score(choice.frag_delta)), choice.share_from


BASELINES: dict[str, ScoreFn] = {
    "bestfit": bestfit,
    "packing": packing,
    "clustering": clustering,
    "dotprod": dotprod,
}
POLICIES = ("gpufleet", "fgd", "bestfit", "packing", "clustering", "dotprod", "random")
