"""The cycle's state and its journal: every what-if is undone exactly, nested checkpoints keep or
undo their own part, and the placement indexes follow the rolled-back capacity."""

from __future__ import annotations

import copy
import os

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.core.placement import Placement, placements_in_cluster
from controlplane.core.snapshot import Policy, Snapshot
from controlplane.core.state import CycleState
from tests.unit.builders import gpus, live_run_of, make_snapshot, make_workload, run_schedule, single_pool_fleet
from tests.unit.test_schedule import two_team_tree

# Checkpoints and rollbacks come often: a change made again to a content it was made to before is
# what stamps must get right.
OPERATIONS = ("give back", "take", "hold", "unhold", "checkpoint", "checkpoint", "rollback", "rollback", "keep")


def _fleet_with_two_live_runs() -> Snapshot:
    clusters, nodes = single_pool_fleet(nodes=2)
    a = make_workload("a", gpus(4), queue="q1")
    b = make_workload("b", gpus(8), queue="q2", seq=2)
    decision = run_schedule(make_snapshot(clusters, nodes, [a, b], tree=two_team_tree()))
    by_id = {w.id: w for w in (a, b)}
    live = [live_run_of(adm, by_id[adm.workload_id]) for adm in decision.admissions]
    assert len(live) == 2
    return make_snapshot(clusters, nodes, [], tree=two_team_tree(), live=live)


def _picture(state: CycleState) -> tuple[object, ...]:
    return (
        {node: dict(free) for node, free in state.free.items()},
        copy.deepcopy(state.ledger.usage),
        dict(state.free_eq),
        sorted(state.live),
        {queue: sorted(runs) for queue, runs in state.live_by_queue.items()},
    )


def test_rollback_undoes_give_back_take_drop_and_holds_exactly() -> None:
    snapshot = _fleet_with_two_live_runs()
    state = CycleState(snapshot, Policy())
    before = _picture(state)
    run_a, run_b = snapshot.live_runs
    mark = state.checkpoint()
    state.give_back(run_a.assignments, run_a.queue_id)
    state.drop_live(run_a)
    state.give_back(run_b.assignments, run_b.queue_id, quota=False)
    held = state.hold_node(run_a.assignments[0].node_id)
    state.unhold_node(run_a.assignments[0].node_id, held)
    state.take(run_a.assignments, run_a.queue_id)
    assert _picture(state) != before
    state.rollback(mark)
    assert _picture(state) == before


def test_nested_checkpoints_keep_or_undo_their_part_and_the_outer_one_undoes_all() -> None:
    snapshot = _fleet_with_two_live_runs()
    state = CycleState(snapshot, Policy())
    before = _picture(state)
    run_a, run_b = snapshot.live_runs
    outer = state.checkpoint()
    state.give_back(run_a.assignments, run_a.queue_id)
    after_a = _picture(state)
    inner = state.checkpoint()
    state.give_back(run_b.assignments, run_b.queue_id)
    state.rollback(inner)
    assert _picture(state) == after_a
    kept = state.checkpoint()
    state.give_back(run_b.assignments, run_b.queue_id)
    after_both = _picture(state)
    state.keep(kept)
    assert _picture(state) == after_both
    state.rollback(outer)
    assert _picture(state) == before


def test_changes_outside_a_checkpoint_are_not_journaled() -> None:
    snapshot = _fleet_with_two_live_runs()
    state = CycleState(snapshot, Policy())
    run_a = snapshot.live_runs[0]
    state.give_back(run_a.assignments, run_a.queue_id)
    freed = _picture(state)
    mark = state.checkpoint()
    state.rollback(mark)
    assert _picture(state) == freed  # what happened before the checkpoint stays


def test_placement_indexes_follow_a_rollback() -> None:
    snapshot = _fleet_with_two_live_runs()
    state = CycleState(snapshot, Policy())
    cluster = snapshot.clusters[0]
    eight = make_workload("eight", gpus(8))
    assert not isinstance(placements_in_cluster(eight, cluster, state.nodes_by_pool, state.free), list)
    mark = state.checkpoint()
    run_b = next(r for r in snapshot.live_runs if r.workload_id == "b")
    state.give_back(run_b.assignments, run_b.queue_id)
    found = placements_in_cluster(eight, cluster, state.nodes_by_pool, state.free)
    assert isinstance(found, list)
    assert isinstance(found[0], Placement)
    state.rollback(mark)
    assert not isinstance(placements_in_cluster(eight, cluster, state.nodes_by_pool, state.free), list)


def test_a_cluster_stamp_names_one_content_and_a_rollback_restores_it() -> None:
    """A stamp names one content of a cluster's free capacity: what was worked out from that
    content holds while the stamp is the same (`CycleState.capacity_misses`, `fit_parts`). The
    same change made to the same stamp gets the stamp it got before (the content is the same);
    another change gets one never given before."""
    snapshot = _fleet_with_two_live_runs()
    state = CycleState(snapshot, Policy())
    run_a, _ = snapshot.live_runs
    cluster = run_a.cluster_id
    first = state.stamps[cluster]
    mark = state.checkpoint()
    state.give_back(run_a.assignments, run_a.queue_id)
    released = state.stamps[cluster]
    assert released != first
    state.rollback(mark)
    assert state.stamps[cluster] == first  # the same content again
    mark = state.checkpoint()
    state.give_back(run_a.assignments, run_a.queue_id, quota=False)
    assert state.stamps[cluster] == released  # the same change to the same content
    state.hold_node(run_a.assignments[0].node_id)
    held = state.stamps[cluster]
    assert held not in (first, released)  # another change: never given before
    state.rollback(mark)
    assert state.stamps[cluster] == first
    mark = state.checkpoint()
    state.hold_node(run_a.assignments[0].node_id)  # held from `first`, not from `released`
    assert state.stamps[cluster] not in (first, released, held)
    state.rollback(mark)


@settings(max_examples=int(os.environ.get("GPUFLEET_PROPERTY_EXAMPLES", "100")), deadline=None)
@given(st.lists(st.tuples(st.sampled_from(OPERATIONS), st.integers(0, 3)), max_size=30))
def test_equal_stamps_mean_equal_free_capacity_whatever_the_changes(steps: list[tuple[str, int]]) -> None:
    """Takes, give-backs, holds and unholds, nested checkpoints kept or rolled back: whenever a
    cluster's stamp is one seen before, its free capacity is what it was then."""
    snapshot = _fleet_with_two_live_runs()
    state = CycleState(snapshot, Policy())
    runs = list(snapshot.live_runs)
    nodes = sorted(state.free)
    seen: dict[tuple[str, int], dict[str, dict[str, int]]] = {}
    marks: list[int] = []
    holds: list[tuple[str, dict[str, int]]] = []

    def check() -> None:
        for cluster_id, node_ids in state.nodes_by_cluster.items():
            content = {node: dict(state.free[node]) for node in node_ids}
            key = (cluster_id, state.stamps.get(cluster_id, 0))
            assert seen.setdefault(key, content) == content

    check()
    for operation, which in steps:
        run = runs[which % len(runs)]
        node = nodes[which % len(nodes)]
        if operation == "give back":
            state.give_back(run.assignments, run.queue_id, quota=bool(which % 2))
        elif operation == "take":
            state.take(run.assignments, run.queue_id, quota=bool(which % 2))
        elif operation == "hold":
            holds.append((node, state.hold_node(node)))
        elif operation == "unhold" and holds:
            state.unhold_node(*holds.pop())
        elif operation == "checkpoint":
            marks.append(state.checkpoint())
        elif operation == "rollback" and marks:
            state.rollback(marks.pop())
            holds.clear()  # what they held may be undone with them
        elif operation == "keep" and marks:
            state.keep(marks.pop())
        check()


def test_the_usage_stamp_is_new_on_every_quota_change_and_restored_by_a_rollback() -> None:
    """The usage stamp names one content of the ledger's usage (the eviction's list of borrowing
    queues holds while it is the same); capacity alone leaves it as it is."""
    snapshot = _fleet_with_two_live_runs()
    state = CycleState(snapshot, Policy())
    run_a, run_b = snapshot.live_runs
    first = state.usage_stamp
    mark = state.checkpoint()
    state.give_back(run_a.assignments, run_a.queue_id, quota=False)
    assert state.usage_stamp == first
    state.give_back_quota([run_a])
    refunded = state.usage_stamp
    assert refunded != first
    state.rollback(mark)
    assert state.usage_stamp == first  # the same usage again
    mark = state.checkpoint()
    inner = state.checkpoint()
    state.give_back(run_b.assignments, run_b.queue_id)
    assert state.usage_stamp not in (first, refunded)  # never given twice
    state.keep(inner)
    state.take(run_b.assignments, run_b.queue_id)
    assert state.ledger.usage == _fleet_state_usage(snapshot)  # back to the same usage, by a new change
    assert state.usage_stamp not in (first, refunded)  # the stamp says changed: safe, never stale
    state.rollback(mark)
    assert state.usage_stamp == first


def _fleet_state_usage(snapshot: Snapshot) -> object:
    return CycleState(snapshot, Policy()).ledger.usage


def test_giving_back_quota_alone_is_the_quota_half_of_give_back() -> None:
    snapshot = _fleet_with_two_live_runs()
    state = CycleState(snapshot, Policy())
    runs = list(snapshot.live_runs)
    free = {node: dict(amounts) for node, amounts in state.free.items()}
    mark = state.checkpoint()
    for run in runs:
        state.give_back(run.assignments, run.queue_id)
    both = (copy.deepcopy(state.ledger.usage), dict(state.free_eq))
    state.rollback(mark)
    mark = state.checkpoint()
    state.give_back_quota(runs)
    assert (copy.deepcopy(state.ledger.usage), dict(state.free_eq)) == both
    assert {node: dict(amounts) for node, amounts in state.free.items()} == free  # capacity still held
    state.rollback(mark)
