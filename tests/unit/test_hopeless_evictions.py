"""Eviction attempts that no victim set can win are skipped, and skipping them changes nothing.

`Evictor._over_limit_without_all` answers "does a limit on the gang's chain block it even with
every candidate gone?" before the trial placements that would find it out one victim at a time.
It must be exact: the decisions with and without it are equal.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import replace
from unittest import mock

from hypothesis import given
from hypothesis import strategies as st

from controlplane.core.decision import QuotaLimit
from controlplane.core.eviction import Evictor
from controlplane.core.schedule import schedule
from controlplane.core.snapshot import Admission, LiveRun, Policy, Snapshot
from controlplane.domain.model import PodAssignment, Workload
from tests.unit.builders import (
    NOW,
    default_tree,
    gpus,
    live_run_of,
    make_queue,
    make_snapshot,
    make_workload,
    single_pool_fleet,
    tree_of,
)
from tests.unit.test_incremental_equivalence import POLICIES
from tests.unit.test_schedule_properties import PROPERTY_SETTINGS, Scenario, scenarios


def _without_shortcut() -> AbstractContextManager[object]:
    return mock.patch.object(Evictor, "_over_limit_without_all", return_value=False)


@PROPERTY_SETTINGS
@given(scenarios(), st.sampled_from(POLICIES))
def test_skipping_hopeless_eviction_attempts_never_changes_a_decision(scenario: Scenario, policy: Policy) -> None:
    with_shortcut = schedule(scenario.snapshot, policy, NOW)
    with _without_shortcut():
        without = schedule(scenario.snapshot, policy, NOW)
    assert with_shortcut == without


LIMITS = st.one_of(st.none(), st.integers(0, 24).map(float))
QUEUE_OF = {"q1": "t1", "q2": "t1", "q3": "t2"}


@st.composite
def fleets_near_their_limits(draw: st.DrawFn) -> Snapshot:
    """A full or nearly full pool whose runs belong to queues of one cohort at (or near) their
    limits, and gangs of every priority waiting: the ground where eviction attempts are hopeless
    or not by a few GPUs."""
    clusters, nodes = single_pool_fleet(nodes=draw(st.integers(1, 4)))
    tree = tree_of(
        make_queue("cohort", None, limit=draw(LIMITS)),
        make_queue("t1", "cohort", limit=draw(LIMITS)),
        make_queue("t2", "cohort", limit=draw(LIMITS)),
        *(make_queue(q, team, limit=draw(LIMITS)) for q, team in QUEUE_OF.items()),
    )
    live: list[LiveRun] = []
    for node in nodes:
        left = 8
        while left and draw(st.booleans()):
            size = draw(st.integers(1, left))
            left -= size
            queue = draw(st.sampled_from(sorted(QUEUE_OF)))
            gang = make_workload(f"run{len(live)}", gpus(size), queue=queue, team=QUEUE_OF[queue])
            gang = replace(gang, priority=draw(st.integers(0, 9)))
            assignment = PodAssignment("worker", 0, node.id, {"cpu": 1000, "mem": 4096, "gpu": size})
            live.append(live_run_of(Admission(gang.id, "c1", (assignment,)), gang))
    waiting = []
    for i in range(draw(st.integers(1, 3))):
        queue = draw(st.sampled_from(sorted(QUEUE_OF)))
        pod_set = gpus(draw(st.integers(1, 8)), draw(st.integers(1, 2)))
        waiting.append(
            make_workload(f"w{i}", pod_set, queue=queue, team=QUEUE_OF[queue], priority=draw(st.integers(0, 9)), seq=i)
        )
    return make_snapshot(clusters, nodes, waiting, tree=tree, live=live)


@PROPERTY_SETTINGS
@given(fleets_near_their_limits(), st.sampled_from(POLICIES))
def test_near_the_limits_skipping_hopeless_attempts_never_changes_a_decision(
    snapshot: Snapshot, policy: Policy
) -> None:
    with_shortcut = schedule(snapshot, policy, NOW)
    with _without_shortcut():
        without = schedule(snapshot, policy, NOW)
    assert with_shortcut == without


def _queue_at_its_limit_with_one_small_low_priority_run() -> Snapshot:
    """q1 (limit 16 GPUs) runs a 12-GPU gang at priority 9 and a 2-GPU gang at priority 0; another
    priority-9 gang of 8 GPUs waits: preempting the small run (the only lower-priority one) still
    leaves q1 at 10 + 8 > 16, so no victim set exists."""
    clusters, nodes = single_pool_fleet(nodes=4)
    big = make_workload("big", gpus(4, 3), priority=9)
    small = make_workload("small", gpus(2), priority=0)
    waiting = make_workload("urgent", gpus(8), priority=9)
    node_ids = [n.id for n in nodes]
    live = [
        live_run_of(Admission("big", "c1", _assign(big, node_ids[:3], 4)), big),
        live_run_of(Admission("small", "c1", _assign(small, node_ids[3:], 2)), small),
    ]
    return make_snapshot(clusters, nodes, [waiting], tree=default_tree(queue_limit=16), live=live)


def _assign(workload: Workload, node_ids: list[str], per_pod: int) -> tuple[PodAssignment, ...]:
    return tuple(
        PodAssignment("worker", i, node_id, {"cpu": 1000, "mem": 4096, "gpu": per_pod})
        for i, node_id in enumerate(node_ids)
    )


def test_a_queue_at_its_limit_does_not_try_victims_that_cannot_bring_it_under() -> None:
    snapshot = _queue_at_its_limit_with_one_small_low_priority_run()
    trials = mock.patch.object(Evictor, "_victims_in_cluster", autospec=True, side_effect=Evictor._victims_in_cluster)

    with trials as spy:
        decision = schedule(snapshot, Policy(), NOW)
    assert not decision.admissions
    assert not decision.evictions
    (pending,) = decision.pending
    assert isinstance(pending.why, QuotaLimit)
    assert spy.call_count == 0  # the shortcut answered: no trial placement was made

    with _without_shortcut(), trials as spy:
        assert schedule(snapshot, Policy(), NOW) == decision
    assert spy.call_count > 0  # without it the same answer costs trials
