"""The study's metrics, computed from a finished simulation (definitions: docs/simulator.md)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from controlplane.tracesim.queueing.engine import SimResult
from controlplane.tracesim.queueing.inputs import Fleet
from controlplane.tracesim.queueing.water_filling import shares_by_weight

LARGE_GANG_GPUS = 8


def percentile(sorted_values: Sequence[float], p: float) -> float | None:
    """Linear interpolation between closest ranks: position p/100 * (n - 1) of the sorted values."""
    if not sorted_values:
        return None
    pos = p / 100 * (len(sorted_values) - 1)
    low = math.floor(pos)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (pos - low)


def jain(values: Sequence[float]) -> float | None:
    """Jain's index (Σx)² / (n Σx²): 1 when all equal, 1/n when one takes everything."""
    if not values:
        return None
    squares = sum(v * v for v in values)
    return 1.0 if squares == 0 else sum(values) ** 2 / (len(values) * squares)


def max_min_fair(entitlement: dict[str, float], demand: dict[str, float]) -> dict[str, float]:
    """Weighted max-min fair split of a whole (1.0) by water-filling: each queue gets
    min(demand, level * entitlement), `level` raised until the whole is handed out (or every
    demand is met). Queues that ask for less than their part leave it to the others."""
    return shares_by_weight(entitlement, demand, 1.0)


def _overlap(start: float, end: float, low: float, high: float) -> float:
    return max(0.0, min(end, high) - max(start, low))


def per_queue(result: SimResult, fleet: Fleet) -> list[dict[str, Any]]:
    """Share of GPU-time received within the arrival window vs the queue's entitlement."""
    window = max(result.submit, default=0.0)
    received = dict.fromkeys(fleet.queue_ids, 0.0)
    demanded = dict.fromkeys(fleet.queue_ids, 0.0)
    for span in result.spans:
        job = result.jobs[span.job]
        end = result.end_time if span.end is None else span.end
        # A window of length 0 (every job at t=0) falls back to the whole run.
        received[job.queue] += job.gpus * (_overlap(span.start, end, 0.0, window) if window > 0 else end - span.start)
    for index, job in enumerate(result.jobs):
        if index not in result.rejected:
            demanded[job.queue] += job.gpus * job.duration
    total_received = sum(received.values()) or 1.0
    total_demanded = sum(demanded.values()) or 1.0
    entitled = fleet.entitlements()
    fair = max_min_fair(entitled, {q: d / total_demanded for q, d in demanded.items()})
    rows = []
    for name in sorted(fleet.queue_ids):
        share = received[name] / total_received
        rows.append(
            {
                "queue": name,
                "entitlement": round(entitled[name], 6),
                "demand_share": round(demanded[name] / total_demanded, 6),
                "fair_share": round(fair[name], 6),
                "received_share": round(share, 6),
                "ratio": round(share / entitled[name], 6) if entitled[name] > 0 else None,
                "fair_ratio": round(share / fair[name], 6) if fair[name] > 0 else None,
            }
        )
    return rows


def work_accounting(result: SimResult) -> dict[str, float]:
    """GPU-seconds held, split by what they did. A span's busy part is its time up to the job's
    idle tail (all of it for a job that does not hoard); the rest it held idle. A preempted span's
    busy part is lost (the job restarts from scratch); an idle-reclaimed span's hold beyond the
    reclaim is what the reclaim returned."""
    window = max(result.submit, default=0.0)
    allocated = busy_kept = busy_in_window = idle_held = lost = evicted = returned = 0.0
    for span in result.spans:
        job = result.jobs[span.job]
        end = result.end_time if span.end is None else span.end
        held = end - span.start
        busy = held if job.idle_after is None else min(held, job.idle_after)
        allocated += job.gpus * held
        idle_held += job.gpus * (held - busy)
        if span.evicted:
            evicted += job.gpus * held
            lost += job.gpus * busy
        else:
            util = job.utilization if job.utilization is not None else 1.0
            busy_kept += job.gpus * busy * util
            busy_in_window += job.gpus * _overlap(span.start, span.start + busy, 0.0, window) * util
        if span.reclaimed_idle:
            returned += job.gpus * (span.start + job.duration - end)
    return {
        "allocated": allocated,
        "useful": busy_kept,
        "useful_in_window": busy_in_window,
        "window": window,
        "idle_held": idle_held,
        "preemption_lost": lost,
        "evicted": evicted,
        "idle_returned": returned,
    }


def summarize(result: SimResult, fleet: Fleet) -> dict[str, Any]:
    jobs = result.jobs
    capacity = fleet.capacity_gpus
    completed = [i for i, f in enumerate(result.finish) if f is not None]
    jct = sorted(result.finish[i] - result.submit[i] for i in completed)  # type: ignore[operator]
    delays = sorted(admit - result.submit[i] for i, admit in enumerate(result.first_admit) if admit is not None)
    start = min(result.submit, default=0.0)
    makespan = result.end_time - start
    work = work_accounting(result)
    allocated, useful = work["allocated"], work["useful"]
    has_util = bool(jobs) and all(j.utilization is not None for j in jobs)
    capacity_time = capacity * makespan
    allocation = allocated / capacity_time if capacity_time > 0 else 0.0
    # Large gangs: never admitted ones count as waiting until the simulation ended (censored).
    large_waits = [
        (
            (result.first_admit[i] if result.first_admit[i] is not None else result.end_time) - result.submit[i],  # type: ignore[operator]
            result.first_admit[i] is None,
        )
        for i, job in enumerate(jobs)
        if job.gpus >= LARGE_GANG_GPUS and i not in result.rejected
    ]
    longest = max(large_waits, default=None)
    queues = per_queue(result, fleet)
    ratios = [row["ratio"] for row in queues if row["ratio"] is not None]
    fair_ratios = [row["fair_ratio"] for row in queues if row["fair_ratio"] is not None]

    def r(value: float | None, digits: int = 1) -> float | None:
        return None if value is None else round(value, digits)

    return {
        "policy": result.policy,
        "seed": result.seed,
        "jobs": {
            "total": len(jobs),
            "completed": len(completed),
            "rejected": len(result.rejected),
            "unfinished": len(jobs) - len(completed) - len(result.rejected),
            "evictions": sum(result.evictions),
            "idle_reclaims": sum(1 for span in result.spans if span.reclaimed_idle),
        },
        "fleet_gpus": capacity,
        "avg_jct_seconds": r(sum(jct) / len(jct) if jct else None),
        "jct_seconds": {
            "p50": r(percentile(jct, 50)),
            "p95": r(percentile(jct, 95)),
            "p99": r(percentile(jct, 99)),
        },
        "queueing_delay_seconds": {
            "mean": r(sum(delays) / len(delays) if delays else None),
            "p50": r(percentile(delays, 50)),
            "p95": r(percentile(delays, 95)),
            "p99": r(percentile(delays, 99)),
        },
        "gpu_allocation": round(allocation, 6),
        "effective_utilization": round(useful / capacity_time if capacity_time > 0 else 0.0, 6),
        # The same within the arrival window, while work keeps coming: there a policy that returns
        # idle or wasted GPUs gets more work done; over the whole run every policy that finishes
        # the workload does the same useful work and only the makespan differs.
        "effective_utilization_window": round(
            work["useful_in_window"] / (capacity * work["window"]) if capacity * work["window"] > 0 else 0.0, 6
        ),
        "effective_utilization_source": "busy GPU-time kept (not lost to preemption, not held idle)"
        + (" x per-job utilization" if has_util else ""),
        "evicted_gpu_seconds": round(work["evicted"], 1),
        "preemption_lost_gpu_seconds": round(work["preemption_lost"], 1),
        "idle_held_gpu_seconds": round(work["idle_held"], 1),
        "idle_reclaimed_gpu_hours": round(work["idle_returned"] / 3600, 3),
        "jain_fairness": r(jain(ratios), 6),
        "jain_fairness_demand_aware": r(jain(fair_ratios), 6),
        "large_gang_longest_wait_seconds": r(longest[0]) if longest else None,
        "large_gang_longest_wait_censored": bool(longest[1]) if longest else False,
        "makespan_seconds": r(makespan),
        "cycles": result.cycles,
        "cycle_seconds": result.config.cycle_seconds,
        "pending_cap": {"heads_per_queue": result.config.heads_per_queue, "max_pending": result.config.max_pending},
        "per_queue": queues,
    }


def series(result: SimResult, fleet: Fleet, bins: int = 300, cdf_points: int = 400) -> dict[str, Any]:
    """Down-sampled curves for the report: utilization over time, the queueing-delay and JCT CDFs."""
    capacity = fleet.capacity_gpus or 1
    horizon = result.end_time or 1.0
    width = horizon / bins
    sums = [0.0] * bins
    steps = result.usage_steps
    for k, (since, held) in enumerate(steps):
        until = steps[k + 1][0] if k + 1 < len(steps) else horizon
        at = since
        b = int(at // width)
        while at < until and b < bins:
            edge = min(until, (b + 1) * width)
            sums[b] += held * (edge - at)
            at = edge
            b += 1
    utilization = [(round((b + 0.5) * width, 1), round(s / (width * capacity), 5)) for b, s in enumerate(sums)]
    delays = sorted(a - result.submit[i] for i, a in enumerate(result.first_admit) if a is not None)
    jct = sorted(f - result.submit[i] for i, f in enumerate(result.finish) if f is not None)
    return {"utilization": utilization, "delay_cdf": _cdf(delays, cdf_points), "jct_cdf": _cdf(jct, cdf_points)}


def _cdf(values: Sequence[float], points: int) -> list[tuple[float, float]]:
    """About `points` (value, share of values at most it) pairs of sorted values, the last included."""
    if not values:
        return []
    stride = max(1, len(values) // points)
    cdf = [(values[i], (i + 1) / len(values)) for i in range(0, len(values), stride)]
    cdf.append((values[-1], 1.0))
    return cdf
