"""Anti-hoarding: deciding from measured GPU activity whether a run is idle, and how far to go.

Pure: the caller hands in the run, its telemetry windows (roll-ups of DCGM samples) and the time.
The rules are careful on purpose, because a wrong "idle" takes GPUs from someone working:

- no data is *unknown*, never idle: a window counts only when enough of the run's GPUs reported
  enough samples in it, and the newest window must be recent;
- one busy GPU makes the window busy (a gang whose rank 0 computes is not hoarding);
- only *consecutive*, contiguous idle windows count; a gap or an unknown window resets the count;
- a grace period after start (images pull, data loads), and exemptions (allow-list, interactive
  sessions in working hours, inference that serves traffic or whose traffic is unknown or stale:
  only a fresh reading of zero requests/s lets an inference run be judged by its GPUs);
- stages escalate with the count: notify -> deprioritize -> reclaim. Reclaim only marks the run;
  the scheduling core evicts it only for a gang that is waiting and fits once it is gone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum


class Stage(StrEnum):
    NONE = "none"
    NOTIFY = "notify"
    DEPRIORITIZE = "deprioritize"
    RECLAIM = "reclaim"


class Status(StrEnum):
    BUSY = "busy"
    IDLE = "idle"
    UNKNOWN = "unknown"
    GRACE = "grace"
    EXEMPT = "exempt"


STAGE_ORDER = (Stage.NONE, Stage.NOTIFY, Stage.DEPRIORITIZE, Stage.RECLAIM)


@dataclass(frozen=True)
class IdlePolicy:
    """Thresholds of one idle policy; resolved per workload by `IdleRules`."""

    enabled: bool = True
    threshold: float = 0.05  # mean SM (or graphics-engine) activity below this is idle, 0..1
    window_seconds: int = 300  # must match the telemetry roll-up windows
    grace_seconds: float = 1800.0  # after the run starts, nothing counts
    notify_after: int = 2  # consecutive idle windows before each stage
    deprioritize_after: int = 4
    reclaim_after: int = 6
    action: str = "requeue"  # requeue | stop: what reclaim does to the workload
    min_gpu_coverage: float = 0.9  # share of the run's GPUs that must report in a window
    min_samples_per_gpu: int = 3  # a GPU with fewer samples in a window did not report
    stale_seconds: float = 900.0  # the newest window must end at most this long ago

    def stage_for(self, idle_windows: int) -> Stage:
        if idle_windows >= self.reclaim_after:
            return Stage.RECLAIM
        if idle_windows >= self.deprioritize_after:
            return Stage.DEPRIORITIZE
        if idle_windows >= self.notify_after:
            return Stage.NOTIFY
        return Stage.NONE


@dataclass(frozen=True)
class WorkingHours:
    """When interactive sessions are exempt: [start_hour, end_hour) on the given weekdays (0 =
    Monday), in a fixed UTC offset."""

    start_hour: int = 8
    end_hour: int = 20
    weekdays: tuple[int, ...] = (0, 1, 2, 3, 4)
    utc_offset_minutes: int = 0

    def contains(self, when: datetime) -> bool:
        local = when + timedelta(minutes=self.utc_offset_minutes)
        return local.weekday() in self.weekdays and self.start_hour <= local.hour < self.end_hour


@dataclass(frozen=True)
class IdleRules:
    """The default policy and its overrides. The most specific wins: workload, then queue, then
    priority class, then workload kind."""

    default: IdlePolicy = field(default_factory=IdlePolicy)
    by_queue: Mapping[str, IdlePolicy] = field(default_factory=dict)
    by_priority_class: Mapping[str, IdlePolicy] = field(default_factory=dict)
    by_kind: Mapping[str, IdlePolicy] = field(default_factory=dict)
    exempt_workloads: frozenset[str] = frozenset()  # workload ids or names
    exempt_teams: frozenset[str] = frozenset()
    working_hours: WorkingHours | None = field(default_factory=WorkingHours)

    def policy_for(self, run: RunActivity) -> IdlePolicy:
        for table, key in (
            (self.by_queue, run.queue),
            (self.by_priority_class, run.priority_class),
            (self.by_kind, run.kind),
        ):
            if key in table:
                return table[key]
        return self.default


@dataclass(frozen=True)
class GpuReading:
    """One GPU (or MIG instance) of a run over one telemetry window."""

    gpu_key: str
    window_start: datetime
    activity_mean: float | None  # 0..1; None when the window has no activity reading
    samples: int


@dataclass(frozen=True)
class RunActivity:
    run_id: str
    workload_id: str
    workload_name: str
    team: str
    queue: str
    priority_class: str
    kind: str  # training | inference | interactive | batch
    cluster: str
    started_at: datetime | None
    gpu_devices: int  # GPUs and MIG instances the run holds: what should report
    readings: Sequence[GpuReading]
    traffic_rps: float | None = None  # inference request rate, when something reports it
    traffic_at: datetime | None = None  # when that rate was measured; a stale one counts as none


@dataclass(frozen=True)
class WindowEvidence:
    start: datetime
    status: Status
    gpus_reporting: int
    max_activity: float | None


@dataclass(frozen=True)
class IdleVerdict:
    run_id: str
    status: Status
    stage: Stage
    idle_windows: int
    reason: str
    evidence: tuple[WindowEvidence, ...] = ()  # newest first, the windows the count rests on
    action: str = "requeue"


def _window_status(readings: Sequence[GpuReading], policy: IdlePolicy, gpu_devices: int) -> WindowEvidence:
    reporting = [r for r in readings if r.activity_mean is not None and r.samples >= policy.min_samples_per_gpu]
    start = readings[0].window_start
    peak = max((r.activity_mean for r in reporting if r.activity_mean is not None), default=None)
    if peak is not None and peak >= policy.threshold:
        return WindowEvidence(start, Status.BUSY, len(reporting), peak)
    keys = {r.gpu_key for r in reporting}
    if gpu_devices <= 0 or len(keys) < policy.min_gpu_coverage * gpu_devices:
        return WindowEvidence(start, Status.UNKNOWN, len(keys), peak)
    return WindowEvidence(start, Status.IDLE, len(keys), peak)


def evaluate(run: RunActivity, rules: IdleRules, now: datetime) -> IdleVerdict:
    """Whether the run is idle, on what evidence, and which stage that justifies."""
    policy = rules.policy_for(run)

    def verdict(status: Status, reason: str, idle: int = 0, evidence: tuple[WindowEvidence, ...] = ()) -> IdleVerdict:
        stage = policy.stage_for(idle) if status is Status.IDLE else Stage.NONE
        return IdleVerdict(run.run_id, status, stage, idle, reason, evidence, policy.action)

    if not policy.enabled:
        return verdict(Status.EXEMPT, "idle policy disabled for this workload")
    if run.workload_id in rules.exempt_workloads or run.workload_name in rules.exempt_workloads:
        return verdict(Status.EXEMPT, "workload on the idle allow-list")
    if run.team in rules.exempt_teams:
        return verdict(Status.EXEMPT, f"team {run.team} on the idle allow-list")
    if run.kind == "interactive" and rules.working_hours is not None and rules.working_hours.contains(now):
        return verdict(Status.EXEMPT, "interactive session inside working hours")
    if run.kind == "inference":
        if run.traffic_rps is None:
            return verdict(Status.EXEMPT, "inference: no traffic data, so never judged idle")
        if run.traffic_at is not None and (now - run.traffic_at).total_seconds() > policy.stale_seconds:
            # Like stale GPU telemetry: a silent agent is unknown traffic, never zero traffic.
            return verdict(Status.EXEMPT, f"inference: traffic data stale since {run.traffic_at.isoformat()}")
        if run.traffic_rps > 0:
            return verdict(Status.EXEMPT, f"inference serving {run.traffic_rps:g} requests/s")
    if run.started_at is None:
        return verdict(Status.UNKNOWN, "not running yet")
    grace_ends = run.started_at + timedelta(seconds=policy.grace_seconds)
    if now < grace_ends:
        return verdict(Status.GRACE, f"grace period after start until {grace_ends.isoformat()}")

    step = timedelta(seconds=policy.window_seconds)
    by_start: dict[datetime, list[GpuReading]] = {}
    for reading in run.readings:
        # Only complete windows that began after the grace period count.
        if reading.window_start + step <= now and reading.window_start >= grace_ends:
            by_start.setdefault(reading.window_start, []).append(reading)
    if not by_start:
        return verdict(Status.UNKNOWN, "no complete telemetry window yet")
    newest = max(by_start)
    if (now - (newest + step)).total_seconds() > policy.stale_seconds:
        return verdict(Status.UNKNOWN, f"telemetry stale: newest window ended {(newest + step).isoformat()}")

    evidence: list[WindowEvidence] = []
    expected = newest
    for start in sorted(by_start, reverse=True):
        if start != expected:
            break  # a gap: missing data is unknown, not idle
        window = _window_status(by_start[start], policy, run.gpu_devices)
        if window.status is not Status.IDLE:
            if not evidence:
                what = "busy" if window.status is Status.BUSY else "unknown (too few GPUs reporting)"
                return verdict(window.status, f"newest window {what}", 0, (window,))
            break
        evidence.append(window)
        expected = start - step
    count = len(evidence)
    peak = max((e.max_activity or 0.0 for e in evidence), default=0.0)
    reason = (
        f"idle for {count} consecutive window(s) of {policy.window_seconds}s: activity at most {peak:.1%} "
        f"(threshold {policy.threshold:.0%}) on {min(e.gpus_reporting for e in evidence)}/{run.gpu_devices} GPUs"
    )
    return verdict(Status.IDLE, reason, count, tuple(evidence))
