"""The idle policy on a virtual clock: stages, evidence, and never acting on missing data."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from controlplane.core.idle import (
    GpuReading,
    IdlePolicy,
    IdleRules,
    RunActivity,
    Stage,
    Status,
    WorkingHours,
    evaluate,
)

START = datetime(2030, 1, 7, 2, 0, tzinfo=UTC)  # a Monday, 02:00 UTC
WINDOW = 300
POLICY = IdlePolicy(grace_seconds=600, notify_after=2, deprioritize_after=3, reclaim_after=4)
RULES = IdleRules(default=POLICY)


def readings(first_window: int, activities: list[float | None], gpus: int = 2, samples: int = 30) -> list[GpuReading]:
    """One reading per GPU per window, windows counted from START in units of WINDOW."""
    out = []
    for offset, activity in enumerate(activities):
        start = START + timedelta(seconds=(first_window + offset) * WINDOW)
        out.extend(GpuReading(f"gpu{g}", start, activity, samples) for g in range(gpus))
    return out


def run(rs: list[GpuReading], kind: str = "training", gpus: int = 2, **extra: object) -> RunActivity:
    values: dict[str, object] = {
        "run_id": "r1",
        "workload_id": "w1",
        "workload_name": "sweep",
        "team": "vision",
        "queue": "vision-train",
        "priority_class": "batch",
        "kind": kind,
        "cluster": "c1",
        "started_at": START,
        "gpu_devices": gpus,
        "readings": rs,
    }
    values.update(extra)
    return RunActivity(**values)  # type: ignore[arg-type]


def at_window_end(index: int) -> datetime:
    return START + timedelta(seconds=(index + 1) * WINDOW)


@pytest.mark.parametrize(
    ("idle_windows", "stage"),
    [(1, Stage.NONE), (2, Stage.NOTIFY), (3, Stage.DEPRIORITIZE), (4, Stage.RECLAIM), (7, Stage.RECLAIM)],
)
def test_consecutive_idle_windows_escalate_the_stage(idle_windows: int, stage: Stage) -> None:
    # windows 2.. are after the 600 s grace period
    verdict = evaluate(run(readings(2, [0.01] * idle_windows)), RULES, at_window_end(1 + idle_windows))
    assert verdict.status is Status.IDLE
    assert verdict.idle_windows == idle_windows
    assert verdict.stage is stage
    assert len(verdict.evidence) == idle_windows
    assert all(e.max_activity == 0.01 and e.gpus_reporting == 2 for e in verdict.evidence)


def test_one_busy_window_resets_the_count_and_a_busy_gpu_makes_the_window_busy() -> None:
    rs = readings(2, [0.0, 0.0, 0.0, 0.5, 0.0])
    verdict = evaluate(run(rs), RULES, at_window_end(6))
    assert verdict.idle_windows == 1
    assert verdict.stage is Stage.NONE
    one_busy_gpu = [*readings(2, [0.0], gpus=1), GpuReading("gpu1", START + timedelta(seconds=600), 0.9, 30)]
    assert evaluate(run(one_busy_gpu), RULES, at_window_end(2)).status is Status.BUSY


def test_grace_period_after_start_counts_nothing() -> None:
    verdict = evaluate(run(readings(0, [0.0, 0.0])), RULES, START + timedelta(seconds=500))
    assert verdict.status is Status.GRACE
    assert verdict.stage is Stage.NONE
    # right after the grace period, windows that began inside it still do not count
    after = evaluate(run(readings(0, [0.0, 0.0])), RULES, at_window_end(1))
    assert after.status is Status.UNKNOWN


def test_missing_or_stale_data_is_unknown_never_idle() -> None:
    # nothing reported
    assert evaluate(run([]), RULES, at_window_end(8)).status is Status.UNKNOWN
    # the newest window ended long ago
    stale = evaluate(run(readings(2, [0.0] * 5)), RULES, at_window_end(6) + timedelta(hours=1))
    assert stale.status is Status.UNKNOWN
    assert "stale" in stale.reason
    # only one of two GPUs reports in the newest window
    half = readings(2, [0.0] * 4) + readings(6, [0.0], gpus=1)
    assert evaluate(run(half), RULES, at_window_end(6)).status is Status.UNKNOWN
    # blank activity (no profiling and no GPU_UTIL reading) or too few samples do not count
    assert evaluate(run(readings(2, [None] * 5)), RULES, at_window_end(6)).status is Status.UNKNOWN
    assert evaluate(run(readings(2, [0.0] * 5, samples=1)), RULES, at_window_end(6)).status is Status.UNKNOWN


def test_a_gap_in_the_windows_stops_the_count() -> None:
    rs = readings(2, [0.0, 0.0, 0.0]) + readings(6, [0.0, 0.0])  # window 5 is missing
    verdict = evaluate(run(rs), RULES, at_window_end(7))
    assert verdict.idle_windows == 2
    assert verdict.stage is Stage.NOTIFY


def test_incomplete_current_window_is_ignored() -> None:
    rs = readings(2, [0.0, 0.0, 0.9])  # window 4 is still open at this moment
    verdict = evaluate(run(rs), RULES, at_window_end(3) + timedelta(seconds=100))
    assert verdict.status is Status.IDLE
    assert verdict.idle_windows == 2


def test_exemptions() -> None:
    idle = readings(2, [0.0] * 5)
    now = at_window_end(6)
    allow = IdleRules(default=POLICY, exempt_workloads=frozenset({"sweep"}))
    assert evaluate(run(idle), allow, now).status is Status.EXEMPT
    teams = IdleRules(default=POLICY, exempt_teams=frozenset({"vision"}))
    assert evaluate(run(idle), teams, now).status is Status.EXEMPT
    # inference: exempt while it serves traffic or nobody reports its traffic
    assert evaluate(run(idle, kind="inference"), RULES, now).status is Status.EXEMPT
    assert evaluate(run(idle, kind="inference", traffic_rps=3.0), RULES, now).status is Status.EXEMPT
    assert evaluate(run(idle, kind="inference", traffic_rps=0.0), RULES, now).stage is Stage.RECLAIM


def test_interactive_sessions_are_exempt_inside_working_hours_only() -> None:
    hours = IdleRules(default=POLICY, working_hours=WorkingHours(start_hour=8, end_hour=20))
    night = run(readings(2, [0.0] * 5), kind="interactive")
    assert evaluate(night, hours, at_window_end(6)).stage is Stage.RECLAIM  # 02:35 on a Monday
    day_start = START + timedelta(hours=8)
    day = run(
        [
            GpuReading(r.gpu_key, r.window_start + timedelta(hours=8), r.activity_mean, r.samples)
            for r in night.readings
        ],
        kind="interactive",
        started_at=day_start,
    )
    assert evaluate(day, hours, at_window_end(6) + timedelta(hours=8)).status is Status.EXEMPT
    saturday = WorkingHours(weekdays=(0,), utc_offset_minutes=-24 * 60)  # Monday 10:00 UTC is Sunday there
    assert not saturday.contains(START + timedelta(hours=10))


def test_most_specific_policy_wins() -> None:
    lenient = IdlePolicy(threshold=0.05, notify_after=10, deprioritize_after=20, reclaim_after=30, grace_seconds=600)
    off = IdlePolicy(enabled=False)
    rules = IdleRules(
        default=POLICY, by_queue={"vision-train": lenient}, by_priority_class={"batch": off}, by_kind={"training": off}
    )
    verdict = evaluate(run(readings(2, [0.0] * 5)), rules, at_window_end(6))
    assert verdict.status is Status.IDLE
    assert verdict.stage is Stage.NONE  # the queue's lenient policy, not the class's "off"
    assert (
        evaluate(
            run(readings(2, [0.0] * 5)), IdleRules(default=POLICY, by_kind={"training": off}), at_window_end(6)
        ).status
        is Status.EXEMPT
    )
