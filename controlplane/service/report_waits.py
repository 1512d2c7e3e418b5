"""Waiting-time report: how long workloads submitted in `[from, to)` waited for their first admission.

- **wait**: first admission (the first run's creation) minus submission. A workload never admitted
  is not dropped: one still waiting counts with its wait so far (to `now`), one that left first
  (cancelled, or failed validation later) with its wait until it left. `still_pending` and
  `left_unadmitted` say how many of the row's waits are such lower bounds.
- **size**: the gang's gpu-eq (every replica: whole GPUs, MIG sevenths, fractions), rounded up, in
  the buckets `<=1`, `2-8`, `9-32`, `33+`.
- **percentiles**: nearest rank (p50 is the smallest wait at least half the waits do not exceed),
  in seconds; `max` and `mean` likewise.

Rows are per team, queue and size; `teams` folds each team's queues and sizes, `total` all.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from controlplane.service.ports import UnitOfWork
from controlplane.service.report_accounting import check_span, team_scope, utc
from controlplane.service.report_records import WorkloadRecord
from controlplane.service.views import Principal

SIZE_BUCKETS = ((1.0, "<=1"), (8.0, "2-8"), (32.0, "9-32"), (math.inf, "33+"))
ALL = "all"
PENDING_NOTE = (
    "workloads never admitted count with their wait so far (still_pending) or until they left "
    "(left_unadmitted): those waits are lower bounds"
)


def size_bucket(gpu_eq: float) -> str:
    whole = math.ceil(gpu_eq - 1e-9)
    return next(name for bound, name in SIZE_BUCKETS if whole <= bound)


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of an ascending, non-empty sequence."""
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def wait_seconds(w: WorkloadRecord, now: datetime) -> tuple[float, str]:
    """The workload's wait and how it ended: `admitted`, `pending` (so far) or `left` (unadmitted)."""
    if w.first_admitted_at is not None:
        return max(0.0, (w.first_admitted_at - w.submitted_at).total_seconds()), "admitted"
    if w.finished_at is not None:
        return max(0.0, (w.finished_at - w.submitted_at).total_seconds()), "left"
    return max(0.0, (now - w.submitted_at).total_seconds()), "pending"


@dataclass
class WaitRow:
    team: str
    queue: str
    size: str
    workloads: int = 0
    admitted: int = 0
    still_pending: int = 0
    left_unadmitted: int = 0
    p50_seconds: float | None = None
    p95_seconds: float | None = None
    max_seconds: float | None = None
    mean_seconds: float | None = None


@dataclass
class WaitingReport:
    start: datetime
    end: datetime
    as_of: datetime
    rows: list[WaitRow]
    teams: list[WaitRow]
    total: WaitRow
    size_buckets: list[str] = field(default_factory=lambda: [name for _, name in SIZE_BUCKETS])
    note: str = PENDING_NOTE


def _row(team: str, queue: str, size: str, items: Sequence[tuple[float, str]]) -> WaitRow:
    row = WaitRow(team, queue, size, workloads=len(items))
    row.admitted = sum(1 for _, how in items if how == "admitted")
    row.still_pending = sum(1 for _, how in items if how == "pending")
    row.left_unadmitted = sum(1 for _, how in items if how == "left")
    waits = sorted(w for w, _ in items)
    if waits:
        row.p50_seconds = round(percentile(waits, 50), 3)
        row.p95_seconds = round(percentile(waits, 95), 3)
        row.max_seconds = round(waits[-1], 3)
        row.mean_seconds = round(sum(waits) / len(waits), 3)
    return row


def waiting_figures(
    workloads: Sequence[WorkloadRecord], start: datetime, end: datetime, now: datetime
) -> WaitingReport:
    by_row: dict[tuple[str, str, str], list[tuple[float, str]]] = {}
    by_team: dict[str, list[tuple[float, str]]] = {}
    everything: list[tuple[float, str]] = []
    for w in workloads:
        item = wait_seconds(w, now)
        by_row.setdefault((w.team, w.queue, size_bucket(w.gpu_eq)), []).append(item)
        by_team.setdefault(w.team, []).append(item)
        everything.append(item)
    order = {name: i for i, (_, name) in enumerate(SIZE_BUCKETS)}
    rows = [
        _row(*key, items) for key, items in sorted(by_row.items(), key=lambda kv: (kv[0][0], kv[0][1], order[kv[0][2]]))
    ]
    teams = [_row(team, ALL, ALL, items) for team, items in sorted(by_team.items())]
    return WaitingReport(start, end, now, rows, teams, _row(ALL, ALL, ALL, everything))


def waiting(uow: UnitOfWork, who: Principal, start: datetime, end: datetime, now: datetime) -> WaitingReport:
    """The report as `who` may see it: an admin every team, a team token its own workloads."""
    start, end = check_span(start, end)
    team_id = team_scope(who)
    with uow:
        workloads = uow.reports.workloads(start, end, team_id)
    return waiting_figures(workloads, start, end, utc(now))
