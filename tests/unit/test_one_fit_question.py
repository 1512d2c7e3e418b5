"""Submit validation, the autoscaler and the scheduler ask one fit question on one capacity model
(`controlplane.core.capacity`), so they agree on what fits, `same_pool` included."""

from __future__ import annotations

from dataclasses import replace

from controlplane.core.capacity import FleetCapacity, why_never_fits
from controlplane.core.decision import PendingKind
from controlplane.domain.model import Cluster, Node
from controlplane.service.autoscale import decide
from controlplane.service.cloud_state import CloudPoolRecord
from tests.unit.builders import (
    NOW,
    gpus,
    make_cluster,
    make_nodes,
    make_pool,
    make_snapshot,
    make_workload,
    reason_of,
    run_schedule,
)


def _two_pools_of_one_node() -> tuple[tuple[Cluster, ...], tuple[Node, ...]]:
    a, b = make_pool("pa", gpus_per_node=8), make_pool("pb", gpus_per_node=8)
    return (make_cluster("c1", a, b),), make_nodes(a, 1) + make_nodes(b, 1)


def _record(pool_id: str, max_size: int) -> CloudPoolRecord:
    return CloudPoolRecord(pool_id, "c1", "c1", "eks", pool_id, 1, 0, max_size, None, None, None, False)


def test_a_gang_that_must_stay_in_one_pool_fits_nowhere_the_scheduler_would_not_place_it() -> None:
    clusters, nodes = _two_pools_of_one_node()
    gang = replace(make_workload("g", gpus(8, 2)), same_pool="required")
    spread = make_workload("s", gpus(8, 2))
    fleet = FleetCapacity(clusters, nodes)
    assert fleet.fits(gang).placements == []
    assert fleet.fits(spread).placements
    # submit: refused with the same answer; the scheduler leaves it pending as one that never fits
    assert why_never_fits(gang, clusters, nodes) == (
        "same_pool is required, but only several node pools together could ever hold this gang"
    )
    decision = run_schedule(make_snapshot(clusters, nodes, [gang]))
    assert reason_of(decision, "g").startswith("never-fits:")
    assert "only several pools together could hold them" in reason_of(decision, "g")


def test_the_autoscaler_buys_a_node_for_a_gang_the_scheduler_cannot_place_over_two_pools() -> None:
    clusters, nodes = _two_pools_of_one_node()
    gang = replace(make_workload("g", gpus(8, 2)), same_pool="required")
    snapshot = make_snapshot(clusters, nodes, [gang])
    plan = decide(snapshot, {"g": PendingKind.NO_FIT}, [_record("pa", 3), _record("pb", 3)], NOW, cooldown=600)
    assert [(d.pool_id, d.current, d.target) for d in plan.decisions] == [("pa", 1, 2)]
    # A gang that may span pools fits the two nodes there are: nothing to buy.
    spread = make_workload("s", gpus(8, 2))
    plan = decide(
        make_snapshot(clusters, nodes, [spread]),
        {"s": PendingKind.NO_FIT},
        [_record("pa", 3), _record("pb", 3)],
        NOW,
        cooldown=600,
    )
    assert [d for d in plan.decisions if d.direction == "up"] == []


def test_the_autoscaler_buys_room_for_a_gang_with_minimums_at_its_full_counts_when_it_can() -> None:
    pool = make_pool("pa", gpus_per_node=8)
    clusters, nodes = (make_cluster("c1", pool),), make_nodes(pool, 1)
    workers = replace(gpus(8, 4), min_replicas=2)  # 4 workers of 8 GPUs, may start with 2
    gang = make_workload("g", workers, min_available=2)
    snapshot = make_snapshot(clusters, nodes, [gang])
    assert reason_of(run_schedule(snapshot), "g").startswith("never-fits:")  # one node: not even 2 workers
    reasons = {"g": PendingKind.NEVER_FITS}

    plan = decide(snapshot, reasons, [_record("pa", 5)], NOW, cooldown=600)
    # Room for all 4 workers, not only the 2 it may start with (it would then never grow).
    assert [(d.pool_id, d.current, d.target) for d in plan.decisions] == [("pa", 1, 4)]

    # When the pool's max size cannot hold it whole, room for as many as it can start with.
    plan = decide(snapshot, reasons, [_record("pa", 3)], NOW, cooldown=600)
    assert [(d.pool_id, d.current, d.target) for d in plan.decisions] == [("pa", 1, 2)]
