"""Fleet utilization reports: what was allocated, used, left idle and reclaimed over `[from, to)`.

Every figure is in GPU-hours of gpu-eq (a whole GPU is 1, a MIG slice its compute slices / 7, a
time-sliced or MPS share 1 / replicas) and is clipped to the range `[start, end)` and to `now`:

- **allocated_gpu_hours**: per run, its gpu-eq x the overlap of `[admitted, ended)` with the
  range. A run holds capacity from admission (its row is created when the scheduler admits it) to
  its end (`finished_at`; a live run holds it until `now`).
- **measured_gpu_hours**: per telemetry window of a run that has an activity reading, the run's
  gpu-eq share of that GPU (1 for a whole GPU, the slice's gpu-eq for a MIG instance, 1 / replicas
  for a shared GPU) x the overlap of the window with the range and with the run's allocation.
- **used_gpu_hours**: the same sum, each term also multiplied by the window's activity mean
  (SM_ACTIVE, else GR_ENGINE_ACTIVE, else GPU_UTIL, as a ratio 0..1).
- **idle_gpu_hours**: the measured hours of windows whose activity mean is below the idle
  threshold (0.05 by default, the idle policy's default).
- **unmeasured_gpu_hours**: allocated minus measured (never below 0): allocation that no window
  with an activity reading covers. Unknown is neither used nor idle.
- **reclaimed_gpu_hours**: per run reclaimed for idleness inside the range (state `preempted`, a
  message starting `reclaimed-idle:`, `finished_at` in the range), its gpu-eq x the time from the
  reclaim to the end of the range (or `now`, if earlier): the capacity it handed back.
- **efficiency**: used / measured (None when nothing was measured). Unmeasured time is left out
  on purpose, so missing telemetry neither flatters nor punishes a group.

A group is a team, a queue, a cluster or a GPU model. For GPU models a run's allocation is split
by the model of each pod's node pool, and each window goes to the model of its node.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from controlplane.service.errors import Invalid
from controlplane.service.events import envelope
from controlplane.service.ports import UnitOfWork, UnitOfWorkFactory
from controlplane.service.report_accounting import (
    DEFAULT_IDLE_THRESHOLD,
    WindowTerm,
    check_span,
    held_hours,
    reclaimed_hours,
    utc,
    window_terms,
)

# Also re-exported: these values were defined here before they moved to their leaf module.
from controlplane.service.report_records import ReportRepository, RunRecord, RunSlice, WindowSum  # noqa: F401
from controlplane.service.views import Principal

DEFAULT_TOP = 10
MAX_TOP = 100
REPORT_EVENT = "utilization.report"
REPORT_ACTION = "report.utilization"


class GroupBy(StrEnum):
    TEAM = "team"
    QUEUE = "queue"
    CLUSTER = "cluster"
    GPU_MODEL = "gpu_model"


# --- plain rows in -----------------------------------------------------------------------------


# --- figures out -------------------------------------------------------------------------------


@dataclass
class Figures:
    runs: int = 0
    allocated_gpu_hours: float = 0.0
    measured_gpu_hours: float = 0.0
    used_gpu_hours: float = 0.0
    idle_gpu_hours: float = 0.0
    unmeasured_gpu_hours: float = 0.0
    reclaimed_gpu_hours: float = 0.0
    efficiency: float | None = None

    def add(self, other: Figures) -> None:
        self.runs += other.runs
        self.allocated_gpu_hours += other.allocated_gpu_hours
        self.measured_gpu_hours += other.measured_gpu_hours
        self.used_gpu_hours += other.used_gpu_hours
        self.idle_gpu_hours += other.idle_gpu_hours
        self.reclaimed_gpu_hours += other.reclaimed_gpu_hours

    def finish(self) -> None:
        """Derived figures, then rounding (to a microsecond-GPU-hour, so sums read cleanly)."""
        self.unmeasured_gpu_hours = max(0.0, self.allocated_gpu_hours - self.measured_gpu_hours)
        self.efficiency = self.used_gpu_hours / self.measured_gpu_hours if self.measured_gpu_hours > 0 else None
        for name in (
            "allocated_gpu_hours",
            "measured_gpu_hours",
            "used_gpu_hours",
            "idle_gpu_hours",
            "unmeasured_gpu_hours",
            "reclaimed_gpu_hours",
        ):
            setattr(self, name, round(getattr(self, name), 6))
        if self.efficiency is not None:
            self.efficiency = round(self.efficiency, 6)


@dataclass
class GroupRow(Figures):
    group: str = ""


@dataclass
class IdleRun:
    run_id: str
    workload_id: str
    workload: str
    team: str
    queue: str
    cluster: str
    state: str
    gpu_eq: float
    allocated_gpu_hours: float
    used_gpu_hours: float
    idle_gpu_hours: float
    efficiency: float | None


@dataclass
class UtilizationReport:
    start: datetime
    end: datetime
    group_by: str
    idle_threshold: float
    groups: list[GroupRow]
    total: Figures
    top_idle_runs: list[IdleRun] = field(default_factory=list)


# --- pure aggregation --------------------------------------------------------------------------


def _key(run: RunRecord, group_by: GroupBy) -> str:
    if group_by is GroupBy.TEAM:
        return run.team
    if group_by is GroupBy.QUEUE:
        return run.queue
    return run.cluster


def figures_of(groups: dict[str, Figures], key: str) -> Figures:
    found = groups.get(key)
    if found is None:
        found = groups[key] = Figures()
    return found


def allocate(
    groups: dict[str, Figures], run: RunRecord, start: datetime, end: datetime, stop: datetime, group_by: GroupBy
) -> tuple[float, float]:
    """Add the run's allocation and reclaimed capacity in `[start, end)` (up to `stop`) to its
    group (for GPU models, each model its pods hold); return the run's own (allocated, reclaimed)."""
    held = held_hours(run, start, stop)
    reclaimed = reclaimed_hours(run, start, end, stop)
    if group_by is GroupBy.GPU_MODEL:
        models: dict[str, float] = {}
        for s in run.slices:
            models[s.gpu_model] = models.get(s.gpu_model, 0.0) + s.gpu_eq
        for model, eq in models.items():
            g = figures_of(groups, model)
            g.runs += 1
            g.allocated_gpu_hours += eq * held
            g.reclaimed_gpu_hours += eq * reclaimed
        return run.gpu_eq * held, run.gpu_eq * reclaimed
    g = figures_of(groups, _key(run, group_by))
    g.runs += 1
    allocated, handed_back = run.gpu_eq * held, run.gpu_eq * reclaimed
    g.allocated_gpu_hours += allocated
    g.reclaimed_gpu_hours += handed_back
    return allocated, handed_back


def measure(figures: Figures, term: WindowTerm) -> None:
    figures.measured_gpu_hours += term.measured
    figures.used_gpu_hours += term.used
    figures.idle_gpu_hours += term.idle


def term_key(term: WindowTerm, group_by: GroupBy) -> str:
    return term.gpu_model if group_by is GroupBy.GPU_MODEL else _key(term.run, group_by)


def group_rows(groups: Mapping[str, Figures]) -> list[GroupRow]:
    rows: list[GroupRow] = []
    for key in sorted(groups):
        row = GroupRow(group=key)
        row.add(groups[key])
        row.finish()
        rows.append(row)
    return rows


def aggregate_sums(
    runs: Sequence[RunRecord],
    sums: Iterable[WindowSum],
    start: datetime,
    end: datetime,
    group_by: GroupBy,
    now: datetime,
    top: int = DEFAULT_TOP,
    threshold: float = DEFAULT_IDLE_THRESHOLD,
) -> UtilizationReport:
    """The report over runs (with their pods) and the sums of their windows over `[start, end)`
    (one bucket: `ReportRepository.window_sums`)."""
    stop = min(end, now)
    by_run = {r.run_id: r for r in runs}
    groups: dict[str, Figures] = {}
    per_run: dict[str, Figures] = {}
    for run in runs:
        mine = per_run[run.run_id] = Figures(runs=1)
        mine.allocated_gpu_hours, mine.reclaimed_gpu_hours = allocate(groups, run, start, end, stop, group_by)

    for term in window_terms(runs, sums):
        measure(figures_of(groups, term_key(term, group_by)), term)
        measure(per_run[term.run.run_id], term)

    rows = group_rows(groups)
    total = Figures()
    for mine in per_run.values():
        total.add(mine)
    total.finish()

    ranked = sorted(
        (r for r in per_run.items() if r[1].idle_gpu_hours > 0), key=lambda item: (-item[1].idle_gpu_hours, item[0])
    )
    top_runs: list[IdleRun] = []
    for run_id, mine in ranked[: max(0, top)]:
        run = by_run[run_id]
        mine.finish()
        top_runs.append(
            IdleRun(
                run_id=run.run_id,
                workload_id=run.workload_id,
                workload=run.workload,
                team=run.team,
                queue=run.queue,
                cluster=run.cluster,
                state=run.state,
                gpu_eq=round(run.gpu_eq, 6),
                allocated_gpu_hours=mine.allocated_gpu_hours,
                used_gpu_hours=mine.used_gpu_hours,
                idle_gpu_hours=mine.idle_gpu_hours,
                efficiency=mine.efficiency,
            )
        )
    return UtilizationReport(start, end, str(group_by), threshold, rows, total, top_runs)


# --- with the database -------------------------------------------------------------------------


def check_range(start: datetime, end: datetime, group_by: str, top: int) -> tuple[datetime, datetime, GroupBy]:
    """Validated inputs (naive times are taken as UTC); `Invalid` with a message otherwise."""
    start, end = check_span(start, end)
    if group_by not in set(GroupBy):
        raise Invalid(f"unknown group_by {group_by!r}; use one of {', '.join(g.value for g in GroupBy)}")
    if not 0 <= top <= MAX_TOP:
        raise Invalid(f"top must be between 0 and {MAX_TOP}")
    return start, end, GroupBy(group_by)


def runs_and_sums(
    uow: UnitOfWork,
    team_id: str | None,
    spans: Sequence[tuple[datetime, datetime]],
    now: datetime,
    threshold: float = DEFAULT_IDLE_THRESHOLD,
) -> tuple[list[RunRecord], list[WindowSum]]:
    """The runs whose allocation overlaps the spans (of one team or all) and their windows' sums
    per span, summed by the database."""
    runs = uow.reports.runs(spans[0][0], spans[-1][1], team_id)
    sums = uow.reports.window_sums(spans, team_id, now, threshold) if runs else []
    return runs, sums


def _report(
    uow: UnitOfWork, team_id: str | None, start: datetime, end: datetime, group_by: GroupBy, top: int, now: datetime
) -> UtilizationReport:
    runs, sums = runs_and_sums(uow, team_id, [(start, end)], now)
    return aggregate_sums(runs, sums, start, end, group_by, now, top)


def utilization(
    uow: UnitOfWork,
    who: Principal,
    start: datetime,
    end: datetime,
    group_by: str,
    now: datetime,
    top: int = DEFAULT_TOP,
) -> UtilizationReport:
    """The report as `who` may see it: an admin sees every group, a team only its own runs."""
    start, end, by = check_range(start, end, group_by, top)
    team_id = None if who.is_admin else who.team_id
    if not who.is_admin and team_id is None:
        raise Invalid("this token belongs to no team")
    with uow:
        return _report(uow, team_id, start, end, by, top, now)


# --- the hourly event --------------------------------------------------------------------------


def report_subject(prefix: str) -> str:
    return f"{prefix}.events.report.utilization"


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def report_dict(report: UtilizationReport) -> dict[str, Any]:
    data: dict[str, Any] = _plain(asdict(report))
    return data


def previous_hour(now: datetime) -> tuple[datetime, datetime]:
    end = utc(now).replace(minute=0, second=0, microsecond=0)
    return end - timedelta(hours=1), end


def publish_hourly_report(uow_factory: UnitOfWorkFactory, prefix: str, now: datetime, top: int = DEFAULT_TOP) -> bool:
    """Write the `utilization.report` event of the previous full hour to the outbox, once.

    Idempotent per hour: the audit log keeps a `report.utilization` entry keyed by the hour's
    start, written in the same transaction as the event, and the event id is derived from the hour
    (so JetStream's de-duplication also drops a copy). Returns whether it wrote the event.
    """
    start, end = previous_hour(now)
    key = start.isoformat()
    with uow_factory() as uow:
        if uow.reports.marked(REPORT_ACTION, key):
            return False
        runs, sums = runs_and_sums(uow, None, [(start, end)], now)
        data: dict[str, Any] = {"from": key, "to": end.isoformat(), "idle_threshold": DEFAULT_IDLE_THRESHOLD}
        by_group: dict[str, Any] = {}
        for by in GroupBy:
            report = aggregate_sums(runs, sums, start, end, by, now, top)
            by_group[by.value] = report_dict(report)["groups"]
            data["total"] = report_dict(report)["total"]
            data["top_idle_runs"] = report_dict(report)["top_idle_runs"]
        data["groups"] = by_group
        event_id = uuid.uuid5(uuid.NAMESPACE_URL, f"gpufleet:{prefix}:{REPORT_EVENT}:{key}").hex
        _, payload = envelope(REPORT_EVENT, data, now, event_id=event_id)
        uow.outbox.add(report_subject(prefix), event_id, payload, now)
        uow.audit.record("reporter", REPORT_ACTION, "report", key, {"event_id": event_id, "runs": len(runs)}, now)
        uow.commit()
    return True
