"""What every peer model needs: free GPUs per node, gang placement, and the queue tree's quotas
read as GPUs.

Placement is the same for every peer so that the comparison is about queueing, not packing: a
gang goes to one cluster (the simulator's runs are per cluster), each pod on the node with the
fewest free GPUs that still holds it (best fit), clusters tried from the fullest that can hold the
whole gang. Kubernetes peers leave this to kube-scheduler or their own node-scoring plugins;
Slurm's select/cons_tres also packs by best fit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from controlplane.core.decision import EvictionKind
from controlplane.core.snapshot import Admission, Eviction
from controlplane.domain.model import GPU, GPU_EQ, PodAssignment
from controlplane.tracesim.queueing.inputs import Fleet
from controlplane.tracesim.queueing.scheduler import PendingGang, RunningGang

POD_SET = "main"  # the simulator's one pod set per gang


class FreeGpus:
    """Free GPUs per node, by cluster. Copy it to plan without committing."""

    def __init__(self, by_cluster: dict[str, dict[str, int]]) -> None:
        self.by_cluster = by_cluster
        # Gang shapes (GPUs per pod, pods) that found no room since GPUs were last given back.
        # Whether identical pods fit is monotone in the free GPUs of each node (they fit iff the
        # nodes hold enough pod-sized slots), so a miss stays a miss until something is given
        # back; a long backlog then costs one failed placement per shape, not one per job.
        self.misses: set[tuple[int, int]] = set()

    @classmethod
    def of(cls, fleet: Fleet, running: Iterable[RunningGang]) -> FreeGpus:
        per_node = {pool.id: pool.gpus_per_node for cluster in fleet.clusters for pool in cluster.pools}
        by_cluster: dict[str, dict[str, int]] = {c.id: {} for c in fleet.clusters}
        for node in fleet.nodes:
            if node.schedulable:
                by_cluster[node.cluster_id][node.id] = per_node[node.pool_id]
        free = cls(by_cluster)
        for gang in running:
            free.take(gang.run.cluster_id, gang.run.assignments)
        return free

    def copy(self) -> FreeGpus:
        twin = FreeGpus({cluster: dict(nodes) for cluster, nodes in self.by_cluster.items()})
        twin.misses = set(self.misses)
        return twin

    def total(self) -> int:
        return sum(sum(nodes.values()) for nodes in self.by_cluster.values())

    def take(self, cluster: str, assignments: Iterable[PodAssignment]) -> None:
        nodes = self.by_cluster[cluster]
        for a in assignments:
            nodes[a.node_id] -= a.demand.get(GPU, 0)

    def give(self, cluster: str, assignments: Iterable[PodAssignment]) -> None:
        self.misses.clear()
        nodes = self.by_cluster[cluster]
        for a in assignments:
            nodes[a.node_id] += a.demand.get(GPU, 0)

    def holds(self, cluster: str, assignments: Iterable[PodAssignment]) -> bool:
        """Whether these exact assignments (a run's own nodes) fit now."""
        need: dict[str, int] = {}
        for a in assignments:
            need[a.node_id] = need.get(a.node_id, 0) + a.demand.get(GPU, 0)
        nodes = self.by_cluster[cluster]
        return all(nodes.get(node, 0) >= gpus for node, gpus in need.items())

    def place(self, gang: PendingGang) -> Admission | None:
        """Best-fit placement of the whole gang in one cluster, or None (all or nothing)."""
        shape = (gang.gpus_per_pod, gang.pods)
        if shape in self.misses:
            return None
        candidates = sorted((sum(nodes.values()), cluster) for cluster, nodes in self.by_cluster.items())
        for free_total, cluster in candidates:
            if free_total < gang.gpus:
                continue
            assignments = best_fit(self.by_cluster[cluster], gang.gpus_per_pod, gang.pods)
            if assignments is not None:
                return Admission(gang.id, cluster, assignments)
        self.misses.add(shape)
        return None

    def place_and_take(self, gang: PendingGang) -> Admission | None:
        admission = self.place(gang)
        if admission is not None:
            self.take(admission.cluster_id, admission.assignments)
        return admission


def best_fit(nodes: Mapping[str, int], gpus_per_pod: int, pods: int) -> tuple[PodAssignment, ...] | None:
    """Each pod on the node with the fewest free GPUs that still holds it (ties by node id)."""
    left = dict(nodes)
    out: list[PodAssignment] = []
    for index in range(pods):
        fitting = [(free, node) for node, free in left.items() if free >= gpus_per_pod]
        if not fitting:
            return None
        _, node = min(fitting)
        left[node] -= gpus_per_pod
        out.append(PodAssignment(POD_SET, index, node, {GPU: gpus_per_pod}))
    return tuple(out)


@dataclass(frozen=True)
class QueueQuota:
    """One queue's quota in GPUs (the tree's gpu-eq amounts; the simulated fleet has one GPU model,
    so one gpu-eq is one GPU)."""

    nominal: float  # the guarantee
    borrowing_limit: float | None  # most it may use above nominal; None = unbounded
    lending_limit: float | None  # most of its unused nominal others may use; None = all of it
    limit: float | None  # hard ceiling on what it may hold; None = none
    weight: float


def queue_quotas(fleet: Fleet) -> dict[str, QueueQuota]:
    out = {}
    for name, qid in fleet.queue_ids.items():
        node = fleet.tree[qid]
        out[name] = QueueQuota(
            nominal=float(node.guaranteed.amounts.get(GPU_EQ, 0.0)),
            borrowing_limit=_amount(node.borrowing_limit.amounts),
            lending_limit=_amount(node.lending_limit.amounts),
            limit=_amount(node.limit.amounts),
            weight=node.weight,
        )
    return out


def _amount(amounts: Mapping[str, float]) -> float | None:
    return float(amounts[GPU_EQ]) if GPU_EQ in amounts else None


def usage_by_queue(queues: Iterable[str], running: Iterable[RunningGang]) -> dict[str, float]:
    usage = dict.fromkeys(queues, 0.0)
    for gang in running:
        usage[gang.queue] += gang.gpus
    return usage


def ordered(gangs: Sequence[PendingGang]) -> list[PendingGang]:
    return sorted(gangs, key=lambda gang: gang.order)


def eviction(victim: RunningGang, kind: EvictionKind, beneficiary: PendingGang | None) -> Eviction:
    return Eviction(
        workload_id=victim.run.workload_id,
        run_id=victim.run_id,
        kind=kind,
        beneficiary=beneficiary.id if beneficiary else "",
        beneficiary_queue=beneficiary.queue if beneficiary else "",
        beneficiary_priority=beneficiary.priority if beneficiary else 0,
        victim_queue=victim.queue,
        victim_priority=victim.priority,
    )


def victims_until_fits(
    gang: PendingGang,
    pool: Sequence[RunningGang],
    free: FreeGpus,
    usage: Mapping[str, float],
    still_eligible: Callable[[RunningGang, Mapping[str, float]], bool],
    quota_fits: Callable[[Mapping[str, float]], bool],
) -> list[RunningGang]:
    """Victims taken from `pool` in its order (each only while `still_eligible` given the usage
    left after the ones already taken) until `gang` fits both its quota and the nodes; then the
    ones not needed are given back, newest choice kept. Empty when it cannot be made to fit."""
    trial_usage = dict(usage)
    trial_free = free.copy()

    def fits() -> bool:
        return quota_fits(trial_usage) and trial_free.place(gang) is not None

    chosen: list[RunningGang] = []
    for candidate in pool:
        if not still_eligible(candidate, trial_usage):
            continue
        chosen.append(candidate)
        trial_usage[candidate.queue] -= candidate.gpus
        trial_free.give(candidate.run.cluster_id, candidate.run.assignments)
        if fits():
            break
    else:
        return []
    for candidate in reversed(chosen[:-1]):
        trial_usage[candidate.queue] += candidate.gpus
        trial_free.take(candidate.run.cluster_id, candidate.run.assignments)
        if fits():
            chosen.remove(candidate)
        else:
            trial_usage[candidate.queue] -= candidate.gpus
            trial_free.give(candidate.run.cluster_id, candidate.run.assignments)
    return chosen
