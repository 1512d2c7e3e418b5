"""The one home of the reports' accounting rules, shared by every fleet report.

- a run holds its gpu-eq from admission to its end (a live run: until `now`), clipped to the range;
- a telemetry window measures the run's gpu-eq share of that GPU x its overlap with the range and
  with the run's allocation; used = measured x the activity mean; idle = measured when the mean is
  below the idle threshold;
- a run reclaimed for idleness inside the range hands back its gpu-eq from the reclaim to the end
  of the range (or `now`);
- ranges are `[from, to)`, naive times are UTC, at most `MAX_RANGE` long.

The utilization, cost and over-time reports all sum these terms, so their figures agree. The
windows' part is summed in the database (`ReportRepository.window_sums`: per bucket, run, node and
MIG profile, so a report reads thousands of sums, not every window), and `window_terms` turns those
sums into GPU-hours (tests/integration/test_window_sums.py holds the SQL to the same rule computed
window by window).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from controlplane.domain.sharing import InvalidSharingMode, mig_gpu_eq
from controlplane.service.errors import Invalid
from controlplane.service.report_records import RunRecord, RunSlice, WindowSum
from controlplane.service.views import Principal

MAX_RANGE = timedelta(days=92)
DEFAULT_IDLE_THRESHOLD = 0.05


def utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def check_span(start: datetime, end: datetime) -> tuple[datetime, datetime]:
    """A validated report range in UTC; `Invalid` with a sentence otherwise."""
    start, end = utc(start), utc(end)
    if end <= start:
        raise Invalid("`to` must be after `from`")
    if end - start > MAX_RANGE:
        raise Invalid(f"the range may span at most {MAX_RANGE.days} days")
    return start, end


def team_scope(who: Principal) -> str | None:
    """None for an admin (every team), else the caller's team id."""
    if who.is_admin:
        return None
    if who.team_id is None:
        raise Invalid("this token belongs to no team")
    return who.team_id


def hours(start: datetime, end: datetime) -> float:
    return max(0.0, (end - start).total_seconds() / 3600.0)


def run_end(run: RunRecord, end: datetime) -> datetime:
    return end if run.finished_at is None else min(run.finished_at, end)


def held_hours(run: RunRecord, start: datetime, stop: datetime) -> float:
    """Hours the run held its capacity inside `[start, stop)` (multiply by gpu-eq for GPU-hours)."""
    return hours(max(run.admitted_at, start), run_end(run, stop))


def mean_price_by_team(runs: Sequence[RunRecord], start: datetime, end: datetime, now: datetime) -> dict[str, float]:
    """Per team, the price per GPU-hour of its allocation in `[start, end)`: each pod's pool price
    weighted by the pod's allocated GPU-hours (0 for a team that held nothing)."""
    stop = min(end, now)
    hours: dict[str, float] = {}
    cost: dict[str, float] = {}
    for run in runs:
        held = held_hours(run, start, stop)
        for s in run.slices:
            hours[run.team] = hours.get(run.team, 0.0) + s.gpu_eq * held
            cost[run.team] = cost.get(run.team, 0.0) + s.gpu_eq * held * s.price_per_gpu_hour
    return {team: (cost[team] / h if h > 0 else 0.0) for team, h in hours.items()}


def reclaimed_hours(run: RunRecord, start: datetime, end: datetime, stop: datetime) -> float:
    """Hours a run reclaimed for idleness inside `[start, end)` handed back, up to `stop`."""
    if run.reclaimed_idle and run.finished_at is not None and start <= run.finished_at < end:
        return hours(run.finished_at, stop)
    return 0.0


def _window_share(mig_profile: str | None, slice_: RunSlice | None) -> float:
    """The run's gpu-eq share of the GPU a window covers: its MIG slice's, else the pod's share
    of a whole or shared GPU, else 1."""
    if mig_profile:
        try:
            return float(mig_gpu_eq(mig_profile))
        except InvalidSharingMode:
            pass
    return slice_.device_share if slice_ is not None else 1.0


@dataclass(frozen=True)
class WindowTerm:
    """What the windows of one run on one node (and MIG profile) in one bucket contribute to the
    run, in GPU-hours of gpu-eq."""

    bucket: int
    run: RunRecord
    slice: RunSlice | None  # the run's pod on the windows' node, when known
    measured: float
    used: float
    idle: float

    @property
    def gpu_model(self) -> str:
        if self.slice is not None:
            return self.slice.gpu_model
        return self.run.slices[0].gpu_model if self.run.slices else "unknown"

    @property
    def price_per_gpu_hour(self) -> float:
        if self.slice is not None:
            return self.slice.price_per_gpu_hour
        return self.run.slices[0].price_per_gpu_hour if self.run.slices else 0.0


def window_terms(runs: Sequence[RunRecord], sums: Iterable[WindowSum]) -> Iterator[WindowTerm]:
    """The sums of `runs`' windows as GPU-hours: each sum times the run's share of that GPU.
    Sums of other runs (a run that appeared after `runs` were read) are skipped."""
    by_run = {r.run_id: r for r in runs}
    slices_by_node: dict[tuple[str, str], RunSlice] = {}
    for run in runs:
        for s in run.slices:
            slices_by_node.setdefault((run.run_id, s.node), s)
    for found in sums:
        owner = by_run.get(found.run_id)
        if owner is None:
            continue
        slice_ = slices_by_node.get((owner.run_id, found.node))
        per_hour = _window_share(found.mig_profile, slice_) / 3600.0
        yield WindowTerm(
            found.bucket,
            owner,
            slice_,
            found.measured_seconds * per_hour,
            found.used_seconds * per_hour,
            found.idle_seconds * per_hour,
        )
