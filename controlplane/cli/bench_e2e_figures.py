"""The figures of `gpufleet dev bench e2e`, read from SQL after the burst (and from the pod reports the
bench saw go by on NATS): what the database recorded is the truth the bench reports.

Times are differences of timestamps written by different processes on one machine (one clock).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, select, text

from adapters.sql.tables import RunAssignmentRow, RunRow, WorkloadRow
from controlplane.core.decision import EndCause
from controlplane.domain.model import GPU

# End causes of a run the control plane stopped to give its GPUs to other work.
EVICTION_CAUSES = frozenset(
    {EndCause.PREEMPTED, EndCause.RECLAIMED, EndCause.RECLAIMED_IDLE, EndCause.REBALANCED, EndCause.TAKEN_BACK}
)


def percentile(values: Sequence[float], q: int) -> float | None:
    """The q-th percentile of `values` in seconds, rounded to milliseconds (None when empty)."""
    if not values:
        return None
    if len(values) == 1:
        return round(values[0], 3)
    return round(statistics.quantiles(values, n=100, method="inclusive")[q - 1], 3)


def spread(values: Sequence[float]) -> dict[str, float | None]:
    return {
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "max": round(max(values), 3) if values else None,
    }


def deadlocks(engine: Engine) -> int:
    """PostgreSQL's count of deadlocks detected in this database since its statistics were reset."""
    with engine.connect() as conn:
        found = conn.scalar(text("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"))
    return int(found or 0)


@dataclass(frozen=True)
class RunFacts:
    run_id: str
    workload_id: str
    created_at: datetime  # admitted: the scheduler's cycle wrote the run
    dispatched_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    end_cause: str
    gpus: int


def _seconds(later: datetime | None, earlier: datetime | None) -> float | None:
    if later is None or earlier is None:
        return None
    return (later - earlier).total_seconds()


def _present(values: Iterable[float | None]) -> list[float]:
    return [v for v in values if v is not None]


def _runs(engine: Engine) -> list[RunFacts]:
    with engine.connect() as conn:
        gpus: dict[str, int] = {}
        for run_id, demand in conn.execute(select(RunAssignmentRow.run_id, RunAssignmentRow.demand)):
            gpus[run_id] = gpus.get(run_id, 0) + int(demand.get(GPU, 0))
        rows = conn.execute(
            select(
                RunRow.id,
                RunRow.workload_id,
                RunRow.created_at,
                RunRow.dispatched_at,
                RunRow.started_at,
                RunRow.finished_at,
                RunRow.end_cause,
            )
        ).all()
    return [RunFacts(*row, gpus=gpus.get(row[0], 0)) for row in rows]


def burst_figures(
    engine: Engine,
    started: datetime,
    running_seen: Mapping[str, datetime],
) -> dict[str, Any]:
    """Figures of the burst that began at `started` (the database holds nothing else).
    `running_seen`: run id -> when the bench saw its cluster report its pods running."""
    with engine.connect() as conn:
        workloads = conn.execute(
            select(
                WorkloadRow.id,
                WorkloadRow.priority_class,
                WorkloadRow.created_at,
                WorkloadRow.state,
                WorkloadRow.finished_at,
            )
        ).all()
    runs = _runs(engine)
    runs_by_id = {r.run_id: r for r in runs}
    by_workload: dict[str, list[RunFacts]] = {}
    for run in runs:
        by_workload.setdefault(run.workload_id, []).append(run)
    admission: dict[str, list[float]] = {}
    to_running: dict[str, list[float]] = {}
    states: dict[str, int] = {}
    last_finish = started
    for workload_id, cls, created_at, state, finished_at in workloads:
        states[state] = states.get(state, 0) + 1
        if finished_at is not None and finished_at > last_finish:
            last_finish = finished_at
        own = by_workload.get(workload_id, [])
        first_admitted = min((r.created_at for r in own), default=None)
        first_started = min((r.started_at for r in own if r.started_at is not None), default=None)
        if (seconds := _seconds(first_admitted, created_at)) is not None:
            admission.setdefault(cls, []).append(seconds)
        if (seconds := _seconds(first_started, created_at)) is not None:
            to_running.setdefault(cls, []).append(seconds)
    evicted = [r for r in runs if r.end_cause in EVICTION_CAUSES]
    # Work lost: the GPU time evicted runs had run. Capacity lost: the GPU time they held from
    # their admission on (dispatch and teardown included), for nothing.
    thrown_away = sum((_seconds(r.finished_at, r.started_at) or 0.0) * r.gpus for r in evicted)
    held = sum((_seconds(r.finished_at, r.created_at) or 0.0) * r.gpus for r in evicted)
    causes: dict[str, int] = {}
    for r in evicted:
        causes[r.end_cause] = causes.get(r.end_cause, 0) + 1
    # From the moment the bench saw the cluster report the pods running to the run's `started_at`.
    running_to_recorded = _present(
        _seconds(runs_by_id[run_id].started_at, seen) for run_id, seen in running_seen.items() if run_id in runs_by_id
    )
    return {
        "wall_seconds": round((last_finish - started).total_seconds(), 2),
        "states": dict(sorted(states.items())),
        "time_to_admission_seconds": {cls: spread(v) for cls, v in sorted(admission.items())},
        "time_to_running_seconds": {cls: spread(v) for cls, v in sorted(to_running.items())},
        "admission_to_dispatched_seconds": spread(_present(_seconds(r.dispatched_at, r.created_at) for r in runs)),
        "running_to_recorded_seconds": spread(running_to_recorded),
        "runs": len(runs),
        "evictions": len(evicted),
        "evicted_before_running": sum(1 for r in evicted if r.started_at is None),
        "workloads_run_more_than_once": sum(
            1 for own in by_workload.values() if sum(1 for r in own if r.started_at is not None) > 1
        ),
        "evictions_by_cause": dict(sorted(causes.items())),
        "gpu_seconds_thrown_away": round(thrown_away, 1),
        "gpu_seconds_held_by_evicted_runs": round(held, 1),
    }
