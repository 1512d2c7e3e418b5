"""Which of a gang's feasible placements the scheduler prefers: lower score wins.

Terms, weighted by the policy: free GPU slots left on the nodes a placement touches (fit), how much
it fragments the fleet against the expected workload (FGD-style, `fragmentation.py`), what its
GPUs cost per hour (price), how many zones or racks it spans (topology) and whether it honours the
gang's spot preference.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Sequence

from controlplane.core.capacity import TOPOLOGY_LABELS
from controlplane.core.fragmentation import WorkloadMix, gang_fragmentation_cost
from controlplane.core.gpu_eq import gpu_eq_float
from controlplane.core.placement import Placement, gpu_slots
from controlplane.core.snapshot import Policy
from controlplane.core.state import CycleState
from controlplane.domain.model import Workload

# How many of the best placements by the cheap terms also get the fragmentation term.
FRAGMENTATION_CANDIDATES = 6

# (spread, cheap score, cluster id, position among the placements ranked together, placement):
# the first four order it, and no two entries of one part tie on them.
RankEntry = tuple[bool, float, str, int, Placement]
RankedPart = list[RankEntry]


def _rank_key(entry: RankEntry) -> tuple[bool, float, str, int]:
    return entry[0], entry[1], entry[2], entry[3]


class Scorer:
    def __init__(self, policy: Policy, state: CycleState, mix: WorkloadMix | None) -> None:
        self.policy = policy
        self.state = state
        self.mix = mix
        self.fragmentation_memo: dict[tuple[object, ...], tuple[float, int]] = {}

    def part(self, placements: list[Placement], workload: Workload) -> RankedPart:
        """Placements ranked by the cheap terms alone (`ranked` merges such parts): entries
        (spread, cheap score, cluster id, position in `placements`, placement), in order."""
        cheap = self._cheap
        entries = [(p.spread, cheap(p, workload), p.cluster_id, i, p) for i, p in enumerate(placements)]
        entries.sort()  # positions differ: no two entries compare their placements
        return entries

    def ranked(self, parts: Sequence[RankedPart], workload: Workload) -> Iterator[Placement]:
        """The placements of `parts` best first (lazily: most callers take the first). Every
        placement is ranked by the cheap terms (fit, price, topology, spot) and, of equal ones,
        the one of the lower cluster id and then the earlier one; the fragmentation term, which
        simulates the gang pod by pod, reorders only the best few. Parts of different clusters
        merge into the order one sort of all their placements would give."""
        total = sum(len(part) for part in parts)
        merged: Iterator[RankEntry] = (
            iter(parts[0]) if len(parts) == 1 else heapq.merge(*[part for part in parts if part], key=_rank_key)
        )
        if self.mix is None or total < 2:
            return (entry[4] for entry in merged)
        head = list(itertools.islice(merged, FRAGMENTATION_CANDIDATES))
        weight = self.policy.fragmentation_weight
        head.sort(key=lambda e: (e[0], e[1] + weight * self._fragmentation(e[4], workload), e[2]))
        return itertools.chain((entry[4] for entry in head), (entry[4] for entry in merged))

    def _cheap(self, placement: Placement, workload: Workload) -> float:
        """The cheap terms of `score`, which read only the placement and the gang's spot wish.
        The placement search hands out the same Placement objects for as long as its answer
        holds (across cycles, for a state kept across cycles), so they are scored once."""
        memo = self.state.cheap_scores
        if memo.policy is not self.policy:
            memo.reset(self.policy)
        key = (id(placement), workload.spot)
        found = memo.entries.get(key)
        if found is not None and found[0] is placement:
            return found[1]
        score = self.score(placement, workload, fragmentation=False)
        memo.remember(key, (placement, score))
        return score

    def _fragmentation(self, placement: Placement, workload: Workload) -> float:
        assert self.mix is not None
        # FGD-style: how much the gang grows the fleet's fragmentation against the expected
        # workload (the score `gpufleet dev sim placement` measures on the openb trace).
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
