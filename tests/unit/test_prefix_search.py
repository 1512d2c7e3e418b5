"""`shortest_fitting_prefix`: the least number of runs to release before a probe answers, found on
the real cycle state, which is left exactly as it was."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.core.prefix_search import shortest_fitting_prefix
from controlplane.core.snapshot import LiveRun, Policy
from controlplane.core.state import CycleState
from controlplane.domain.model import PodAssignment
from tests.unit.builders import make_snapshot, single_pool_fleet
from tests.unit.test_schedule_properties import PROPERTY_SETTINGS


def _full_node(runs: int) -> tuple[CycleState, list[LiveRun]]:
    """One 8-GPU node, each of `runs` runs holding one of its GPUs."""
    clusters, nodes = single_pool_fleet(nodes=1)
    node = nodes[0]
    live = [
        LiveRun(
            workload_id=f"w{i}",
            queue_id="q1",
            cluster_id="c1",
            priority=0,
            assignments=(PodAssignment("worker", 0, node.id, {"gpu": 1}),),
            run_id=f"r{i}",
        )
        for i in range(runs)
    ]
    return CycleState(make_snapshot(clusters, nodes, live=live), Policy()), live


@PROPERTY_SETTINGS
@given(runs=st.integers(0, 8), needed=st.integers(0, 9), all_first=st.booleans())
def test_it_finds_the_shortest_prefix_and_leaves_the_state_as_it_was(runs: int, needed: int, all_first: bool) -> None:
    state, live = _full_node(runs)
    node_id = live[0].assignments[0].node_id if live else next(iter(state.free))
    before = {node: dict(free) for node, free in state.free.items()}
    probes: list[int] = []

    def probe() -> int | None:
        free = state.free[node_id].get("gpu", 0) - (8 - runs)  # the GPUs released so far
        probes.append(free)
        return free if free >= needed else None

    found = shortest_fitting_prefix(
        state, live, lambda run: state.give_back(run.assignments, run.queue_id, quota=False), probe, all_first
    )
    expected = max(needed, 1)  # at least one run is always released
    assert found == ((expected, expected) if expected <= runs else None)
    assert {node: dict(free) for node, free in state.free.items()} == before
    assert len(probes) <= 2 * max(runs, 1).bit_length() + 2  # logarithmic, not one probe per run


def test_the_state_is_left_as_it_was_when_the_probe_raises() -> None:
    state, live = _full_node(4)
    before = {node: dict(free) for node, free in state.free.items()}

    def probe() -> None:
        raise RuntimeError("boom")

    for all_first in (False, True):
        with pytest.raises(RuntimeError):
            shortest_fitting_prefix(
                state, live, lambda run: state.give_back(run.assignments, run.queue_id), probe, all_first
            )
        assert {node: dict(free) for node, free in state.free.items()} == before
