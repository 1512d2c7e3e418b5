"""Fair-share usage history: what each queue consumed recently, decayed with a half-life.

A queue that just used a lot of the fleet should wait behind one that did not, even when both are
back at the same current share (KAI and Slurm's fair-share factor do the same). Usage that ended
long ago fades: a GPU-hour consumed one half-life ago counts half.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class UsageInterval:
    """One run's consumption: `gpu_eq` held from `start` until `end` (None: still running)."""

    queue_id: str
    gpu_eq: float
    start: datetime
    end: datetime | None = None


def decayed_gpu_hours(intervals: Iterable[UsageInterval], now: datetime, half_life_seconds: float) -> dict[str, float]:
    """Per queue, the integral of held gpu-eq over time weighted by 2^(-age / half-life), in hours.

    The closed form of the integral keeps it exact however long the run: for a run held from
    `a` to `b` seconds ago, `gpu_eq * h / ln 2 * (2^(-b/h) - 2^(-a/h))`.
    """
    if half_life_seconds <= 0:
        return {}
    scale = half_life_seconds / math.log(2) / 3600.0
    totals: dict[str, float] = {}
    for interval in intervals:
        end = now if interval.end is None or interval.end > now else interval.end
        if interval.gpu_eq <= 0 or end <= interval.start:
            continue
        oldest = (now - interval.start).total_seconds() / half_life_seconds
        newest = (now - end).total_seconds() / half_life_seconds
        weight = scale * (2.0 ** (-newest) - 2.0 ** (-oldest))
        totals[interval.queue_id] = totals.get(interval.queue_id, 0.0) + interval.gpu_eq * weight
    return totals


def history_shares(decayed: dict[str, float]) -> dict[str, float]:
    """Each queue's part of all recent consumption, between 0 and 1."""
    total = sum(decayed.values())
    if total <= 0:
        return {}
    return {queue_id: value / total for queue_id, value in decayed.items()}
