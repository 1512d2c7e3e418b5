"""Which of a gang's feasible placements the scheduler prefers: lower score wins.

Terms, weighted by the policy: free GPU slots left on the nodes a placement touches (fit), how much
it fragments the fleet against the expected workload (FGD-style, `fragmentation.py`), what its
GPUs cost per hour (price), how many zones or racks it spans (topology) and whether it honours the
gang's spot preference.
"""

from __future__ import annotations

from controlplane.core.capacity import TOPOLOGY_LABELS
from controlplane.core.fragmentation import WorkloadMix, gang_fragmentation_cost
from controlplane.core.gpu_eq import gpu_eq_float
from controlplane.core.placement import Placement, gpu_slots
from controlplane.core.snapshot import Policy
from controlplane.core.state import CycleState
from controlplane.domain.model import Workload

# How many of the best placements by the cheap terms also get the fragmentation term.
FRAGMENTATION_CANDIDATES = 6


class Scorer:
    def __init__(self, policy: Policy, state: CycleState, mix: WorkloadMix | None) -> None:
        self.policy = policy
        self.state = state
        self.mix = mix
        self.fragmentation_memo: dict[tuple[object, ...], tuple[float, int]] = {}

    def ranked(self, placements: list[Placement], workload: Workload) -> list[Placement]:
        """Best first. Every placement gets the cheap terms (fit, price, topology, spot); the
        fragmentation term, which simulates the gang pod by pod, only the best few of them."""
        base = {id(p): self._cheap(p, workload) for p in placements}
        ranked = sorted(placements, key=lambda p: (p.spread, base[id(p)], p.cluster_id))
        if self.mix is None or len(ranked) < 2:
            return ranked
        head, tail = ranked[:FRAGMENTATION_CANDIDATES], ranked[FRAGMENTATION_CANDIDATES:]
        weight = self.policy.fragmentation_weight
        head.sort(key=lambda p: (p.spread, base[id(p)] + weight * self._fragmentation(p, workload), p.cluster_id))
        return head + tail

    def _cheap(self, placement: Placement, workload: Workload) -> float:
        """The cheap terms of `score`, which read only the placement and the gang's spot wish.
        The placement search hands out the same Placement objects for as long as its answer
        holds (across cycles, for a state kept across cycles), so they are scored once."""
        memo = self.state.cheap_scores
        if memo.policy is not self.policy:
            memo.reset(self.policy)
        key = (id(placement), workload.spot)
        found = memo.scores.get(key)
        if found is not None and found[0] is placement:
            return found[1]
        score = self.score(placement, workload, fragmentation=False)
        memo.remember(key, placement, score)
        return score

    def _fragmentation(self, placement: Placement, workload: Workload) -> float:
        assert self.mix is not None
        # FGD-style: how much the gang grows the fleet's fragmentation against the expected
        # workload (the score `gpufleet sim placement` measures on the openb trace).
        state = self.state
        return gang_fragmentation_cost(
            self.mix, workload, placement.assignments, state.free, state.pool_of_node, self.fragmentation_memo
        )

    def score(self, placement: Placement, workload: Workload | None = None, fragmentation: bool = True) -> float:
        """Lower is better: free GPU slots left on the nodes it touches (fit), nodes it leaves
        partly used (fragmentation) and what its GPUs cost per hour (price), weighted by the policy."""
        pool_of_node = self.state.pool_of_node
        touched: dict[str, int] = {}
        price = 0.0
        for a in placement.assignments:
            slots = gpu_slots(a.demand)
            touched[a.node_id] = touched.get(a.node_id, 0) + slots
            pool = pool_of_node[a.node_id]
            if slots and pool.price_per_gpu_hour:
                price += gpu_eq_float(a.demand, pool) * pool.price_per_gpu_hour
        if not fragmentation:
            fragments = 0.0
        elif self.mix is not None and workload is not None:
            fragments = self._fragmentation(placement, workload)
        else:
            free = self.state.free
            fragments = sum(1 for node_id, taken in touched.items() if gpu_slots(free[node_id]) > taken)
        pools = list({pool_of_node[node_id].id: pool_of_node[node_id] for node_id in touched}.values())
        # Topology: a gang spread over pools in different zones or racks talks across them.
        domains = sum(len({p.labels.get(label) for p in pools}) - 1 for label in TOPOLOGY_LABELS)
        spot = 0.0
        if workload is not None and workload.spot in ("prefer", "avoid"):
            on_spot = sum(1 for p in pools if p.spot) / len(pools) if pools else 0.0
            spot = on_spot if workload.spot == "avoid" else 1.0 - on_spot
        policy = self.policy
        return (
            policy.fit_weight * placement.leftover_gpu_slots
            + policy.fragmentation_weight * fragments
            + policy.price_weight * price
            + policy.topology_weight * domains
            + policy.spot_weight * spot
        )
