"""GPU fragmentation against the expected workload, and the placement score built on it.

A node's idle GPU capacity is only useful if the pods that will arrive can use it. Following
"Beware of Fragmentation" (Weng et al., USENIX ATC'23, FGD), the fragmentation of a node is the
idle GPU milli that the *expected next pod* cannot use, averaged over a workload mix of typical
pod shapes:

    F(node) = sum over typical pods m of  p_m * (idle milli on GPUs too small for m, if m fits;
                                                 all idle milli, if m does not fit at all)

A CPU-only pod, a pod that may not use the node's GPU model, and a pod that lacks CPU there all see
the whole idle GPU capacity as fragment. Memory is not part of the measure (as in FGD).

`placement_choice` is the placement score both the live scheduler and the trace simulator call:
how much a placement grows fragmentation (on FGD's coarse score scale), which GPU a sharing pod
should take, and whether it opens an untouched node; `Choice.cost()` is the number to minimise,
ties going to a fixed node order. `gang_fragmentation_cost` applies it to the live scheduler's
slot-based free capacity (`gpu`, `share`, `mig:*` counts) for a whole gang.

Nothing here does I/O, and the hot functions take plain values (tuples, ints) so the trace
simulator can call them a few million times per experiment.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from controlplane.domain.model import CPU, GPU, SHARE, NodePool, PodAssignment, PodSet, Workload
from controlplane.domain.sharing import SharingKind, mig_gpu_eq

MILLI = 1000  # milli-GPU in one GPU

# A node's free GPU capacity, one entry per GPU in milli-GPU, largest first (the canonical order:
# which physical GPU holds which share does not change fragmentation).
GpuFree = tuple[int, ...]


@dataclass(frozen=True)
class PodShape:
    """What a pod asks of one node: CPU, GPUs (count x per-GPU milli) and allowed GPU models."""

    cpu_milli: int
    gpu_milli: int = 0  # per GPU: below 1000 only for a pod sharing one GPU
    gpu_count: int = 0
    gpu_models: frozenset[str] = frozenset()  # empty: any model

    @property
    def shares_gpu(self) -> bool:
        return self.gpu_count == 1 and 0 < self.gpu_milli < MILLI

    @property
    def total_gpu_milli(self) -> int:
        return self.gpu_milli * self.gpu_count

    def allows(self, gpu_model: str) -> bool:
        return not self.gpu_models or gpu_model in self.gpu_models

    def sort_key(self) -> tuple[int, int, int, str]:
        return (self.cpu_milli, self.gpu_milli, self.gpu_count, "|".join(sorted(self.gpu_models)))


@dataclass(frozen=True)
class TypicalPod:
    shape: PodShape
    weight: float  # probability that the next pod has this shape


# Per GPU model, precomputed for the hot loop: the weight of typical pods that see every idle GPU
# as fragment (CPU-only pods, pods barred from the model), and the GPU pods that may use it as
# (per-GPU milli, count, cpu, weight) rows grouped by per-GPU milli.
_Rows = tuple[tuple[int, tuple[tuple[int, int, float], ...]], ...]


class WorkloadMix:
    """The expected shape of the next pod: typical pod shapes with their probabilities."""

    __slots__ = ("_tables", "pods")

    def __init__(self, pods: Sequence[TypicalPod]) -> None:
        total = sum(p.weight for p in pods)
        if total <= 0:
            raise ValueError("a workload mix needs at least one pod shape with positive weight")
        self.pods = tuple(TypicalPod(p.shape, p.weight / total) for p in pods)
        self._tables: dict[str, tuple[float, _Rows]] = {}

    @classmethod
    def from_counts(cls, counts: Mapping[PodShape, float], popularity: float = 0.95) -> WorkloadMix:
        """The most frequent shapes that together cover `popularity` of the pods (FGD's "typical
        pods": rare shapes add cost to every evaluation and barely move the expectation).

        Ties in frequency are broken by the shape itself (larger first), so the mix does not
        depend on the order pods were counted in.
        """
        ranked = sorted(counts.items(), key=lambda item: (item[1], *item[0].sort_key()), reverse=True)
        total = sum(counts.values())
        chosen: list[TypicalPod] = []
        covered = 0.0
        for shape, count in ranked:
            if covered >= popularity * total:
                break
            chosen.append(TypicalPod(shape, count))
            covered += count
        return cls(chosen)

    @classmethod
    def of(cls, shapes: Iterable[PodShape], popularity: float = 0.95) -> WorkloadMix:
        counts: dict[PodShape, float] = {}
        for shape in shapes:
            counts[shape] = counts.get(shape, 0.0) + 1.0
        return cls.from_counts(counts, popularity)

    def table(self, gpu_model: str) -> tuple[float, _Rows]:
        found = self._tables.get(gpu_model)
        if found is None:
            always = 0.0
            groups: dict[int, list[tuple[int, int, float]]] = {}
            for pod in self.pods:
                shape = pod.shape
                if shape.gpu_milli == 0 or not shape.allows(gpu_model):
                    always += pod.weight
                else:
                    groups.setdefault(shape.gpu_milli, []).append((shape.gpu_count, shape.cpu_milli, pod.weight))
            rows = tuple((milli, tuple(group)) for milli, group in sorted(groups.items(), reverse=True))
            found = self._tables[gpu_model] = (always, rows)
        return found


def node_fragmentation(mix: WorkloadMix, gpu_model: str, cpu_free: int, gpus: GpuFree) -> float:
    """F(node) in milli-GPU: idle GPU capacity the expected next pod cannot use (see module doc).

    `gpus` must be sorted largest first.
    """
    idle = sum(gpus)
    if idle == 0:
        return 0.0
    always, rows = mix.table(gpu_model)
    frag = always * idle
    # Rows come by per-GPU milli, largest first, and GPUs largest first: the GPUs big enough for a
    # row are a prefix that only grows from one row to the next.
    big_count = 0
    big_sum = 0
    n = len(gpus)
    for milli, group in rows:
        while big_count < n and gpus[big_count] >= milli:
            big_sum += gpus[big_count]
            big_count += 1
        small = idle - big_sum
        for count, cpu, weight in group:
            if cpu_free >= cpu and big_count >= count:
                frag += weight * small
            else:
                frag += weight * idle
    return frag


def take(gpus: GpuFree, shape: PodShape, share_from: int = MILLI) -> GpuFree:
    """The free GPUs after `shape` takes its GPUs: a sharing pod takes `gpu_milli` from a GPU with
    `share_from` free milli, a whole-GPU pod takes `gpu_count` fully free GPUs."""
    if shape.gpu_count == 0:
        return gpus
    out = list(gpus)
    if shape.shares_gpu:
        out[out.index(share_from)] -= shape.gpu_milli
    else:
        taken = 0
        for i, free in enumerate(out):
            if free == MILLI and taken < shape.gpu_count:
                out[i] = 0
                taken += 1
        if taken < shape.gpu_count:
            raise ValueError("not enough fully free GPUs")
    out.sort(reverse=True)
    return tuple(out)


def fits(gpus: GpuFree, shape: PodShape) -> bool:
    """Whether the GPUs (sorted largest first) can hold the pod's GPU request."""
    if shape.gpu_count == 0:
        return True
    if shape.shares_gpu:
        return bool(gpus) and gpus[0] >= shape.gpu_milli
    return len(gpus) >= shape.gpu_count and gpus[shape.gpu_count - 1] == MILLI


@dataclass(frozen=True)
class Choice:
    """How a pod would land on a node: fragmentation growth and the GPU a sharing pod takes."""

    frag_delta: float  # milli-GPU of fragmentation the placement adds (may be negative)
    share_from: int  # free milli of the GPU a sharing pod takes (MILLI for other pods)
    leftover: int  # free GPU milli left on the node afterwards
    opens_node: bool = False  # no GPU of the node was in use before

    def cost(self) -> float:
        """What the scheduler minimises (see `placement_choice`): 0 for a placement that leaves
        fragmentation as it was, about +1 per 40 milli-GPU it adds near zero, at most +/-50."""
        return (NEUTRAL_SCORE - fgd_score(self.frag_delta)) + (OPEN_NODE_COST if self.opens_node else 0.0)


NEUTRAL_SCORE = 50  # fgd_score(0): summed over a gang's nodes, a neutral node adds nothing
# Below one score step: opening an untouched node only loses to a used node of the same step.
OPEN_NODE_COST = 0.5


def fgd_delta(mix: WorkloadMix, gpu_model: str, cpu_free: int, gpus: GpuFree, shape: PodShape) -> Choice:
    """Fragmentation growth of placing `shape` on a node (FGD's Δ with the sign flipped), for a
    sharing pod on the GPU that grows it least (ties: the fullest such GPU). The pod must fit."""
    before = node_fragmentation(mix, gpu_model, cpu_free, gpus)
    cpu_after = cpu_free - shape.cpu_milli
    idle = sum(gpus)
    if not shape.shares_gpu:
        after = node_fragmentation(mix, gpu_model, cpu_after, take(gpus, shape))
        return Choice(after - before, MILLI, idle - shape.total_gpu_milli)
    best: Choice | None = None
    seen = -1
    for free in reversed(gpus):  # smallest first: ties go to the fullest GPU (best fit)
        if free < shape.gpu_milli or free == seen:
            continue
        seen = free
        after = node_fragmentation(mix, gpu_model, cpu_after, take(gpus, shape, free))
        if best is None or after - before < best.frag_delta:
            best = Choice(after - before, free, idle - shape.gpu_milli)
    if best is None:
        raise ValueError("the pod does not fit the node's GPUs")
    return best


def placement_choice(mix: WorkloadMix, gpu_model: str, cpu_free: int, gpus: GpuFree, shape: PodShape) -> Choice:
    """gpufleet's placement score for one pod on one node: `cost()`, lower wins, then node order.

    1. Fragmentation growth against the expected workload, on FGD's scale: 100 - int(100 *
       sigmoid(-growth / 1000 milli)). The coarse steps are deliberate: on openb, ranking nodes by
       the raw growth (or on a 2-4x finer scale) left 0.1-1 point more GPU unallocated than FGD's
       steps: the growth is a one-pod-ahead estimate whose small differences are noise that
       scatters pods, while equal steps fall through to a stable order.
    2. Within a step, a node that already runs GPU pods beats an untouched one (+0.5): untouched
       nodes stay whole for pods that need several GPUs, and partly used nodes fill up first.
    3. The caller breaks the remaining ties by a fixed node order (the live scheduler: node id;
       the FGD experiment: the seeded node rank), i.e. first fit, which packs consistently.

    The caller filters out nodes the pod does not fit (CPU, memory, GPUs, model).
    """
    choice = fgd_delta(mix, gpu_model, cpu_free, gpus, shape)
    # A CPU-only pod counts too: its CPU would shrink what an untouched node can take later.
    opens = bool(gpus) and all(free == MILLI for free in gpus)
    return Choice(choice.frag_delta, choice.share_from, choice.leftover, opens)


def fgd_score(delta: float) -> int:
    """FGD's node score for a fragmentation growth `delta` (milli-GPU): higher wins, 0..100."""
    return int(1.0 / (1.0 + math.exp(delta / MILLI)) * 100)


# --- the live scheduler's view ---------------------------------------------------------------------
#
# The scheduling core keeps a node's free capacity as slot counts (`gpu`, `share`, `mig:<profile>`,
# `cpu`, `mem`), not per-GPU milli. The functions below translate, assuming what best-fit
# placement produces: shares and MIG slices packed onto as few GPUs as possible.


def pod_shape(pod_set: PodSet) -> PodShape:
    """What one pod of `pod_set` asks of a node, in this module's terms."""
    models = frozenset(pod_set.gpu_models)
    if pod_set.mig_profile:
        return PodShape(pod_set.cpu_millis, round(MILLI * mig_gpu_eq(pod_set.mig_profile)), 1, models)
    if pod_set.gpu_fraction:
        milli = min(MILLI, max(1, round(pod_set.gpu_fraction * MILLI)))
        return PodShape(pod_set.cpu_millis, milli, 1, models)
    if pod_set.gpus:
        return PodShape(pod_set.cpu_millis, MILLI, pod_set.gpus, models)
    return PodShape(pod_set.cpu_millis)


def workload_mix(workloads: Iterable[Workload], popularity: float = 0.95) -> WorkloadMix | None:
    """The expected next pod from the pods of `workloads` (e.g. a cycle's pending gangs plus the
    recently admitted ones); None when they have no pods."""
    counts: dict[PodShape, float] = {}
    for workload in workloads:
        for shape, replicas in pods_of(workload):
            counts[shape] = counts.get(shape, 0.0) + replicas
    return WorkloadMix.from_counts(counts, popularity) if counts else None


def pods_of(workload: Workload) -> list[tuple[PodShape, int]]:
    """Each pod set's shape and replicas (a pod set that cannot be read is left out: it fails in
    its gang's own turn, with a reason)."""
    pods = []
    for pod_set in workload.pod_sets:
        try:
            pods.append((pod_shape(pod_set), pod_set.replicas))
        except Exception:  # noqa: S112
            continue
    return pods


class KeptMix:
    """`workload_mix` of a window of pending gangs that moves a little from one cycle to the next
    (the oldest few thousand), kept by what joined and left it: the same mix, a fraction of the
    work. Counts are sums of whole replicas, exact in floats whatever the order they are added in."""

    def __init__(self, popularity: float = 0.95) -> None:
        self.popularity = popularity
        self.members: dict[str, tuple[Workload, list[tuple[PodShape, int]]]] = {}
        self.counts: dict[PodShape, float] = {}
        self.mix: WorkloadMix | None = None

    def of(self, workloads: Sequence[Workload]) -> WorkloadMix | None:
        members, counts = self.members, self.counts
        now = {workload.id: workload for workload in workloads}
        changed = False
        for gang_id in [gang_id for gang_id, (kept, _) in members.items() if now.get(gang_id) is not kept]:
            for shape, replicas in members.pop(gang_id)[1]:
                left = counts[shape] - replicas
                if left:
                    counts[shape] = left
                else:
                    del counts[shape]
            changed = True
        for gang_id, workload in now.items():
            if gang_id not in members:
                pods = pods_of(workload)
                members[gang_id] = (workload, pods)
                for shape, replicas in pods:
                    counts[shape] = counts.get(shape, 0.0) + replicas
                changed = True
        if changed:
            self.mix = WorkloadMix.from_counts(counts, self.popularity) if counts else None
        return self.mix


def gpus_of_free(free: Mapping[str, int], pool: NodePool) -> GpuFree:
    """Per-GPU free milli of a node of `pool` from its free slots, largest first."""
    count = pool.gpus_per_node
    if pool.sharing.kind is SharingKind.EXCLUSIVE:
        whole = max(0, min(count, free.get(GPU, 0)))
        return (MILLI,) * whole + (0,) * (count - whole)
    if pool.sharing.kind is SharingKind.MIG:
        milli = sum(
            round(MILLI * mig_gpu_eq(key[4:])) * n for key, n in free.items() if key.startswith("mig:") and n > 0
        )
    else:
        milli = max(0, free.get(SHARE, 0)) * MILLI // pool.sharing.replicas
    whole, rest = divmod(min(milli, count * MILLI), MILLI)
    gpus = (MILLI,) * whole + ((rest,) if rest else ())
    return gpus + (0,) * (count - len(gpus))


def gang_fragmentation_cost(
    mix: WorkloadMix,
    workload: Workload,
    assignments: Iterable[PodAssignment],
    free: Mapping[str, Mapping[str, int]],
    pool_of_node: Mapping[str, NodePool],
    memo: dict[tuple[object, ...], tuple[float, int]] | None = None,
) -> float:
    """Sum of `placement_choice(...).cost()` over a gang's pods, each on its node as the pods
    before it left it (`free` is the capacity before the gang and is not modified).

    `memo` (owned by the caller, e.g. one scheduling cycle with one `mix`) remembers choices by
    (model, free CPU, free GPUs, shape): a fleet's nodes repeat the same few states, and the
    scheduler scores many candidate placements per gang.
    """
    pod_sets = {pod_set.name: pod_set for pod_set in workload.pod_sets}
    trial: dict[str, tuple[int, GpuFree]] = {}
    total = 0.0
    for assignment in assignments:
        node_id = assignment.node_id
        pool = pool_of_node[node_id]
        state = trial.get(node_id)
        if state is None:
            node_free = free[node_id]
            state = (node_free.get(CPU, 0), gpus_of_free(node_free, pool))
        cpu_free, gpus = state
        shape = pod_shape(pod_sets[assignment.pod_set])
        if not shape.allows(pool.gpu_model) or not fits(gpus, shape):
            continue  # the slot view disagrees with the placement (e.g. MIG geometry): no opinion
        key = (pool.gpu_model, cpu_free, gpus, shape)
        known = memo.get(key) if memo is not None else None
        if known is None:
            choice = placement_choice(mix, pool.gpu_model, cpu_free, gpus, shape)
            known = (choice.cost(), choice.share_from)
            if memo is not None:
                memo[key] = known
        cost, share_from = known
        total += cost
        trial[node_id] = (cpu_free - shape.cpu_milli, take(gpus, shape, share_from))
    return total
