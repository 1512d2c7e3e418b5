"""The scheduler ranks a gang's placements cluster by cluster and keeps each cluster's ranking
under its capacity stamp (`Fitter.parts_of`); merged, the parts must give exactly the order one
sort of all the placements `fits` finds gives, with the same best miss, after an admission
changed a cluster and after a trial on it was rolled back."""

from __future__ import annotations

from hypothesis import given

from controlplane.core.capacity import fits
from controlplane.core.fit import Fitter
from controlplane.core.fragmentation import workload_mix
from controlplane.core.placement import Placement
from controlplane.core.scoring import Scorer
from controlplane.core.snapshot import Policy
from controlplane.core.state import CycleState
from controlplane.domain.model import Workload
from tests.unit.test_schedule_properties import PROPERTY_SETTINGS, Scenario, scenarios


def _agrees(fitter: Fitter, scorer: Scorer, state: CycleState, workload: Workload) -> Placement | None:
    """Check one gang; its best placement, if any."""
    clusters = fitter.clusters
    prefer = fitter.policy.prefer_same_pool
    whole = fits(workload, clusters, state.nodes_by_pool, state.pool_of_node, state.free, prefer)
    expected = list(scorer.ranked([scorer.part(whole.placements, workload)], workload)) if whole.placements else []
    parts, best_miss = fitter.parts_of(workload, state.facts.shape_id(workload), clusters, state.free)
    got = list(scorer.ranked(parts, workload)) if parts else []
    assert got == expected
    assert best_miss == whole.best_miss
    return got[0] if got else None


@PROPERTY_SETTINGS
@given(scenarios())
def test_ranking_cluster_by_cluster_kept_under_stamps_is_one_sort_of_every_placement(scenario: Scenario) -> None:
    snapshot = scenario.snapshot
    policy = Policy()
    state = CycleState(snapshot, policy)
    scorer = Scorer(policy, state, workload_mix(snapshot.pending))
    fitter = Fitter(snapshot, policy, state, scorer)
    gangs = [w for w in snapshot.pending if not w.reducible]
    best = [_agrees(fitter, scorer, state, w) for w in gangs]
    # An admission changes one cluster's capacity (its stamp); a trial rolled back restores it.
    taken = next((p for p in best if p is not None), None)
    if taken is None:
        return
    trial = state.checkpoint()
    state.take(taken.assignments, gangs[0].queue_id)
    for workload in gangs:
        _agrees(fitter, scorer, state, workload)
    state.rollback(trial)
    for workload in gangs:
        _agrees(fitter, scorer, state, workload)
    state.take(taken.assignments, gangs[0].queue_id)
    for workload in gangs:
        _agrees(fitter, scorer, state, workload)
