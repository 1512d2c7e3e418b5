"""Per policy and load, the study's metrics over several seeds: the mean and a 95 % confidence
interval from Student's t distribution (definitions: docs/simulator.md)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

# Two-sided 95 % quantiles of Student's t, t(0.975, df) for df = 1..30; the normal 1.96 beyond.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t975(df: int) -> float:
    if df < 1:
        raise ValueError("a confidence interval needs at least two samples")
    return _T975[df - 1] if df <= len(_T975) else 1.96


def mean_ci95(values: Sequence[float]) -> tuple[float, float | None]:
    """(mean, half-width of the 95 % interval): t(0.975, n-1) * s / sqrt(n), s the sample standard
    deviation; no interval (None) from a single value."""
    n = len(values)
    if n == 0:
        raise ValueError("no values")
    mean = sum(values) / n
    if n == 1:
        return mean, None
    variance = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, t975(n - 1) * math.sqrt(variance) / math.sqrt(n)


Pick = Callable[[dict[str, Any]], float | None]

# The study's record: field name -> where it is in one replay's summary (metrics.summarize).
METRICS: tuple[tuple[str, Pick], ...] = (
    ("avg_jct_seconds", lambda s: s["avg_jct_seconds"]),
    ("jct_p50_seconds", lambda s: s["jct_seconds"]["p50"]),
    ("jct_p95_seconds", lambda s: s["jct_seconds"]["p95"]),
    ("jct_p99_seconds", lambda s: s["jct_seconds"]["p99"]),
    ("avg_queueing_delay_seconds", lambda s: s["queueing_delay_seconds"]["mean"]),
    ("queueing_delay_p50_seconds", lambda s: s["queueing_delay_seconds"]["p50"]),
    ("queueing_delay_p95_seconds", lambda s: s["queueing_delay_seconds"]["p95"]),
    ("queueing_delay_p99_seconds", lambda s: s["queueing_delay_seconds"]["p99"]),
    ("large_gang_longest_wait_seconds", lambda s: s["large_gang_longest_wait_seconds"]),
    ("gpu_allocation", lambda s: s["gpu_allocation"]),
    ("effective_utilization", lambda s: s["effective_utilization"]),
    ("effective_utilization_window", lambda s: s["effective_utilization_window"]),
    ("idle_reclaimed_gpu_hours", lambda s: s["idle_reclaimed_gpu_hours"]),
    ("preemption_lost_gpu_seconds", lambda s: s["preemption_lost_gpu_seconds"]),
    ("jain_fairness_demand_aware", lambda s: s["jain_fairness_demand_aware"]),
    ("jain_fairness", lambda s: s["jain_fairness"]),
    ("jobs_completed", lambda s: s["jobs"]["completed"]),
    ("evictions", lambda s: s["jobs"]["evictions"]),
    ("cpu_seconds", lambda s: s["runtime"]["cpu_seconds"]),
)


def aggregate(policy: str, load: float | str, summaries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One record per policy and load: every metric's mean over the seeds where it is defined and
    its `_ci95` half-width (None with fewer than two values)."""
    record: dict[str, Any] = {"policy": policy, "load": load, "seeds": [s["seed"] for s in summaries]}
    for name, pick in METRICS:
        values = [float(v) for s in summaries if (v := pick(s)) is not None]
        if values:
            mean, half = mean_ci95(values)
            record[name] = round(mean, 6)
            record[f"{name}_ci95"] = None if half is None else round(half, 6)
        else:
            record[name] = None
            record[f"{name}_ci95"] = None
    record["large_gang_wait_censored_runs"] = sum(1 for s in summaries if s["large_gang_longest_wait_censored"])
    return record
