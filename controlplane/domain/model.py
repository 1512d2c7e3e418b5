"""The domain vocabulary of DESIGN.md as plain, immutable values (no I/O)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from fractions import Fraction

from controlplane.domain.sharing import (
    SharingKind,
    SharingMode,
    mig_gpu_eq,
    shares_for_fraction,
)

# Capacity dimensions of a node. MIG slices are `mig:<profile>`.
GPU = "gpu"
SHARE = "share"
CPU = "cpu"  # millicores
MEM = "mem"  # MiB

# Taints that mark a node as a GPU node; gpufleet adds the toleration for the one of the pool it
# chooses, any other taint must be tolerated by the workload itself.
GPU_TAINT_KEYS = frozenset({"nvidia.com/gpu", "sku"})

# Label keys a workload may not set on its pods: gpufleet's own, and those the controllers
# gpufleet drives (Job, JobSet, Kueue, Volcano, scheduler-plugins) set or select on.
RESERVED_LABEL_PREFIXES = (
    "gpufleet.io/",
    "kueue.x-k8s.io/",
    "jobset.sigs.k8s.io/",
    "batch.kubernetes.io/",
    "scheduling.x-k8s.io/",
    "volcano.sh/",
)
RESERVED_LABEL_KEYS = frozenset({"app.kubernetes.io/managed-by", "controller-uid", "job-name"})


# The same rule as a pattern (ECMA-262 and Python) for the request schema: a key it matches is reserved.
RESERVED_LABEL_PATTERN = (
    "^("
    + "|".join(p.replace(".", r"\.") for p in RESERVED_LABEL_PREFIXES)
    + ")|^("
    + "|".join(k.replace(".", r"\.") for k in sorted(RESERVED_LABEL_KEYS))
    + ")$"
)


def reserved_label(key: str) -> bool:
    return key in RESERVED_LABEL_KEYS or key.startswith(RESERVED_LABEL_PREFIXES)


EXCLUSIVE = SharingMode(SharingKind.EXCLUSIVE)


class WorkloadState(StrEnum):
    QUEUED = "queued"
    ADMITTED = "admitted"
    DISPATCHING = "dispatching"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (WorkloadState.SUCCEEDED, WorkloadState.FAILED, WorkloadState.CANCELLED)

    @property
    def holds_capacity(self) -> bool:
        return self in (WorkloadState.ADMITTED, WorkloadState.DISPATCHING, WorkloadState.RUNNING)


class RunState(StrEnum):
    ADMITTED = "admitted"
    DISPATCHING = "dispatching"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"  # evicted by the scheduler; the workload went back to its queue

    @property
    def live(self) -> bool:
        return self in (RunState.ADMITTED, RunState.DISPATCHING, RunState.RUNNING)


class WorkloadKind(StrEnum):
    TRAINING = "training"
    INFERENCE = "inference"
    INTERACTIVE = "interactive"
    BATCH = "batch"


@dataclass(frozen=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True)
class Toleration:
    key: str
    operator: str = "Equal"  # Equal | Exists
    value: str = ""
    effect: str = ""  # empty tolerates every effect

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if not self.key:  # an empty key with Exists tolerates every taint, as in Kubernetes
            return self.operator == "Exists"
        if self.key != taint.key:
            return False
        return self.operator == "Exists" or self.value == taint.value


@dataclass(frozen=True)
class NodePool:
    id: str
    cluster_id: str
    name: str
    gpu_model: str
    gpus_per_node: int
    cpu_millis: int
    memory_mib: int
    sharing: SharingMode = EXCLUSIVE
    taints: tuple[Taint, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    price_per_gpu_hour: float = 0.0
    spot: bool = False
    node_count: int = 0
    # Extended resource serving each demand key (gpu, share, mig:<profile>) on this pool's nodes, as the
    # nodes advertise it; empty for the device plugin's defaults.
    resource_names: Mapping[str, str] = field(default_factory=dict)
    # The most shares one container may ask for: 1 where the device plugin refuses more (MPS, GKE
    # sharing, time-slicing with failRequestsGreaterThanOne); 0 when the pool sets no such limit.
    max_shares_per_pod: int = 0

    def node_capacity(self) -> dict[str, int]:
        capacity = {CPU: self.cpu_millis, MEM: self.memory_mib}
        if self.sharing.kind is SharingKind.EXCLUSIVE:
            capacity[GPU] = self.gpus_per_node
        elif self.sharing.kind is SharingKind.MIG:
            for profile, count in self.sharing.mig_slices_per_gpu(self.gpu_model).items():
                capacity[f"mig:{profile}"] = count * self.gpus_per_node
        else:
            capacity[SHARE] = self.gpus_per_node * self.sharing.replicas
        return capacity

    def untolerated_taints(self, tolerations: tuple[Toleration, ...]) -> list[Taint]:
        return [
            taint
            for taint in self.taints
            if taint.key not in GPU_TAINT_KEYS
            and taint.effect != "PreferNoSchedule"  # a preference, never a hard exclusion
            and not any(t.tolerates(taint) for t in tolerations)
        ]


@dataclass(frozen=True)
class Node:
    id: str
    cluster_id: str
    pool_id: str
    name: str
    schedulable: bool = True


@dataclass(frozen=True)
class Cluster:
    id: str
    name: str
    provider: str
    region: str = ""
    pools: tuple[NodePool, ...] = ()


@dataclass(frozen=True)
class PodSet:
    name: str
    replicas: int
    gpus: int = 0
    mig_profile: str | None = None
    gpu_fraction: float | None = None
    cpu_millis: int = 1000
    memory_mib: int = 4096
    gpu_models: tuple[str, ...] = ()
    # The fewest replicas the gang may start with (Kueue's PodSet `minCount`); None: all of them.
    # A gang with a minimum below `replicas` is admitted with the largest counts that fit, at least
    # every pod set's minimum (core/placement/partial.py); the counts are fixed for the run.
    min_replicas: int | None = None

    @property
    def least(self) -> int:
        """The fewest pods of this set a gang may be admitted with."""
        return self.replicas if self.min_replicas is None else self.min_replicas

    def gpu_eq_per_pod(self) -> Fraction:
        if self.mig_profile:
            return mig_gpu_eq(self.mig_profile)
        if self.gpu_fraction:
            return Fraction(self.gpu_fraction).limit_denominator(1000)
        return Fraction(self.gpus)

    def share_limit_refusal(self, pool: NodePool) -> str | None:
        """Why one pod of this set cannot get its GPU fraction on `pool`'s shared GPUs, or None.

        A share is one replica of a shared GPU, and one container asks for all of its shares at once;
        where the device plugin gives a container at most `max_shares_per_pod` of them (MPS always, GKE
        sharing, time-slicing with failRequestsGreaterThanOne), a fraction that needs more is refused by
        the kubelet at admission, so gpufleet refuses it first.
        """
        if not self.gpu_fraction or not pool.sharing.shared or pool.max_shares_per_pod < 1:
            return None
        shares = shares_for_fraction(self.gpu_fraction, pool.sharing.replicas)
        if shares <= pool.max_shares_per_pod:
            return None
        share = Fraction(1, pool.sharing.replicas)
        most = pool.max_shares_per_pod
        return (
            f"pod set {self.name} asks {self.gpu_fraction:g} GPU per pod, which is {shares} shares of "
            f"pool {pool.name} ({pool.sharing}: one share is {share} GPU), but the device plugin there gives "
            f"a container at most {most} share{'s' if most > 1 else ''}; ask for at most "
            f"{float(share * most):g} GPU per pod or use whole GPUs"
        )

    def demand_on(self, pool: NodePool) -> dict[str, int] | None:
        """What one pod takes from a node of `pool`, or None when the pool cannot serve it."""
        if self.gpu_models and pool.gpu_model not in self.gpu_models:
            return None
        demand = {CPU: self.cpu_millis, MEM: self.memory_mib}
        kind = pool.sharing.kind
        if self.mig_profile:
            if kind is not SharingKind.MIG:
                return None
            key = f"mig:{self.mig_profile}"
            if key not in pool.node_capacity():
                return None
            demand[key] = 1
        elif self.gpu_fraction:
            if not pool.sharing.shared or self.share_limit_refusal(pool) is not None:
                return None
            demand[SHARE] = shares_for_fraction(self.gpu_fraction, pool.sharing.replicas)
        elif self.gpus:
            if kind is not SharingKind.EXCLUSIVE:
                return None
            demand[GPU] = self.gpus
        return demand


@dataclass(frozen=True)
class Quota:
    """Per GPU model and/or model-agnostic `gpu-eq` amounts; a missing key means unbounded."""

    amounts: Mapping[str, float] = field(default_factory=dict)

    def exceeded_by(self, usage: Mapping[str, Fraction]) -> str | None:
        for key, bound in sorted(self.amounts.items()):
            if usage.get(key, Fraction(0)) > Fraction(bound).limit_denominator(10**6):
                return key
        return None


GPU_EQ = "gpu-eq"


@dataclass(frozen=True)
class QueueNode:
    """A node of the queue tree: a cohort, a team or a leaf queue."""

    id: str
    name: str
    parent_id: str | None
    guaranteed: Quota = Quota()
    limit: Quota = Quota()
    weight: float = 1.0
    borrowing_limit: Quota = Quota()  # most it may use above its guarantee; missing key = unbounded
    lending_limit: Quota = Quota()  # most of its unused guarantee others may borrow; missing = all


@dataclass(frozen=True)
class PriorityClass:
    name: str
    value: int
    preemptible: bool = True
    min_runtime_seconds: int = 0


@dataclass(frozen=True)
class Workload:
    id: str
    team_id: str
    queue_id: str
    name: str
    priority_class: str
    priority: int
    kind: WorkloadKind
    pod_sets: tuple[PodSet, ...]
    min_available: int
    requires_isolation: bool = False
    tolerations: tuple[Toleration, ...] = ()
    duration_seconds: float | None = None
    created_seq: int = 0
    preemptible: bool = True
    min_runtime_seconds: int = 0
    max_runtime_seconds: float | None = None
    spot: str = "allow"  # allow | prefer | avoid | never: how it treats spot (preemptible-by-cloud) pools
    same_pool: str = "preferred"  # preferred | required: may the gang span node pools of its cluster
    # False for a workload whose last run was reclaimed for idleness: it waits for free capacity
    # and never evicts anyone to get back (else its guarantee would take the GPUs straight back).
    may_evict: bool = True

    @property
    def total_pods(self) -> int:
        return sum(ps.replicas for ps in self.pod_sets)

    @property
    def reducible(self) -> bool:
        """Whether some pod set may start with fewer replicas than it asks for (partial admission)."""
        return any(ps.least < ps.replicas for ps in self.pod_sets)

    def gpu_eq(self) -> Fraction:
        return sum((ps.gpu_eq_per_pod() * ps.replicas for ps in self.pod_sets), Fraction(0))


@dataclass(frozen=True)
class PodAssignment:
    pod_set: str
    index: int
    node_id: str
    demand: Mapping[str, int]


@dataclass(frozen=True)
class Run:
    id: str
    workload_id: str
    attempt: int
    cluster_id: str
    epoch: int
    state: RunState
    assignments: tuple[PodAssignment, ...]
    created_at: datetime | None = None
