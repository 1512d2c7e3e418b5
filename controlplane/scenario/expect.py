"""Checking a scenario's `expect:` section against what the run did."""

from __future__ import annotations

from controlplane.scenario.format import Expectations, WorkloadExpectation
from controlplane.scenario.result import ScenarioResult, WorkloadResult


def check_expectations(expect: Expectations, result: ScenarioResult) -> list[str]:
    """Every expectation the result misses, as sentences; empty when all hold."""
    failures: list[str] = []
    for name, expected in expect.workloads.items():
        failures += [f"{name}: {problem}" for problem in _workload_problems(expected, result.workload(name))]

    evictions = [count for _, count in result.evictions_per_cycle]
    if expect.total_evictions is not None and sum(evictions) != expect.total_evictions:
        failures.append(f"expected {expect.total_evictions} evictions in all, got {sum(evictions)}")
    if expect.max_evictions_per_cycle is not None and max(evictions, default=0) > expect.max_evictions_per_cycle:
        failures.append(
            f"expected at most {expect.max_evictions_per_cycle} evictions per cycle, got {max(evictions)} "
            f"(cycles: {[(at, n) for at, n in result.evictions_per_cycle]})"
        )
    if expect.eviction_kinds is not None:
        kinds = sorted({p.kind for w in result.workloads for p in w.preemptions})
        if kinds != sorted(set(expect.eviction_kinds)):
            failures.append(f"expected eviction kinds {sorted(set(expect.eviction_kinds))}, got {kinds}")
    for usage in expect.queue_gpu_eq_at:
        held = result.queue_gpu_eq_at(usage.queue, usage.at)
        if (usage.min is not None and held < usage.min - 1e-9) or (usage.max is not None and held > usage.max + 1e-9):
            failures.append(
                f"queue {usage.queue} held {held:g} gpu-eq at {usage.at:g}, expected at least {_show(usage.min)} "
                f"and at most {_show(usage.max)}"
            )
    return failures


def _workload_problems(expected: WorkloadExpectation, got: WorkloadResult) -> list[str]:
    # Only fields the scenario spelled out are checked; an explicit null expects "none", so
    # `finished_at: null` means "has not finished" and `preempted_by: null` "was never preempted".
    wanted = expected.model_fields_set
    last = got.last_run
    first = got.preemptions[0] if got.preemptions else None
    actual: dict[str, object] = {
        "state": got.state,
        "admitted_at": got.admitted_at,
        "never_admitted": got.admitted_at is None,
        "runs": len(got.runs),
        "cluster": last.cluster if last else None,
        "pool": (last.pools[0] if len(last.pools) == 1 else list(last.pools)) if last else None,
        "pools": list(last.pools) if last else [],
        "nodes": list(last.nodes) if last else [],
        "node_count": len(last.nodes) if last else 0,
        "pod_count": last.pods if last else 0,
        "preemptions": len(got.preemptions),
        "preempted_by": first.by if first else None,
        "preempted_kind": first.kind if first else None,
        "preempted_at": first.at if first else None,
        "preempted_others": got.preempted_others,
        "borrowed_from": got.runs[0].lent_to if got.runs else None,
        "finished_at": got.finished_at,
    }
    problems = []
    for name, value in actual.items():
        if name not in wanted:
            continue
        expected_value = getattr(expected, name)
        if isinstance(expected_value, list):
            expected_value = sorted(expected_value)
        if expected_value != value:
            problems.append(f"{name} expected {_show(expected_value)}, got {_show(value)}")
    for name, window, value in (
        ("admitted_at", expected.admitted_within, got.admitted_at),
        ("preempted_at", expected.preempted_within, first.at if first else None),
        ("finished_at", expected.finished_within, got.finished_at),
    ):
        if window is not None and (value is None or not window[0] <= value <= window[1]):
            problems.append(f"{name} expected within [{window[0]:g}, {window[1]:g}], got {_show(value)}")
    problems += _reason_problems(expected.pending_reason_contains, got)
    if expected.rejected_reason_contains is not None and (
        got.state != "rejected" or expected.rejected_reason_contains not in (got.reason or "")
    ):
        problems.append(
            f"expected rejection mentioning {expected.rejected_reason_contains!r}, got {got.state}: {got.reason!r}"
        )
    return problems


def _show(value: object) -> str:
    """Times as people write them: 30, not 30.0."""
    if isinstance(value, float):
        return f"{value:g}"
    return repr(value)


def _reason_problems(wanted: str | list[str] | None, got: WorkloadResult) -> list[str]:
    """Each wanted fragment must appear in a pending reason recorded after the previous one's."""
    if wanted is None:
        return []
    fragments = [wanted] if isinstance(wanted, str) else wanted
    reasons = [r.reason for r in got.pending_reasons]
    position = 0
    for fragment in fragments:
        while position < len(reasons) and fragment not in reasons[position]:
            position += 1
        if position == len(reasons):
            return [f"no pending reason (in order) mentions {fragment!r}; reasons: {reasons}"]
        position += 1
    return []
