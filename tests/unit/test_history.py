"""Fair-share usage history: the decay integral on hand-checked numbers."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest

from controlplane.core.history import UsageInterval, decayed_gpu_hours, history_shares

NOW = datetime(2030, 1, 1, 12, tzinfo=UTC)
HOUR = 3600.0


def ago(hours: float) -> datetime:
    return NOW - timedelta(hours=hours)


def test_usage_ending_now_counts_the_integral_of_the_decay() -> None:
    # 4 gpu-eq held for the last hour with a one-hour half-life:
    # 4 * h/ln2 * (1 - 2^-1) = 4 * 1/(2 ln 2) hours = 2.885 gpu-eq-hours (4 undecayed).
    decayed = decayed_gpu_hours([UsageInterval("q", 4.0, ago(1))], NOW, HOUR)
    assert decayed["q"] == pytest.approx(4 / (2 * math.log(2)))


def test_usage_one_half_life_older_counts_half() -> None:
    recent = decayed_gpu_hours([UsageInterval("q", 2.0, ago(2), ago(1))], NOW, HOUR)["q"]
    older = decayed_gpu_hours([UsageInterval("q", 2.0, ago(3), ago(2))], NOW, HOUR)["q"]
    assert older == pytest.approx(recent / 2)


def test_a_long_half_life_approaches_plain_gpu_hours() -> None:
    decayed = decayed_gpu_hours([UsageInterval("q", 8.0, ago(3), ago(1))], NOW, 1000 * HOUR)
    assert decayed["q"] == pytest.approx(16.0, rel=1e-2)


def test_future_ends_are_clipped_empty_intervals_ignored_and_queues_summed() -> None:
    decayed = decayed_gpu_hours(
        [
            UsageInterval("a", 1.0, ago(1), NOW + timedelta(hours=5)),
            UsageInterval("a", 1.0, ago(1)),
            UsageInterval("b", 3.0, ago(1), ago(1)),
            UsageInterval("c", 0.0, ago(2), ago(1)),
        ],
        NOW,
        HOUR,
    )
    assert set(decayed) == {"a"}
    assert decayed["a"] == pytest.approx(2 / (2 * math.log(2)))
    assert decayed_gpu_hours([UsageInterval("a", 1.0, ago(1))], NOW, 0) == {}


def test_history_shares_are_parts_of_the_total() -> None:
    assert history_shares({"a": 3.0, "b": 1.0}) == {"a": 0.75, "b": 0.25}
    assert history_shares({}) == {}
