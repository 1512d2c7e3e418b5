"""Reports in time buckets: utilization over time, and fairness (share of the fleet vs entitlement).

Buckets start at `from` and are `bucket` seconds long (the last one ends at `to`); at least
`MIN_BUCKET`, at most `MAX_BUCKETS` of them. Without a size, the longest of a ladder of round sizes
(5, 15 and 30 minutes; 1, 3, 6 and 12 hours; 1 and 7 days) that still gives `AUTO_MIN_BUCKETS`
buckets (a 2 h range in 5-minute buckets, 24 h hourly, 7 days in 6 h, 30 days daily); the
shortest when none does. Buckets that start after `now` are left out: the future has no figures.

**Fairness** uses the scheduler's definition of a fair share (controlplane/core/ordering.py): a
queue within its guarantee is never behind, and above their guarantees queues are ordered by their
weighted share, so a saturated fleet gives each queue its guarantee plus a weight-proportional part
of the unguaranteed rest. Hence, with C the fleet's GPUs now, g a queue's own guarantee (the GPU
amounts of its quota), w its weight and W the sum of all weights:

    entitlement = (g + its part of its team's guarantee) / C + (w / W) x (unguaranteed GPUs) / C

A team's guarantee beyond the sum of its queues' belongs to its queues together, split by weight.
Guarantees above C are scaled down to C. `share` is the queue's allocated GPU-hours over the
fleet's in the bucket (the utilization report's allocation rule); `share_over_entitlement` < 1 means
the queue got less than its entitlement. Entitlements use the queue tree and fleet as they are now,
and ignore the optional usage history. A team token sees its own rows; shares are still of the
whole fleet's allocation (an aggregate, no other team's figures).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from controlplane.service.errors import Invalid
from controlplane.service.ports import UnitOfWork
from controlplane.service.report_accounting import check_span, held_hours, team_scope, utc, window_terms
from controlplane.service.report_records import QueueRecord, RunRecord, WindowSum
from controlplane.service.reports import (
    Figures,
    GroupBy,
    allocate,
    figures_of,
    group_rows,
    measure,
    runs_and_sums,
    term_key,
)
from controlplane.service.views import Principal

MIN_BUCKET = 300
MAX_BUCKETS = 1000
AUTO_MIN_BUCKETS = 24
AUTO_SIZES = (300, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 7 * 86400)


def bucket_size(start: datetime, end: datetime, size: int | None) -> int:
    """The bucket length in seconds: `size`, checked, or the automatic choice."""
    span = (end - start).total_seconds()
    if size is None:
        size = max((s for s in AUTO_SIZES if span / s >= AUTO_MIN_BUCKETS), default=AUTO_SIZES[0])
    if size < MIN_BUCKET:
        raise Invalid(f"a bucket is at least {MIN_BUCKET} seconds")
    if span / size > MAX_BUCKETS:
        raise Invalid(f"at most {MAX_BUCKETS} buckets: use a bucket of at least {int(span // MAX_BUCKETS) + 1} seconds")
    return size


def buckets(
    start: datetime, end: datetime, size: int | None, now: datetime | None = None
) -> list[tuple[datetime, datetime]]:
    """The buckets of [start, end) (`bucket_size` long, the last one cut at `end`), without those
    that start at or after `now`."""
    step = timedelta(seconds=bucket_size(start, end, size))
    stop = end if now is None else min(end, now)
    out = []
    lo = start
    while lo < stop:
        out.append((lo, min(lo + step, end)))
        lo += step
    return out


def _reported_size(start: datetime, end: datetime, size: int | None) -> int:
    """The bucket length a report states: the whole range when it is shorter than one bucket."""
    return min(bucket_size(start, end, size), int((end - start).total_seconds()))


def runs_by_bucket(runs: Sequence[RunRecord], spans: Sequence[tuple[datetime, datetime]]) -> list[list[RunRecord]]:
    """The runs overlapping each bucket (admitted before its end, not finished before its start),
    in one pass over the runs: buckets are equal steps from the first start, so a run's buckets
    are an index range (O(runs + overlaps), not O(runs x buckets))."""
    out: list[list[RunRecord]] = [[] for _ in spans]
    if not spans:
        return out
    origin, step = spans[0][0], (spans[0][1] - spans[0][0]).total_seconds()
    last = len(spans) - 1
    for run in runs:
        first_index = max(0, int((run.admitted_at - origin).total_seconds() // step))
        if run.finished_at is None:
            last_index = last
        else:
            # A run that finished exactly at a bucket's start still overlaps it (`finished_at >= lo`).
            last_index = min(last, int((run.finished_at - origin).total_seconds() // step))
        for i in range(first_index, last_index + 1):
            lo, hi = spans[i]
            if run.admitted_at < hi and (run.finished_at is None or run.finished_at >= lo):
                out[i].append(run)
    return out


# --- utilization over time ---------------------------------------------------------------------


@dataclass
class TimelineRow:
    bucket_start: datetime
    bucket_end: datetime
    group: str
    allocated_gpu_hours: float
    measured_gpu_hours: float
    used_gpu_hours: float
    idle_gpu_hours: float
    unmeasured_gpu_hours: float
    reclaimed_gpu_hours: float
    efficiency: float | None


@dataclass
class TimelineReport:
    start: datetime
    end: datetime
    bucket_seconds: int
    group_by: str
    rows: list[TimelineRow]


def timeline_figures(
    runs: Sequence[RunRecord],
    sums: Sequence[WindowSum],
    spans: Sequence[tuple[datetime, datetime]],
    group_by: GroupBy,
    now: datetime,
) -> list[TimelineRow]:
    """The utilization report's figures, bucket by bucket (each bucket is its own range): the
    allocation of the runs overlapping it, and its windows' sums (`sums[i].bucket` indexes `spans`)."""
    groups: list[dict[str, Figures]] = [{} for _ in spans]
    for (lo, hi), mine, overlapping in zip(spans, groups, runs_by_bucket(runs, spans), strict=True):
        for run in overlapping:
            allocate(mine, run, lo, hi, min(hi, now), group_by)
    for term in window_terms(runs, sums):
        measure(figures_of(groups[term.bucket], term_key(term, group_by)), term)
    rows: list[TimelineRow] = []
    for (lo, hi), mine in zip(spans, groups, strict=True):
        for g in group_rows(mine):
            rows.append(
                TimelineRow(
                    lo,
                    hi,
                    g.group,
                    g.allocated_gpu_hours,
                    g.measured_gpu_hours,
                    g.used_gpu_hours,
                    g.idle_gpu_hours,
                    g.unmeasured_gpu_hours,
                    g.reclaimed_gpu_hours,
                    g.efficiency,
                )
            )
    return rows


def timeline(
    uow: UnitOfWork,
    who: Principal,
    start: datetime,
    end: datetime,
    now: datetime,
    group_by: str = "team",
    bucket: int | None = None,
) -> TimelineReport:
    start, end = check_span(start, end)
    if group_by not in set(GroupBy):
        raise Invalid(f"unknown group_by {group_by!r}; use one of {', '.join(g.value for g in GroupBy)}")
    spans = buckets(start, end, bucket, utc(now))
    team_id = team_scope(who)
    with uow:
        runs, sums = runs_and_sums(uow, team_id, spans, utc(now)) if spans else ([], [])
    size = _reported_size(start, end, bucket)
    rows = timeline_figures(runs, sums, spans, GroupBy(group_by), utc(now))
    return TimelineReport(start, end, size, group_by, rows)


# --- fairness ----------------------------------------------------------------------------------


@dataclass
class FairnessRow:
    bucket_start: datetime
    bucket_end: datetime
    team: str
    queue: str  # "all" on a team's row
    allocated_gpu_hours: float
    share: float | None  # of the fleet's allocated GPU-hours in the bucket; None when nothing ran
    entitlement: float
    share_over_entitlement: float | None


@dataclass
class FairnessReport:
    start: datetime
    end: datetime
    bucket_seconds: int
    by: str
    capacity_gpu_eq: float
    rows: list[FairnessRow]
    entitlements: dict[str, float] = field(default_factory=dict)


def entitlements(queues: Sequence[QueueRecord], capacity: float) -> dict[str, float]:
    """Queue name -> its fair share of the fleet (module docstring), 0 when the fleet has no GPUs."""
    if capacity <= 0 or not queues:
        return {q.queue: 0.0 for q in queues}
    teams: dict[str, list[QueueRecord]] = {}
    for q in queues:
        teams.setdefault(q.team, []).append(q)
    guaranteed: dict[str, float] = {}
    for members in teams.values():
        extra = max(0.0, members[0].team_guaranteed - sum(q.guaranteed for q in members))
        weights = sum(q.weight for q in members)
        for q in members:
            guaranteed[q.queue] = q.guaranteed + extra * q.weight / weights
    total = sum(guaranteed.values())
    scale = min(1.0, capacity / total) if total > 0 else 1.0
    free = max(0.0, capacity - total)
    all_weights = sum(q.weight for q in queues)
    return {q.queue: round((guaranteed[q.queue] * scale + free * q.weight / all_weights) / capacity, 6) for q in queues}


def fairness_figures(
    runs: Sequence[RunRecord],
    queues: Sequence[QueueRecord],
    capacity: float,
    spans: Sequence[tuple[datetime, datetime]],
    by: str,
    now: datetime,
    team_id: str | None,
) -> tuple[list[FairnessRow], dict[str, float]]:
    entitled = entitlements(queues, capacity)
    team_of = {q.queue: q.team for q in queues}
    visible = {q.queue for q in queues if team_id is None or q.team_id == team_id}
    rows: list[FairnessRow] = []
    for (lo, hi), overlapping in zip(spans, runs_by_bucket(runs, spans), strict=True):
        stop = min(hi, now)
        held: dict[str, float] = dict.fromkeys(entitled, 0.0)
        for run in overlapping:
            held[run.queue] = held.get(run.queue, 0.0) + run.gpu_eq * held_hours(run, lo, stop)
            team_of.setdefault(run.queue, run.team)
        fleet = sum(held.values())
        groups: dict[tuple[str, str], tuple[float, float]] = {}
        for queue, hours_ in held.items():
            if queue not in visible:
                continue
            key = (team_of.get(queue, ""), queue if by == "queue" else "all")
            before = groups.get(key, (0.0, 0.0))
            groups[key] = (before[0] + hours_, before[1] + entitled.get(queue, 0.0))
        for (team, queue), (hours_, entitlement) in sorted(groups.items()):
            share = hours_ / fleet if fleet > 0 else None
            ratio = share / entitlement if share is not None and entitlement > 0 else None
            rows.append(
                FairnessRow(
                    lo,
                    hi,
                    team,
                    queue,
                    round(hours_, 6),
                    None if share is None else round(share, 6),
                    round(entitlement, 6),
                    None if ratio is None else round(ratio, 6),
                )
            )
    shown = {q: e for q, e in entitled.items() if q in visible}
    return rows, shown


def fairness(
    uow: UnitOfWork,
    who: Principal,
    start: datetime,
    end: datetime,
    now: datetime,
    by: str = "queue",
    bucket: int | None = None,
) -> FairnessReport:
    start, end = check_span(start, end)
    if by not in ("queue", "team"):
        raise Invalid(f"unknown by {by!r}; use queue or team")
    spans = buckets(start, end, bucket, utc(now))
    team_id = team_scope(who)
    with uow:
        # Every team's runs: a share is of the whole fleet's allocation; rows are filtered below.
        runs = uow.reports.runs(start, end, None)
        queues = uow.reports.queues()
        capacity = uow.reports.capacity_gpu_eq()
    rows, shown = fairness_figures(runs, queues, capacity, spans, by, utc(now), team_id)
    size = _reported_size(start, end, bucket)
    return FairnessReport(start, end, size, by, capacity, rows, shown)
