"""Where a gang may go this cycle: a placement on free nodes that also passes every quota rule.

`Fitter.place` asks the placement search (`placement.py`) for every feasible placement in the
fleet (or some clusters), ranks them (`scoring.py`) and returns the best one the quota ledger
accepts, trimming an elastic gang down to `min_available` pods (a gang with pod-set minimums down
to those, `fewer_pods`) if that is what fits; otherwise the precise reason it waits (no room,
isolation, a limit, a guarantee not lent). The counts of a gang with pod-set minimums are chosen by
the fit question itself (`capacity.fits`, `placement/partial.py`): the cycle gets a Placement.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from controlplane.core.capacity import fits, fits_in_cluster
from controlplane.core.decision import IsolationOnlyTimeSliced, NeverFits, NoFit, NotLent, OutsideGuarantee, Why
from controlplane.core.gang_facts import ShapeId
from controlplane.core.placement import FreeCapacity, Miss, Placement
from controlplane.core.quota import ZERO, Usage
from controlplane.core.scoring import RankedPart, Scorer
from controlplane.core.snapshot import Policy, Snapshot
from controlplane.core.state import CycleState
from controlplane.domain.model import Cluster, PodAssignment, Workload


def fewer_pods(workload: Workload, assignments: tuple[PodAssignment, ...]) -> tuple[PodAssignment, ...] | None:
    """The assignments with one pod less that the gang may still start with, or None.

    The last pod goes, as long as `min_available` are left; for a gang whose pod sets have
    minimums, the last pod (the highest index) of the last pod set still above its minimum, so
    every pod set keeps its minimum and its pods keep the indices 0..n-1.
    """
    if len(assignments) <= workload.min_available:
        return None
    if not workload.reducible:
        return assignments[:-1]
    placed = Counter(a.pod_set for a in assignments)
    least = {ps.name: ps.least for ps in workload.pod_sets}
    for i in range(len(assignments) - 1, -1, -1):
        name = assignments[i].pod_set
        if placed[name] > least.get(name, 0):
            return assignments[:i] + assignments[i + 1 :]
    return None


class Fitter:
    def __init__(self, snapshot: Snapshot, policy: Policy, state: CycleState, scorer: Scorer) -> None:
        self.clusters = snapshot.clusters
        self.nodes = snapshot.nodes
        self.policy = policy
        self.state = state
        self.scorer = scorer
        # Shapes that found no room on the real free capacity this cycle, with the reason: room
        # only shrinks until an eviction (`capacity_grew`).
        self.unplaceable: dict[ShapeId, Why] = {}
        # Shapes no cluster could hold even empty: kept with the state, which is rebuilt whenever
        # the fleet changes (so across cycles when the state is kept, `incremental.py`).
        self.never = state.never_fits_memo.setdefault(policy.prefer_same_pool, {})
        self.models_of: dict[ShapeId, tuple[str, ...]] = {}  # see `gpu_models`
        if state.fit_parts.policy != policy:  # its parts were ranked by another policy's weights
            state.fit_parts.reset(policy)

    def capacity_grew(self) -> None:
        self.unplaceable.clear()

    def has_room(self, workload: Workload, cluster: Cluster) -> bool:
        """Whether the gang has a placement on the cluster's free capacity, quota aside (the
        capacity half of `place`: it depends on that cluster's free capacity alone)."""
        state = self.state
        if not workload.reducible:
            return bool(self.parts_of(workload, state.facts.shape_id(workload), (cluster,), state.free)[0])
        answer = fits(
            workload, (cluster,), state.nodes_by_pool, state.pool_of_node, state.free, self.policy.prefer_same_pool
        )
        return bool(answer.placements)

    def place(
        self,
        workload: Workload,
        free: FreeCapacity | None = None,
        clusters: tuple[Cluster, ...] | None = None,
        use_cache: bool = True,
    ) -> Placement | Why:
        """The best placement that also passes every quota rule, or why there is none (on the
        cycle's free capacity unless `free` is given; in every cluster unless `clusters` is)."""
        state = self.state
        free = state.free if free is None else free
        shape = self.state.facts.shape_id(workload)
        use_cache = use_cache and free is state.free and clusters is None
        if use_cache and shape in self.unplaceable:
            return self.unplaceable[shape]
        chosen = self.clusters if clusters is None else clusters
        if workload.reducible:
            # Pod-set minimums: the fit question picks the counts, over all clusters at once.
            answer = fits(workload, chosen, state.nodes_by_pool, state.pool_of_node, free, self.policy.prefer_same_pool)
            parts = [self.scorer.part(answer.placements, workload)] if answer.placements else []
            best_miss = answer.best_miss
        else:
            parts, best_miss = self.parts_of(workload, shape, chosen, free)
        if not parts:
            no_fit = self.no_fit(workload, best_miss)
            if use_cache:
                self.unplaceable[shape] = no_fit
            return no_fit
        first_reason: Why | None = None
        for placement in self.scorer.ranked(parts, workload):
            assignments: tuple[PodAssignment, ...] | None = placement.assignments
            blocked: Why | None = None
            while assignments is not None:
                # Quota is charged for the pods placed, whatever the counts the gang asked for.
                blocked = self.quota_block(workload, state.unit.usage(assignments, state.pool_of_node))
                if blocked is None:
                    return replace(placement, assignments=assignments)
                # An elastic gang may start with fewer pods: drop one and ask again.
                assignments = fewer_pods(workload, assignments)
            first_reason = first_reason or blocked
        assert first_reason is not None
        return first_reason

    def parts_of(
        self, workload: Workload, shape: ShapeId, clusters: Sequence[Cluster], free: FreeCapacity
    ) -> tuple[list[RankedPart], Miss | None]:
        """`fits` of a gang asked as it is, cluster by cluster, each cluster's placements ranked
        by the cheap terms (`Scorer.part`), and the best miss. On the cycle's own capacity each
        cluster's part is kept with the state under the cluster's stamp, which names one content
        of its free capacity for the state's lifetime (a trial rolled back restores it): after an
        admission only that cluster is searched again, and a part found before a trial serves
        after it."""
        state = self.state
        memo = state.fit_parts if free is state.free else None
        prefer = self.policy.prefer_same_pool
        parts: list[RankedPart] = []
        best_miss: Miss | None = None
        stamps = state.stamps
        for cluster in clusters:
            key = (shape, cluster.id, stamps.get(cluster.id, 0))
            found = memo.entries.get(key) if memo is not None else None
            if found is None:
                answer = fits_in_cluster(workload, cluster, state.nodes_by_pool, state.pool_of_node, free, prefer)
                found = answer if isinstance(answer, Miss) else self.scorer.part(answer, workload)
                if memo is not None:
                    memo.remember(key, found)
            if isinstance(found, Miss):
                if best_miss is None or found.placed > best_miss.placed:
                    best_miss = found
            elif found:
                parts.append(found)
        return parts, best_miss

    def no_fit(self, workload: Workload, miss: Miss | None) -> Why:
        if workload.requires_isolation and self._only_time_sliced(workload):
            return IsolationOnlyTimeSliced()
        never = self.never_fits(workload)
        if never is not None:
            return never
        if miss is None:
            return NoFit(workload.min_available, None)
        return NoFit(workload.min_available, miss.detail, miss.placed)

    def never_fits(self, workload: Workload) -> NeverFits | None:
        """Why no cluster could hold the gang even with nothing running on the fleet as it stands
        (cordoned nodes do not count), or None when one could: then it only waits for room."""
        shape = self.state.facts.shape_id(workload)
        if shape in self.never:
            return self.never[shape]
        answer = self.state.empty_fleet().fits(workload, prefer_same_pool=self.policy.prefer_same_pool)
        found: NeverFits | None = None
        if not answer.placements:
            best = answer.best_miss
            if best is not None:
                found = NeverFits(workload.min_available, best.detail, best.placed)
            else:
                found = NeverFits(workload.min_available, None, only_over_pools=bool(self.clusters))
        self.never[shape] = found
        return found

    def gpu_models(self, workload: Workload) -> tuple[str, ...]:
        """The GPU models of the pools that serve some GPU pod set of the gang."""
        shape = self.state.facts.shape_id(workload)
        found = self.models_of.get(shape)
        if found is None:
            gpu_sets = [p for p in workload.pod_sets if p.gpu_eq_per_pod()]
            found = self.models_of[shape] = tuple(
                sorted(
                    {
                        pool.gpu_model
                        for pool in self.state.pools.values()
                        if any(p.demand_on(pool) is not None for p in gpu_sets)
                    }
                )
            )
        return found

    def _only_time_sliced(self, workload: Workload) -> bool:
        """Whether some pod set could be served by time-sliced pools and by nothing else."""
        pools = list(self.state.pools.values())
        for pod_set in workload.pod_sets:
            serving = [p for p in pools if pod_set.demand_on(p) is not None]
            if serving and all(not p.sharing.isolated for p in serving):
                return True
        return False

    def quota_block(self, workload: Workload, held: Usage) -> Why | None:
        ledger = self.state.ledger
        reason: Why | None = ledger.limit_block(workload.queue_id, held) or ledger.borrowing_block(
            workload.queue_id, held
        )
        if reason is not None:
            return reason
        if ledger.within_guarantee(workload.queue_id, held):
            return None
        if not workload.preemptible:
            return OutsideGuarantee()
        protected = ledger.protected(self.state.lenders, excluding=workload.queue_id, awaited=self.state.awaited)
        free_eq = self.state.free_eq
        for key, keep in protected.items():
            want = held.get(key, ZERO)
            if want and free_eq.get(key, ZERO) - want < keep:
                return NotLent(key)
        return None
