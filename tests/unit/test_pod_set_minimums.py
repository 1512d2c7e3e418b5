"""Per-pod-set minimums (issue 12, rule 7): Kueue-style partial admission in the pure core.

A pod set may start with as few as `min_replicas` of its replicas; the gang is admitted with the
largest counts that fit (full counts first), every pod set at least at its minimum, and quota is
charged for the pods placed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import replace

import pytest
from pydantic import ValidationError

from controlplane.core.capacity import FleetCapacity, why_never_fits
from controlplane.core.decision import Admission, NeverFits, NoFit, PendingKind, QuotaLimit
from controlplane.core.fit import fewer_pods
from controlplane.core.placement import Miss, at_counts, largest_fit, place_gang
from controlplane.domain.model import Cluster, Node, NodePool, PodAssignment, PodSet, Workload
from controlplane.service.commands import SubmitWorkload, gang_minimum
from tests.unit.builders import (
    cpu_only,
    default_tree,
    gpus,
    make_cluster,
    make_nodes,
    make_pool,
    make_snapshot,
    make_workload,
    run_schedule,
)
from tests.unit.test_placement import layout


def mpi(
    id: str = "mpi", *, workers: int = 4, least: int | None = 2, launcher_cpu: int = 2000, seq: int = 1
) -> Workload:
    """A launcher (1 of 1, CPU only) and 8-GPU workers that may start with `least` of `workers`."""
    pod_sets = (
        cpu_only(1, name="launcher", cpu_millis=launcher_cpu),
        replace(gpus(8, workers, name="workers", cpu_millis=8000), min_replicas=least),
    )
    return make_workload(id, *pod_sets, seq=seq, min_available=sum(ps.least for ps in pod_sets))


def fleet(nodes: int = 4, cpu_millis: int = 512_000) -> tuple[tuple[Cluster, ...], tuple[Node, ...], NodePool]:
    pool = make_pool(gpus_per_node=8, cpu_millis=cpu_millis)
    return (make_cluster("c1", pool),), make_nodes(pool, nodes), pool


def occupant(nodes: int) -> Workload:
    return make_workload("occupant", gpus(8, nodes), seq=0)


def counts(admission: Admission) -> dict[str, int]:
    return admission.pod_counts


# --- the reducer on its own --------------------------------------------------------------------


def _probe_log(room: dict[str, int]) -> tuple[list[tuple[int, ...]], Callable[[Workload], tuple[int, ...] | None]]:
    """An attempt that fits while every pod set stays within its own `room` (separate pools)."""
    seen: list[tuple[int, ...]] = []

    def attempt(gang: Workload) -> tuple[int, ...] | None:
        found = tuple(ps.replicas for ps in gang.pod_sets)
        seen.append(found)
        ok = all(ps.replicas <= room[ps.name] for ps in gang.pod_sets)
        return found if ok else None

    return seen, attempt


def test_the_full_counts_are_asked_first_and_once_when_they_fit() -> None:
    seen, attempt = _probe_log({"launcher": 1, "workers": 4})
    assert largest_fit(mpi(), attempt, lambda a: a is not None) == (1, 4)
    assert seen == [(1, 4)]


def test_a_gang_that_waits_costs_two_attempts_full_then_minimum() -> None:
    seen, attempt = _probe_log({"launcher": 1, "workers": 1})
    assert largest_fit(mpi(), attempt, lambda a: a is not None) is None
    assert seen == [(1, 4), (1, 2)]


def test_binary_search_finds_the_largest_count_between_minimum_and_full() -> None:
    for room in range(2, 9):
        _, attempt = _probe_log({"launcher": 1, "workers": room})
        found = largest_fit(mpi(workers=8), attempt, lambda a: a is not None)
        assert found == (1, min(room, 8))


def test_what_the_proportional_shrink_cut_needlessly_is_given_back() -> None:
    """Two reducible pod sets in separate pools: the proportional shrink cuts both; the one whose
    own pool had room grows back to its full count, the other keeps the most its pool holds."""
    gang = make_workload(
        "two",
        replace(gpus(8, 8, name="a"), min_replicas=2),
        replace(gpus(8, 8, name="b"), min_replicas=2),
        min_available=4,
    )
    _, attempt = _probe_log({"a": 8, "b": 3})
    assert largest_fit(gang, attempt, lambda a: a is not None) == (8, 3)


def test_a_gang_without_minimums_is_asked_once_as_it_is() -> None:
    plain = make_workload("plain", gpus(8, 4))
    seen: list[Workload] = []
    largest_fit(plain, seen.append, lambda _: False)
    assert seen == [plain]


def test_an_attempt_requires_every_pod_at_its_counts_and_is_the_same_object_when_asked_again() -> None:
    attempt = at_counts(mpi(), (1, 3))
    assert [(ps.replicas, ps.min_replicas) for ps in attempt.pod_sets] == [(1, None), (3, None)]
    assert attempt.min_available == 4
    assert not attempt.reducible
    assert at_counts(mpi(), (1, 3)) is attempt


# --- placement and the fit question -------------------------------------------------------------


def test_placing_a_gang_as_it_is_honours_every_pod_set_minimum() -> None:
    """Best fit pod by pod would place four workers and no launcher (min_available 3 met): the
    launcher must run, so that is a miss."""
    clusters, nodes, pool = fleet(cpu_millis=64_000)
    by_pool, free = layout(clusters, nodes)
    gang = mpi(launcher_cpu=100_000)  # no node has that much CPU
    result = place_gang(gang, clusters[0], [pool], by_pool, free)
    assert isinstance(result, Miss)


def test_the_fit_question_prefers_the_full_gang() -> None:
    clusters, nodes, _ = fleet()
    answer = FleetCapacity(clusters, nodes).fits(mpi())
    assert answer.placements
    assert Counter(a.pod_set for a in answer.placements[0].assignments) == {"launcher": 1, "workers": 4}


def test_the_fit_question_reduces_when_the_launcher_cannot_share_a_worker_node() -> None:
    """CPU, not GPUs, is short: a 60-core launcher cannot share a node with a worker, so on four
    nodes the gang fits with three workers, the launcher on the fourth node."""
    clusters, nodes, _ = fleet(cpu_millis=64_000)
    gang = mpi(launcher_cpu=60_000)
    answer = FleetCapacity(clusters, nodes).fits(gang)
    [placement] = answer.placements
    placed = Counter(a.pod_set for a in placement.assignments)
    assert placed == {"launcher": 1, "workers": 3}
    assert sorted(a.index for a in placement.assignments if a.pod_set == "workers") == [0, 1, 2]


# --- the scheduling cycle -------------------------------------------------------------------------


def test_full_fit_is_admitted_whole() -> None:
    clusters, nodes, _ = fleet()
    decision = run_schedule(make_snapshot(clusters, nodes, [mpi()]))
    [admission] = decision.admissions
    assert counts(admission) == {"launcher": 1, "workers": 4}


def test_reduced_fit_is_admitted_with_the_largest_counts_that_fit() -> None:
    for taken, workers in ((1, 3), (2, 2)):
        clusters, nodes, _ = fleet()
        snapshot = make_snapshot(clusters, nodes, [occupant(taken), mpi()])
        decision = run_schedule(snapshot)
        admitted = {a.workload_id: a for a in decision.admissions}
        assert counts(admitted["mpi"]) == {"launcher": 1, "workers": workers}
        indices = sorted(a.index for a in admitted["mpi"].assignments if a.pod_set == "workers")
        assert indices == list(range(workers))


def test_minimum_not_met_stays_pending_with_the_usual_no_fit_reason() -> None:
    clusters, nodes, _ = fleet()
    snapshot = make_snapshot(clusters, nodes, [occupant(3), mpi()])
    decision = run_schedule(snapshot)
    assert [a.workload_id for a in decision.admissions] == ["occupant"]
    [pending] = decision.pending
    assert pending.kind is PendingKind.NO_FIT
    assert isinstance(pending.why, NoFit)
    assert pending.why.pods == 3  # the launcher and the two workers it needs at least
    assert pending.why.placed == 2  # the best attempt at the minimums: the launcher and one worker


def test_a_minimum_the_fleet_can_never_hold_is_never_fits() -> None:
    clusters, nodes, _ = fleet()
    decision = run_schedule(make_snapshot(clusters, nodes, [mpi(workers=8, least=5)]))
    [pending] = decision.pending
    assert isinstance(pending.why, NeverFits)
    assert pending.why.pods == 6


def test_quota_is_charged_for_the_pods_placed_only() -> None:
    """A queue limit of 24 gpu-eq: the four workers would hold 32, so the gang starts with three
    (24, the launcher holds no GPU); the queue is then full, and an 8-GPU gang behind it is told
    the queue's limit holds it (24 in use, not 32: nothing else would block 8 more)."""
    clusters, nodes, _ = fleet()
    behind = make_workload("behind", gpus(8), seq=2)
    snapshot = make_snapshot(clusters, nodes, [mpi(), behind], tree=default_tree(queue_limit=24))
    decision = run_schedule(snapshot)
    [admission] = decision.admissions
    assert counts(admission) == {"launcher": 1, "workers": 3}
    [pending] = decision.pending
    assert isinstance(pending.why, QuotaLimit)
    assert (pending.why.limit, pending.why.amount, pending.why.never) == (24, 8, False)


def test_quota_below_the_minimum_keeps_the_gang_pending() -> None:
    clusters, nodes, _ = fleet()
    snapshot = make_snapshot(clusters, nodes, [mpi()], tree=default_tree(queue_limit=8))
    decision = run_schedule(snapshot)
    assert not decision.admissions
    [pending] = decision.pending
    assert pending.kind is PendingKind.QUOTA_LIMIT


# --- trimming for quota, and submit-time "can this ever fit" --------------------------------------


def _assignments(*pods: tuple[str, int]) -> tuple[PodAssignment, ...]:
    return tuple(PodAssignment(name, index, f"n{i}", {}) for i, (name, index) in enumerate(pods))


def test_trimming_drops_the_highest_index_of_the_last_pod_set_above_its_minimum() -> None:
    gang = make_workload(
        "g",
        replace(gpus(8, 3, name="a"), min_replicas=1),
        replace(gpus(8, 2, name="b"), min_replicas=2),
        min_available=3,
    )
    full = _assignments(("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1))
    once = fewer_pods(gang, full)
    assert once == (full[0], full[1], full[3], full[4])
    twice = fewer_pods(gang, once)
    assert twice == (full[0], full[3], full[4])
    assert fewer_pods(gang, twice) is None


def test_trimming_an_elastic_gang_without_minimums_is_unchanged() -> None:
    elastic = make_workload("e", gpus(8, 4), min_available=2)
    pods = _assignments(("worker", 0), ("worker", 1), ("worker", 2))
    assert fewer_pods(elastic, pods) == pods[:2]
    assert fewer_pods(elastic, pods[:2]) is None


def test_never_fits_judges_a_gang_by_its_minimums() -> None:
    clusters, nodes, _ = fleet()
    assert why_never_fits(mpi(workers=6, least=2), clusters, nodes) is None
    reason = why_never_fits(mpi(workers=8, least=5), clusters, nodes)
    assert reason is not None
    assert "needs 6 pods placed at once" in reason
    # the same gang without minimums is refused
    assert why_never_fits(mpi(workers=6, least=None), clusters, nodes) is not None


def test_an_admission_says_its_count_per_pod_set() -> None:
    admission = Admission("w", "c1", _assignments(("launcher", 0), ("workers", 0), ("workers", 1)))
    assert admission.pod_counts == {"launcher": 1, "workers": 2}


def test_least_is_all_replicas_without_a_minimum() -> None:
    assert PodSet("w", 4).least == 4
    assert PodSet("w", 4, min_replicas=2).least == 2
    assert not make_workload("w", PodSet("w", 4, gpus=1, min_replicas=4)).reducible


# --- the submit model (shared by the REST API and the NATS submit subject) -------------------------


def _submit(least: int, **extra: object) -> dict[str, object]:
    return {
        "name": "mpi",
        "queue": "q",
        "pod_sets": [
            {"name": "launcher", "replicas": 1},
            {"name": "workers", "replicas": 4, "gpus": 8, "min_replicas": least},
        ],
        **extra,
    }


def test_the_submit_model_refuses_minimums_out_of_range_in_a_sentence() -> None:
    with pytest.raises(ValidationError, match="pod set workers: min_replicas 5 is more than its 4 replicas"):
        SubmitWorkload.model_validate(_submit(5))
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        SubmitWorkload.model_validate(_submit(0))
    with pytest.raises(ValidationError, match="min_available 2 disagrees with the pod sets' min_replicas"):
        SubmitWorkload.model_validate(_submit(2, min_available=2))


def test_the_submit_model_makes_the_sum_of_the_minimums_the_gang_threshold() -> None:
    request = SubmitWorkload.model_validate(_submit(2))
    assert [p.to_pod_set().min_replicas for p in request.pod_sets] == [None, 2]
    assert gang_minimum(request.pod_sets, request.min_available) == 3
    assert SubmitWorkload.model_validate(_submit(2, min_available=3)).min_available == 3
