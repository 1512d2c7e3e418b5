"""What the web dashboard shows over time: recent events, idle findings, utilization per bucket.

Each read is bounded: at most `MAX_EVENTS` outbox rows, the findings of live runs, and
`MAX_BUCKETS` buckets of the timeline report (one read). A team token sees only events, findings and
utilization about its own team's workloads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from controlplane.service import report_over_time
from controlplane.service.errors import Invalid
from controlplane.service.ports import UnitOfWork, UnitOfWorkFactory
from controlplane.service.views import Principal

MAX_EVENTS = 200
MAX_BUCKETS = 48
# Event families the feed shows: about workloads (subject carries the team) and idle findings
# (the team is in the event's data); cluster and report events are fleet-wide, for admins only.
_ADMIN_FAMILIES = ("workload", "idle", "cluster", "report")


@dataclass(frozen=True)
class FeedEvent:
    seq: int
    at: datetime
    type: str
    team: str
    workload: str
    workload_id: str
    summary: str  # the event's own sentence (reason, state), as the service worded it


def _summary(data: Mapping[str, Any]) -> str:
    """The event's sentence: its state or stage, then its reason and message, each said once (a
    run's reason and message are often the same words: "all pods succeeded")."""
    parts: list[str] = []
    for key in ("state", "stage", "reason", "message"):
        value = data.get(key)
        if isinstance(value, str) and value:
            part = value if key in ("reason", "message") else f"{key} {value}"
            if part not in parts:
                parts.append(part)
    return "; ".join(parts)[:500]


@dataclass(frozen=True)
class FoldedEvent:
    """Events in a row that say the same thing about the same workload, shown as one line."""

    event: FeedEvent  # the newest of them
    count: int
    first_at: datetime  # when the oldest of them happened


def fold_repeats(feed: Sequence[FeedEvent]) -> list[FoldedEvent]:
    """Fold runs of consecutive events (newest first) with the same type, workload and summary."""
    folded: list[FoldedEvent] = []
    for event in feed:
        last = folded[-1] if folded else None
        if last is not None and (last.event.type, last.event.workload_id, last.event.summary) == (
            event.type,
            event.workload_id,
            event.summary,
        ):
            folded[-1] = FoldedEvent(last.event, last.count + 1, event.at)
        else:
            folded.append(FoldedEvent(event, 1, event.at))
    return folded


def default_range(uow: UnitOfWork, who: Principal, now: datetime, spans: Mapping[str, timedelta]) -> str:
    """The utilization page's range when none is chosen: the shortest of `spans` that holds every
    allocation of the longest span (a young fleet is not a flat line at the right edge of a day).
    One aggregate over the runs, none read."""
    ordered = sorted(spans.items(), key=lambda item: item[1])
    longest = ordered[-1]
    with uow:
        first = uow.reports.first_allocation(now - longest[1], now, None if who.is_admin else who.team_id)
    if first is None:
        return longest[0]
    return next(name for name, span in ordered if first >= now - span or span == longest[1])


def events(
    uow: UnitOfWork,
    prefix: str,
    team: str | None,
    after_seq: int,
    limit: int,
    idle_only: bool = False,
    family: str | None = None,
    workload: str | None = None,
) -> list[FeedEvent]:
    """The newest events (newest first) after `after_seq`; `team`: only those about that team;
    `idle_only`: only the idle policy's decisions (read on their own, so a busy fleet's workload
    events do not crowd them out); `family`: only that family's events (`workload`, `idle`,
    `cluster`, `report`; read on its own, by subject); `workload`: only events naming a workload
    whose name contains it (among the newest `limit` read)."""
    if not 1 <= limit <= MAX_EVENTS:
        raise Invalid(f"limit must be between 1 and {MAX_EVENTS}")
    if after_seq < 0:
        raise Invalid("after must not be negative")
    if family is not None and family not in _ADMIN_FAMILIES:
        raise Invalid(f"family must be one of {', '.join(_ADMIN_FAMILIES)}")
    if idle_only:
        family = "idle"
    if team is None:
        prefixes = [f"{prefix}.events.{f}." for f in _ADMIN_FAMILIES if family in (None, f)]
    else:
        # The workload subject names the team; idle subjects name the cluster, so those are
        # read and then kept only when their data names the team. Cluster and report events are
        # fleet-wide: a team sees none.
        prefixes = [
            p
            for f, p in (("workload", f"{prefix}.events.workload.{team}."), ("idle", f"{prefix}.events.idle."))
            if family in (None, f)
        ]
    if not prefixes:
        return []
    with uow:
        rows = uow.outbox.recent(prefixes, after_seq, limit)
    found = []
    for row in rows:
        try:
            body = json.loads(row.payload)
        except ValueError:
            continue
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, dict):
            continue
        owner = str(data.get("team", ""))
        if team is not None and owner != team:
            continue
        name = str(data.get("workload") or data.get("name") or "")
        if workload is not None and workload not in name:
            continue
        found.append(
            FeedEvent(
                seq=row.seq,
                at=row.created_at,
                type=str(body.get("type", "")),
                team=owner,
                workload=name,
                workload_id=str(data.get("workload_id") or data.get("id") or ""),
                summary=_summary(data),
            )
        )
    return found


@dataclass(frozen=True)
class IdleLine:
    run_id: str
    workload_id: str
    workload: str
    team: str
    queue: str
    cluster: str
    gpu_eq: float
    status: str
    stage: str
    idle_windows: int
    reason: str
    action: str
    stage_since: datetime
    evidence: tuple[Mapping[str, Any], ...]


def idle_findings(uow: UnitOfWork, team: str | None) -> list[IdleLine]:
    """What the idle policy concluded about each live run it judged, flagged ones first."""
    with uow:
        findings = uow.idle.findings()
        # Only the runs judged: the page shows findings, not every running run.
        candidates = {c.run_id: c for c in uow.idle.candidates(run_ids=list(findings))}
    lines = []
    for run_id, finding in findings.items():
        candidate = candidates.get(run_id)
        if candidate is None or (team is not None and candidate.team != team):
            continue
        lines.append(
            IdleLine(
                run_id,
                finding.workload_id,
                candidate.workload_name,
                candidate.team,
                candidate.queue,
                finding.cluster,
                candidate.gpu_eq,
                finding.status,
                finding.stage,
                finding.idle_windows,
                finding.reason,
                finding.action,
                finding.stage_since,
                finding.evidence,
            )
        )
    stages = {"reclaim": 0, "deprioritize": 1, "notify": 2}
    return sorted(lines, key=lambda line: (stages.get(line.stage, 3), line.team, line.workload))


@dataclass
class TeamSeries:
    team: str
    allocated: list[float] = field(default_factory=list)  # GPU-hours per bucket
    used: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class UtilizationSeries:
    starts: tuple[datetime, ...]  # the start of each bucket
    bucket: timedelta
    teams: tuple[TeamSeries, ...]


def utilization_series(
    uow_factory: UnitOfWorkFactory, who: Principal, end: datetime, buckets: int, bucket: timedelta, now: datetime
) -> UtilizationSeries:
    """Allocated and used GPU-hours per team in each of `buckets` buckets ending at `end`: the
    timeline report (one read, the utilization report's accounting), shaped for the plots."""
    if not 1 <= buckets <= MAX_BUCKETS:
        raise Invalid(f"buckets must be between 1 and {MAX_BUCKETS}")
    if bucket < timedelta(seconds=report_over_time.MIN_BUCKET):
        raise Invalid(f"a bucket is at least {report_over_time.MIN_BUCKET} seconds")
    starts = tuple(end - bucket * (buckets - i) for i in range(buckets))
    report = report_over_time.timeline(uow_factory(), who, starts[0], end, now, "team", int(bucket.total_seconds()))
    index = {start: i for i, start in enumerate(starts)}
    series: dict[str, TeamSeries] = {}
    for row in report.rows:
        i = index.get(row.bucket_start)
        if i is None:
            continue
        line = series.setdefault(row.group, TeamSeries(row.group, [0.0] * buckets, [0.0] * buckets))
        line.allocated[i] = row.allocated_gpu_hours
        line.used[i] = row.used_gpu_hours
    return UtilizationSeries(starts, bucket, tuple(series[name] for name in sorted(series)))
