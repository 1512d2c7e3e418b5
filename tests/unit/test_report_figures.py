"""The pure parts of the fleet reports: buckets, percentiles, size buckets and entitlements."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from controlplane.service.errors import Invalid
from controlplane.service.report_over_time import buckets, entitlements, runs_by_bucket
from controlplane.service.report_records import QueueRecord, RunRecord
from controlplane.service.report_waits import percentile, size_bucket

T0 = datetime(2026, 5, 1, tzinfo=UTC)


def _run(i: int, admitted: datetime, finished: datetime | None) -> RunRecord:
    return RunRecord(f"r{i}", "w", "w", "t", "t", "q", "c", "running", "", admitted, finished, ())


def test_runs_by_bucket_matches_the_plain_overlap_rule() -> None:
    rng = random.Random(7)
    spans = buckets(T0, T0 + timedelta(hours=10, minutes=30), 3600)
    assert len(spans) == 11
    assert spans[-1] == (T0 + timedelta(hours=10), T0 + timedelta(hours=10, minutes=30))
    runs = []
    for i in range(400):
        admitted = T0 + timedelta(minutes=rng.randint(-120, 629))
        finished = (
            None if rng.random() < 0.2 else admitted + timedelta(minutes=rng.choice([0, 60, rng.randint(1, 900)]))
        )
        if finished is not None and finished < T0:
            continue
        runs.append(_run(i, admitted, finished))
    got = runs_by_bucket(runs, spans)
    for (lo, hi), found in zip(spans, got, strict=True):
        expected = [r for r in runs if r.admitted_at < hi and (r.finished_at is None or r.finished_at >= lo)]
        assert [r.run_id for r in found] == [r.run_id for r in expected]


def test_bucket_bounds() -> None:
    with pytest.raises(Invalid, match="at least 300 seconds"):
        buckets(T0, T0 + timedelta(hours=1), 60)
    with pytest.raises(Invalid, match="at most 1000 buckets"):
        buckets(T0, T0 + timedelta(days=30), 600)
    assert len(buckets(T0, T0 + timedelta(days=92), None)) <= 200


@pytest.mark.parametrize(
    ("span", "size", "count"),
    [
        (timedelta(minutes=30), 300, 6),  # shorter than 24 of the shortest: the shortest
        (timedelta(hours=2), 300, 24),  # was one 1 h bucket per hour: two points
        (timedelta(hours=5), 300, 60),
        (timedelta(hours=24), 3600, 24),
        (timedelta(days=7), 6 * 3600, 28),
        (timedelta(days=30), 86400, 30),
        (timedelta(days=92), 86400, 92),
    ],
)
def test_the_default_bucket_is_the_longest_round_size_giving_24(span: timedelta, size: int, count: int) -> None:
    spans = buckets(T0, T0 + span, None)
    assert (spans[0][1] - spans[0][0]).total_seconds() == size
    assert len(spans) == count


def test_buckets_that_start_after_now_are_left_out() -> None:
    end = T0 + timedelta(hours=24)
    now = T0 + timedelta(hours=10, minutes=20)
    spans = buckets(T0, end, 3600, now)
    assert len(spans) == 11  # the current bucket (10:00-11:00) stays, whole; none after it
    assert spans[-1] == (T0 + timedelta(hours=10), T0 + timedelta(hours=11))
    assert buckets(T0, end, 3600, T0 + timedelta(hours=10)) == spans[:10]  # one starting now has nothing
    assert buckets(T0, end, 3600, T0 - timedelta(days=1)) == []  # a range wholly in the future
    assert buckets(T0, end, 3600, end + timedelta(days=1)) == buckets(T0, end, 3600)


def test_nearest_rank_percentiles_and_size_buckets() -> None:
    waits = [float(v) for v in range(1, 21)]  # 1..20
    assert percentile(waits, 50) == 10
    assert percentile(waits, 95) == 19
    assert percentile([5.0], 95) == 5
    assert [size_bucket(x) for x in (0, 0.25, 1, 1.5, 8, 9, 32, 33, 512)] == [
        "<=1",
        "<=1",
        "<=1",
        "2-8",
        "2-8",
        "9-32",
        "9-32",
        "33+",
        "33+",
    ]


def test_entitlements_follow_guarantees_then_weights() -> None:
    queues = [
        QueueRecord("a", "ta", "team-a", guaranteed=4, team_guaranteed=0, weight=3),
        QueueRecord("b", "tb", "team-b", guaranteed=0, team_guaranteed=0, weight=1),
    ]
    assert entitlements(queues, 16) == {"a": 0.8125, "b": 0.1875}
    # A team guarantee beyond its queues' belongs to them together, split by weight.
    shared = [
        QueueRecord("x", "t", "team", guaranteed=0, team_guaranteed=8, weight=1),
        QueueRecord("y", "t", "team", guaranteed=0, team_guaranteed=8, weight=3),
    ]
    assert entitlements(shared, 8) == {"x": 0.25, "y": 0.75}
    # Guarantees above the fleet are scaled down; entitlements never add up to more than 1.
    over = [QueueRecord(n, n, n, guaranteed=20, team_guaranteed=0, weight=1) for n in ("p", "q")]
    assert entitlements(over, 10) == {"p": 0.5, "q": 0.5}
    assert entitlements(over, 0) == {"p": 0.0, "q": 0.0}
