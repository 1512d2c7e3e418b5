"""The reports' telemetry sums in SQL against the Python computation they replaced, on SQLite and
PostgreSQL: the same windows, clipped the same way, give the same figures.

The fixture has the awkward cases: windows that start before a run's admission or run past its end,
windows that straddle bucket edges and `now`, microsecond offsets, MIG windows (with a profile this
version does not know), a time-sliced pool, a window on a node where the run has no pod, windows
with only a graphics-engine or a GPU-utilization reading or none, a two-hour window that starts
before the one-hour lookback, another team's run, a run that ended before the range, and GPUs with
no run.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, insert

from adapters.sql.engine import make_engine, make_session_factory
from adapters.sql.tables import (
    ClusterRow,
    NodePoolRow,
    NodeRow,
    PriorityClassRow,
    QueueRow,
    RunAssignmentRow,
    RunRow,
    TeamRow,
    WorkloadRow,
)
from adapters.sql.uow import SqlUnitOfWork
from controlplane.core.decision import EndCause
from controlplane.domain.sharing import InvalidSharingMode, mig_gpu_eq
from controlplane.service import report_cost, report_over_time, reports
from controlplane.service.report_accounting import DEFAULT_IDLE_THRESHOLD, held_hours, hours, reclaimed_hours, run_end
from controlplane.service.report_records import WINDOW_LOOKBACK, RunRecord, RunSlice, WindowSum
from controlplane.service.telemetry_window import TelemetryWindow, WindowQuery
from controlplane.service.views import Principal

# --- the rule computed window by window: what the SQL sums must equal ----------------------------


def window_sums(
    runs: Sequence[RunRecord],
    windows: Iterable[TelemetryWindow],
    spans: Sequence[tuple[datetime, datetime]],
    now: datetime,
    threshold: float = DEFAULT_IDLE_THRESHOLD,
) -> list[WindowSum]:
    """The windows in hand summed window by window, as `ReportRepository.window_sums` must sum them
    in SQL (the definition both follow): per bucket `(lo, hi)`, the windows of `runs` that start in
    `[lo - WINDOW_LOOKBACK, hi)` and have an activity reading, each for its overlap with
    `[max(lo, admission), min(hi, now, the run's end))`. Windows of other runs are skipped."""
    by_run = {r.run_id: r for r in runs}
    ordered = sorted((w for w in windows if (w.run_id or "") in by_run), key=lambda w: w.window_start)
    starts = [w.window_start for w in ordered]
    sums: dict[tuple[int, str, str, str | None], list[float]] = {}
    for index, (lo, hi) in enumerate(spans):
        stop = min(hi, now)
        for w in ordered[bisect.bisect_left(starts, lo - WINDOW_LOOKBACK) : bisect.bisect_left(starts, hi)]:
            run = by_run[w.run_id or ""]
            begin = max(w.window_start, lo, run.admitted_at)
            finish = min(w.window_end, run_end(run, stop))
            activity = w.activity_mean
            if finish <= begin or activity is None:
                continue
            seconds = (finish - begin).total_seconds()
            found = sums.setdefault((index, run.run_id, w.node, w.mig_profile), [0.0, 0.0, 0.0])
            found[0] += seconds
            found[1] += seconds * activity
            if activity < threshold:
                found[2] += seconds
    return [WindowSum(*key, *figures) for key, figures in sums.items()]


def aggregate(
    runs: Sequence[RunRecord],
    windows: Iterable[TelemetryWindow],
    start: datetime,
    end: datetime,
    group_by: reports.GroupBy,
    now: datetime,
    top: int = reports.DEFAULT_TOP,
    threshold: float = DEFAULT_IDLE_THRESHOLD,
) -> reports.UtilizationReport:
    """The report over plain rows: runs (with their pods) and their telemetry windows, summed here.

    Windows of runs not in `runs` are ignored (other teams', or unattributed GPUs)."""
    sums = window_sums(runs, windows, [(start, end)], now, threshold)
    return reports.aggregate_sums(runs, sums, start, end, group_by, now, top, threshold)


T0 = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)
START, END = T0, T0 + timedelta(hours=3)
NOW = T0 + timedelta(hours=2, minutes=31, microseconds=7)  # buckets after it are left out, one is cut
US = timedelta(microseconds=1)
ADMIN = Principal("admin-token", "admin", None)
TEAM_A = Principal("a-token", "member", "ta")
THRESHOLD = 0.05


def _window(
    run: str,
    node: str,
    gpu: int,
    start: datetime,
    seconds: int = 300,
    sm: float | None = None,
    gr: float | None = None,
    util: float | None = None,
    mig: str | None = None,
) -> TelemetryWindow:
    def reading(value: float | None) -> tuple[int, float, float]:
        return (0, 0.0, 0.0) if value is None else (10, 10 * value, value)

    return TelemetryWindow(
        run or None,
        f"{node}/{gpu}" + (f"/{mig}" if mig else ""),
        start,
        seconds,
        "c1",
        node,
        f"GPU-{node}-{gpu}",
        gpu,
        mig,
        0 if mig else None,
        None,
        None,
        10,
        start,
        start + timedelta(seconds=seconds),
        *reading(sm),
        *reading(gr),
        *reading(util),
        0,
        0.0,
        1,
        512.0,
        0,
        0.0,
        0,
        0.0,
        None,
        None,
        0,
    )


def _windows() -> list[TelemetryWindow]:
    out: list[TelemetryWindow] = []
    # r1 (team a, two 2-GPU pods on the H100 pool): admitted 30 min before the range, still live;
    # 5-minute windows from before its admission to past `now`, offset so they straddle buckets.
    t = T0 - timedelta(minutes=37, microseconds=250_001)
    i = 0
    while t < NOW + timedelta(minutes=10):
        for node in ("n1", "n2"):
            for gpu in (0, 1):
                k = i * 4 + gpu + (2 if node == "n2" else 0)
                if k % 11 == 0:
                    out.append(_window("r1", node, gpu, t))  # no activity reading
                elif k % 7 == 0:
                    out.append(_window("r1", node, gpu, t, gr=(k % 13) / 13))
                elif k % 5 == 0:
                    out.append(_window("r1", node, gpu, t, util=0.01))  # below the idle threshold
                else:
                    out.append(_window("r1", node, gpu, t, sm=(k % 17) / 17))
        t += timedelta(minutes=5)
        i += 1
    # r1 also reports from a node where it has no pod: a share of 1, its first pod's model.
    out.append(_window("r1", "n9", 0, T0 + timedelta(minutes=50), sm=0.4))
    # r2 (team b, MIG pool): admitted and ended off the minute, one-minute windows with MIG
    # profiles, one this version does not know (its pod's device share counts instead).
    t = T0 + timedelta(minutes=16, seconds=11)
    while t < T0 + timedelta(hours=1, minutes=50):
        out.append(_window("r2", "n3", 0, t, seconds=60, sm=0.03, mig="1g.10gb"))
        out.append(_window("r2", "n3", 1, t, seconds=60, sm=0.6, mig="3g.40gb"))
        out.append(_window("r2", "n3", 2, t, seconds=60, sm=0.9, mig="9z.99gb"))
        t += timedelta(seconds=60)
    # r3 (team a, time-sliced L4 pool): a two-hour window starting before the lookback (never
    # counted), an hour-long one starting inside it, and 10-minute windows.
    out.append(_window("r3", "n4", 0, T0 - timedelta(minutes=90), seconds=7200, sm=0.8))
    out.append(_window("r3", "n4", 0, T0 - timedelta(minutes=45), seconds=3600, sm=0.2))
    # A two-hour window inside the range counts only in buckets starting at most an hour after it.
    out.append(_window("r3", "n4", 1, T0 + timedelta(minutes=5), seconds=7200, sm=0.7))
    t = T0 + timedelta(minutes=20)
    while t < T0 + timedelta(hours=3):
        out.append(_window("r3", "n4", 0, t, seconds=600, sm=0.5, gr=0.9))
        t += timedelta(minutes=10)
    # r4 ended before the range; windows of no run.
    out.append(_window("r4", "n1", 0, T0 - timedelta(hours=2), sm=1.0))
    out.append(_window("", "n2", 3, T0 + timedelta(minutes=5), sm=0.7))
    return out


def _populate(engine: Engine) -> None:
    created = T0 - timedelta(days=1)
    with engine.begin() as conn:
        conn.execute(insert(PriorityClassRow), [{"name": "batch", "value": 0}])
        conn.execute(
            insert(TeamRow), [{"id": t, "name": n, "created_at": created} for t, n in (("ta", "a"), ("tb", "b"))]
        )
        conn.execute(
            insert(QueueRow),
            [{"id": f"q{t}", "name": f"q-{t}", "team_id": t, "created_at": created} for t in ("ta", "tb")],
        )
        conn.execute(insert(ClusterRow), [{"id": "c1", "name": "c1", "provider": "sim", "created_at": created}])
        pool = {
            "cluster_id": "c1",
            "gpus_per_node": 8,
            "cpu_millis": 64_000,
            "memory_mib": 512_000,
            "node_count": 2,
            "sharing": "exclusive",
            "price_per_gpu_hour": 0.0,
        }
        conn.execute(
            insert(NodePoolRow),
            [
                {**pool, "id": "p1", "name": "h100", "gpu_model": "H100-80GB", "price_per_gpu_hour": 3.5},
                {**pool, "id": "p2", "name": "mig", "gpu_model": "A100-80GB", "sharing": "mig:all-balanced"},
                {
                    **pool,
                    "id": "p3",
                    "name": "l4",
                    "gpu_model": "L4",
                    "sharing": "timeslice:4",
                    "price_per_gpu_hour": 0.8,
                },
            ],
        )
        conn.execute(
            insert(NodeRow),
            [
                {"id": n, "cluster_id": "c1", "pool_id": p, "name": n}
                for n, p in (("n1", "p1"), ("n2", "p1"), ("n3", "p2"), ("n4", "p3"))
            ],
        )
        workload = {"priority_class": "batch", "priority": 0, "kind": "training", "min_available": 1}
        runs = (  # id, team, admitted, finished, cause, pods (node, demand)
            ("r1", "ta", T0 - timedelta(minutes=30), None, "", (("n1", {"gpu": 2}), ("n2", {"gpu": 2}))),
            (
                "r2",
                "tb",
                T0 + timedelta(minutes=17, microseconds=123_456),
                T0 + timedelta(hours=1, minutes=43, microseconds=654_321),
                EndCause.RECLAIMED_IDLE,
                (("n3", {"mig:1g.10gb": 1, "mig:3g.40gb": 1}),),
            ),
            ("r3", "ta", T0 - timedelta(hours=2), None, "", (("n4", {"share": 1}),)),
            ("r4", "ta", T0 - timedelta(hours=3), T0 - timedelta(hours=1), "", (("n1", {"gpu": 1}),)),
        )
        for n, (run, team, admitted, finished, cause, pods) in enumerate(runs):
            conn.execute(
                insert(WorkloadRow),
                [
                    {
                        **workload,
                        "id": f"w{run}",
                        "team_id": team,
                        "queue_id": f"q{team}",
                        "name": f"work-{run}",
                        "state": "running" if finished is None else "preempted",
                        "created_seq": n,
                        "created_at": admitted - timedelta(minutes=1),
                        "updated_at": admitted,
                    }
                ],
            )
            conn.execute(
                insert(RunRow),
                [
                    {
                        "id": run,
                        "workload_id": f"w{run}",
                        "attempt": 1,
                        "cluster_id": "c1",
                        "epoch": 1,
                        "state": "running" if finished is None else "preempted",
                        "message": "reclaimed-idle: idle" if cause else "",
                        "end_cause": str(cause),
                        "created_at": admitted,
                        "started_at": admitted + timedelta(minutes=1),
                        "finished_at": finished,
                    }
                ],
            )
            conn.execute(
                insert(RunAssignmentRow),
                [
                    {"run_id": run, "ordinal": i, "pod_set": "p", "pod_index": i, "node_id": node, "demand": demand}
                    for i, (node, demand) in enumerate(pods)
                ],
            )


@dataclass
class Fleet:
    engine: Engine

    def uow(self) -> SqlUnitOfWork:
        return SqlUnitOfWork(make_session_factory(self.engine))


@pytest.fixture
def fleet(database_url: str) -> Iterator[Fleet]:
    engine = make_engine(database_url)
    _populate(engine)
    with SqlUnitOfWork(make_session_factory(engine)) as uow:
        uow.telemetry.merge_windows(_windows(), NOW)
        uow.commit()
    yield Fleet(engine)
    engine.dispose()


def _read(
    fleet: Fleet, team_id: str | None, start: datetime, end: datetime
) -> tuple[list[RunRecord], list[TelemetryWindow]]:
    """Runs and every window of the range, as the reports read them before they summed in SQL."""
    with fleet.uow() as uow:
        runs = uow.reports.runs(start, end, team_id)
        windows = uow.telemetry.windows(WindowQuery(since=start - timedelta(hours=1), until=end, limit=100_000))
    ids = {r.run_id for r in runs}
    return runs, [w for w in windows if w.run_id in ids]


def _keyed(sums: Sequence[WindowSum]) -> dict[tuple[int, str, str, str | None], tuple[float, float, float]]:
    return {s[:4]: (s.measured_seconds, s.used_seconds, s.idle_seconds) for s in sums}


def test_sql_sums_equal_the_python_sums(fleet: Fleet) -> None:
    for team_id in (None, "ta", "tb"):
        for bucket in (None, 900, 3600 * 3):
            spans = report_over_time.buckets(START, END, bucket, NOW)
            runs, windows = _read(fleet, team_id, START, END)
            with fleet.uow() as uow:
                in_sql = _keyed(uow.reports.window_sums(spans, team_id, NOW, THRESHOLD))
            in_python = _keyed(window_sums(runs, windows, spans, NOW, THRESHOLD))
            assert in_sql.keys() == in_python.keys(), (team_id, bucket)
            assert len(in_sql) >= 3
            for key, figures in in_python.items():
                assert in_sql[key] == pytest.approx(figures, rel=1e-12, abs=1e-9), (team_id, bucket, key)
            if team_id is None:
                assert {k[1] for k in in_sql} == {"r1", "r2", "r3"}  # r4 ended before; no-run GPUs never count
                assert ("r1", "n9") in {k[1:3] for k in in_sql}
                assert {k[3] for k in in_sql if k[1] == "r2"} == {"1g.10gb", "3g.40gb", "9z.99gb"}


def test_spans_must_be_equal_steps(fleet: Fleet) -> None:
    with fleet.uow() as uow, pytest.raises(ValueError, match="consecutive buckets"):
        uow.reports.window_sums([(START, START + timedelta(hours=1)), (END, END + timedelta(hours=1))], None, NOW, 0.05)


# --- the figures, against the per-window computation the reports ran before -----------------------


def _share(window: TelemetryWindow, slice_: RunSlice | None) -> float:
    if window.mig_profile:
        try:
            return float(mig_gpu_eq(window.mig_profile))
        except InvalidSharingMode:
            pass
    return slice_.device_share if slice_ is not None else 1.0


def _previous(
    runs: Sequence[RunRecord], windows: Sequence[TelemetryWindow], start: datetime, end: datetime, by: str
) -> dict[str, dict[str, float]]:
    """The figures per group as the reports computed them window by window, before the sums."""
    stop = min(end, NOW)
    groups: dict[str, dict[str, float]] = {}

    def group(key: str) -> dict[str, float]:
        return groups.setdefault(key, dict.fromkeys(("allocated", "measured", "used", "idle", "reclaimed"), 0.0))

    def key_of(run: RunRecord, model: str) -> str:
        return {"team": run.team, "queue": run.queue, "cluster": run.cluster, "gpu_model": model}[by]

    for run in runs:
        if run.admitted_at >= end or (run.finished_at is not None and run.finished_at < start):
            continue
        for s in run.slices:
            g = group(key_of(run, s.gpu_model))
            g["allocated"] += s.gpu_eq * held_hours(run, start, stop)
            g["reclaimed"] += s.gpu_eq * reclaimed_hours(run, start, end, stop)
    by_run = {r.run_id: r for r in runs}
    for w in windows:
        run = by_run[w.run_id or ""]
        if not start - timedelta(hours=1) <= w.window_start < end:
            continue
        span = hours(max(w.window_start, start, run.admitted_at), min(w.window_end, run_end(run, stop)))
        if span <= 0 or w.activity_mean is None:
            continue
        slice_ = next((s for s in run.slices if s.node == w.node), None)
        measured = _share(w, slice_) * span
        g = group(key_of(run, slice_.gpu_model if slice_ else run.slices[0].gpu_model))
        g["measured"] += measured
        g["used"] += measured * w.activity_mean
        g["idle"] += measured if w.activity_mean < THRESHOLD else 0.0
    return groups


def _shown(row: Any) -> dict[str, float]:
    return {
        "allocated": row.allocated_gpu_hours,
        "measured": row.measured_gpu_hours,
        "used": row.used_gpu_hours,
        "idle": row.idle_gpu_hours,
        "reclaimed": row.reclaimed_gpu_hours,
    }


def _same(shown: dict[str, dict[str, float]], previous: dict[str, dict[str, float]]) -> None:
    """Equal to the report's rounding (a microsecond-GPU-hour), group by group."""
    assert shown.keys() == previous.keys()
    for group, figures in previous.items():
        assert shown[group] == pytest.approx(figures, abs=1.1e-6), group


@pytest.mark.parametrize("who", [ADMIN, TEAM_A])
def test_the_utilization_report_keeps_its_figures(fleet: Fleet, who: Principal) -> None:
    runs, windows = _read(fleet, who.team_id, START, END)
    for by in ("team", "queue", "cluster", "gpu_model"):
        report = reports.utilization(fleet.uow(), who, START, END, by, NOW)
        _same({g.group: _shown(g) for g in report.groups}, _previous(runs, windows, START, END, by))
        # And the report over windows in hand (what the tests and any caller holding windows use).
        assert aggregate(runs, windows, START, END, reports.GroupBy(by), NOW) == report
        if who is ADMIN and by == "team":
            assert {r.run_id for r in report.top_idle_runs} == {"r1", "r2"}


@pytest.mark.parametrize("who", [ADMIN, TEAM_A])
def test_the_timeline_keeps_its_figures(fleet: Fleet, who: Principal) -> None:
    runs, windows = _read(fleet, who.team_id, START, END)
    for bucket in (900, 1800):
        report = report_over_time.timeline(fleet.uow(), who, START, END, NOW, "team", bucket)
        spans = report_over_time.buckets(START, END, bucket, NOW)
        assert spans[-1][0] < NOW < spans[-1][1]
        shown: dict[datetime, dict[str, dict[str, float]]] = {}
        for row in report.rows:
            shown.setdefault(row.bucket_start, {})[row.group] = _shown(row)
        for lo, hi in spans:
            _same(shown.get(lo, {}), _previous(runs, windows, lo, hi, "team"))


def test_the_cost_report_keeps_its_figures(fleet: Fleet) -> None:
    report = report_cost.cost(fleet.uow(), ADMIN, START, END, NOW, "gpu_model")
    runs, windows = _read(fleet, None, START, END)
    in_python = report_cost.cost_figures(
        runs, window_sums(runs, windows, [(START, END)], NOW), START, END, reports.GroupBy.GPU_MODEL, NOW
    )
    assert report == in_python
    assert {g.group for g in report.groups} == {"A100-80GB", "H100-80GB", "L4"}
