"""What evictions and idle allocations cost: the preemption report and the cost report.

**Evictions** are runs that ended inside `[from, to)` for one of the scheduler's eviction kinds
(their end cause: `preempted`, `reclaimed`, `reclaimed-idle`, `rebalanced`, `taken-back`):
- `gpu_hours_lost`: work thrown away, the victim's gpu-eq x the time from its start (its pods all
  running) to the eviction, counted whole at the eviction; 0 for a run that never started;
- `gpu_hours_returned`: for `reclaimed-idle`, capacity handed back as the utilization report
  defines it (gpu-eq x the time from the reclaim to the end of the range, or now);
- the beneficiary's team is read from the audit log (`run.reclaim-idle`, `run.evict`); "unknown"
  for evictions recorded before it was kept. A team token sees the evictions of its own runs.

**Cost** multiplies GPU-hours by the price per GPU-hour of the pool each pod ran on, in the unit
the pools' prices are configured in: `allocated_cost` (allocation), `measured_cost` (telemetry
covered it), `used_cost` (x activity), `cost_at_stake` = allocated - used (money paid for GPUs not
doing work, including unmeasured time), `unmeasured_cost` = allocated - measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from controlplane.core.decision import EvictionKind
from controlplane.service.errors import Invalid
from controlplane.service.ports import UnitOfWork
from controlplane.service.report_accounting import (
    check_span,
    held_hours,
    hours,
    reclaimed_hours,
    team_scope,
    utc,
    window_terms,
)
from controlplane.service.report_records import RunRecord, WindowSum
from controlplane.service.reports import GroupBy, runs_and_sums
from controlplane.service.views import Principal

EVICTION_CAUSES = tuple(str(kind.end_cause) for kind in EvictionKind)
UNKNOWN = "unknown"


@dataclass
class EvictionRow:
    kind: str  # the run's end cause
    victim_team: str
    beneficiary_team: str
    evictions: int = 0
    gpu_hours_lost: float = 0.0
    gpu_hours_returned: float = 0.0


@dataclass
class EvictionReport:
    start: datetime
    end: datetime
    rows: list[EvictionRow]
    by_kind: list[EvictionRow]  # victim and beneficiary "all"
    total: EvictionRow


def eviction_figures(
    runs: Sequence[RunRecord], beneficiaries: dict[str, str], start: datetime, end: datetime, now: datetime
) -> EvictionReport:
    stop = min(end, now)
    rows: dict[tuple[str, str, str], EvictionRow] = {}
    kinds: dict[str, EvictionRow] = {cause: EvictionRow(cause, "all", "all") for cause in EVICTION_CAUSES}
    total = EvictionRow("all", "all", "all")
    for run in runs:
        if run.end_cause not in EVICTION_CAUSES or run.finished_at is None or not start <= run.finished_at < end:
            continue
        lost = run.gpu_eq * hours(run.started_at, run.finished_at) if run.started_at is not None else 0.0
        returned = run.gpu_eq * reclaimed_hours(run, start, end, stop)
        key = (run.end_cause, run.team, beneficiaries.get(run.run_id, UNKNOWN))
        row = rows.get(key) or rows.setdefault(key, EvictionRow(*key))
        for target in (row, kinds[run.end_cause], total):
            target.evictions += 1
            target.gpu_hours_lost += lost
            target.gpu_hours_returned += returned
    for r in (*rows.values(), *kinds.values(), total):
        r.gpu_hours_lost, r.gpu_hours_returned = round(r.gpu_hours_lost, 6), round(r.gpu_hours_returned, 6)
    return EvictionReport(start, end, [rows[k] for k in sorted(rows)], list(kinds.values()), total)


def evictions(uow: UnitOfWork, who: Principal, start: datetime, end: datetime, now: datetime) -> EvictionReport:
    start, end = check_span(start, end)
    team_id = team_scope(who)
    with uow:
        runs = uow.reports.runs(start, end, team_id)
        ended = [r.run_id for r in runs if r.end_cause in EVICTION_CAUSES]
        beneficiaries = uow.reports.beneficiary_teams(ended) if ended else {}
    return eviction_figures(runs, beneficiaries, start, end, utc(now))


# --- cost --------------------------------------------------------------------------------------


@dataclass
class CostRow:
    group: str
    allocated_gpu_hours: float = 0.0
    used_gpu_hours: float = 0.0
    allocated_cost: float = 0.0
    measured_cost: float = 0.0
    used_cost: float = 0.0
    cost_at_stake: float = 0.0
    unmeasured_cost: float = 0.0

    def finish(self) -> None:
        self.cost_at_stake = max(0.0, self.allocated_cost - self.used_cost)
        self.unmeasured_cost = max(0.0, self.allocated_cost - self.measured_cost)
        for name in (
            "allocated_gpu_hours",
            "used_gpu_hours",
            "allocated_cost",
            "measured_cost",
            "used_cost",
            "cost_at_stake",
            "unmeasured_cost",
        ):
            setattr(self, name, round(getattr(self, name), 6))


@dataclass
class CostReport:
    start: datetime
    end: datetime
    group_by: str
    groups: list[CostRow]
    total: CostRow


def _key(run: RunRecord, by: GroupBy) -> str:
    return {GroupBy.TEAM: run.team, GroupBy.QUEUE: run.queue}.get(by, run.cluster)


def cost_figures(
    runs: Sequence[RunRecord],
    sums: Sequence[WindowSum],
    start: datetime,
    end: datetime,
    by: GroupBy,
    now: datetime,
) -> CostReport:
    stop = min(end, now)
    groups: dict[str, CostRow] = {}
    total = CostRow("total")

    def rows(key: str) -> tuple[CostRow, CostRow]:
        return (groups.get(key) or groups.setdefault(key, CostRow(key))), total

    for run in runs:
        held = held_hours(run, start, stop)
        for s in run.slices:
            key = s.gpu_model if by is GroupBy.GPU_MODEL else _key(run, by)
            for row in rows(key):
                row.allocated_gpu_hours += s.gpu_eq * held
                row.allocated_cost += s.gpu_eq * held * s.price_per_gpu_hour
    for term in window_terms(runs, sums):
        key = term.gpu_model if by is GroupBy.GPU_MODEL else _key(term.run, by)
        for row in rows(key):
            row.used_gpu_hours += term.used
            row.measured_cost += term.measured * term.price_per_gpu_hour
            row.used_cost += term.used * term.price_per_gpu_hour
    for row in (*groups.values(), total):
        row.finish()
    return CostReport(start, end, str(by), [groups[k] for k in sorted(groups)], total)


def cost(
    uow: UnitOfWork, who: Principal, start: datetime, end: datetime, now: datetime, group_by: str = "team"
) -> CostReport:
    start, end = check_span(start, end)
    if group_by not in set(GroupBy):
        raise Invalid(f"unknown group_by {group_by!r}; use one of {', '.join(g.value for g in GroupBy)}")
    team_id = team_scope(who)
    with uow:
        runs, sums = runs_and_sums(uow, team_id, [(start, end)], utc(now))
    return cost_figures(runs, sums, start, end, GroupBy(group_by), utc(now))
