"""The synthetic bench fleet: deterministic for a seed, and a fleet the scheduler could really see."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

import pytest

from controlplane.bench.synthetic import BenchSize, SyntheticFleet
from controlplane.core.capacity import why_never_fits
from controlplane.core.invariants import check_decision
from controlplane.core.schedule import schedule
from controlplane.core.snapshot import Policy
from controlplane.domain.model import GPU_EQ
from controlplane.domain.sharing import SharingKind

NOW = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
SMALL = BenchSize(pending=300, clusters=3, nodes=120, queues=12, seed=7)


def test_the_same_seed_gives_the_same_snapshot() -> None:
    assert SyntheticFleet(SMALL, NOW).snapshot() == SyntheticFleet(SMALL, NOW).snapshot()


def test_another_seed_gives_another_snapshot() -> None:
    other = BenchSize(pending=300, clusters=3, nodes=120, queues=12, seed=8)
    assert SyntheticFleet(SMALL, NOW).snapshot() != SyntheticFleet(other, NOW).snapshot()


def test_the_next_snapshot_is_deterministic_too() -> None:
    def follow_up() -> object:
        fleet = SyntheticFleet(SMALL, NOW)
        snapshot = fleet.snapshot()
        return fleet.next_snapshot(snapshot, schedule(snapshot, Policy(), NOW))

    assert follow_up() == follow_up()


def test_the_fleet_has_the_requested_size_and_mix() -> None:
    snapshot = SyntheticFleet(SMALL, NOW).snapshot()
    assert len(snapshot.clusters) == 3
    assert len(snapshot.nodes) == 120
    assert len(snapshot.pending) == 300
    assert len({w.id for w in snapshot.pending}) == 300
    leaves = [q for q in snapshot.queue_tree.values() if q.id.startswith("q-")]
    assert len(leaves) == 12
    assert all(q.limit.amounts.get(GPU_EQ) for q in leaves)
    kinds = Counter(p.sharing.kind for c in snapshot.clusters for p in c.pools)
    assert kinds[SharingKind.EXCLUSIVE]
    assert kinds[SharingKind.MIG]
    assert kinds[SharingKind.TIMESLICE]
    assert {w.queue_id for w in snapshot.pending} <= {q.id for q in leaves}


def test_live_runs_hold_about_half_the_gpus_without_over_committing_a_node() -> None:
    snapshot = SyntheticFleet(BenchSize(pending=0, clusters=2, nodes=400, queues=8, seed=3), NOW).snapshot()
    pools = snapshot.pools_by_id()
    nodes = {n.id: n for n in snapshot.nodes}
    held: dict[str, Counter[str]] = {}
    for run in snapshot.live_runs:
        for a in run.assignments:
            assert nodes[a.node_id].schedulable
            assert pools[nodes[a.node_id].pool_id].cluster_id == run.cluster_id
            held.setdefault(a.node_id, Counter()).update(a.demand)
    used = total = 0
    for node in snapshot.nodes:
        capacity = pools[node.pool_id].node_capacity()
        taken = held.get(node.id, Counter())
        assert all(taken[key] <= capacity.get(key, 0) for key in taken), node.id
        slots = [key for key in capacity if key not in ("cpu", "mem")]
        if node.schedulable:
            total += sum(capacity[key] for key in slots)
            used += sum(taken[key] for key in slots)
    assert 0.35 < used / total < 0.65


def test_every_pending_gang_could_run_somewhere_in_the_empty_fleet() -> None:
    """What submit checks: a gang no cluster could ever hold is refused, so the bench has none."""
    snapshot = SyntheticFleet(BenchSize(pending=200, clusters=2, nodes=200, queues=8, seed=5), NOW).snapshot()
    assert [w.id for w in snapshot.pending if why_never_fits(w, snapshot.clusters, snapshot.nodes)] == []


def test_a_cycle_over_the_synthetic_snapshot_keeps_the_invariants() -> None:
    fleet = SyntheticFleet(SMALL, NOW)
    snapshot = fleet.snapshot()
    decision = schedule(snapshot, Policy(), NOW)
    check_decision(snapshot, decision)
    assert decision.admissions  # half the fleet is free: some of the backlog fits
    assert decision.pending  # and the backlog is deeper than the fleet
    follow_up = fleet.next_snapshot(snapshot, decision, finished=5, arrivals=5)
    admitted = {a.workload_id for a in decision.admissions}
    assert len(follow_up.pending) == len(snapshot.pending) - len(admitted) + 5
    assert not admitted & {w.id for w in follow_up.pending}
    grown = len(decision.admissions) - len(decision.evictions) - 5
    assert len(follow_up.live_runs) == len(snapshot.live_runs) + grown
    check_decision(follow_up, schedule(follow_up, Policy(), NOW))


@pytest.mark.parametrize(
    "kwargs", [{"clusters": 0}, {"queues": 0}, {"nodes": 1, "clusters": 2}, {"occupancy": 1.5}, {"pending": -1}]
)
def test_impossible_sizes_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=r"bench fleet|occupancy"):
        BenchSize(**kwargs)  # type: ignore[arg-type]
