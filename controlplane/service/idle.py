"""The idle pass: telemetry windows -> idle verdicts (pure core) -> findings, events and marks.

Runs beside the scheduler. It never evicts anything itself: a run whose finding reaches the
`reclaim` stage is marked in the snapshot (`LiveRun.idle_reclaimable`), and the scheduling core
evicts it only for a gang that is waiting and fits once it is gone. Every stage change is an event
on `<prefix>.events.idle.<cluster>` and is visible in the API through the finding.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from controlplane.core.idle import (
    GpuReading,
    IdlePolicy,
    IdleRules,
    IdleVerdict,
    RunActivity,
    Stage,
    Status,
    WorkingHours,
    evaluate,
)
from controlplane.service.events import envelope

# Also re-exported: these values were defined here before they moved to their leaf module.
from controlplane.service.idle_records import IdleCandidate, IdleFinding, IdleRepository  # noqa: F401
from controlplane.service.ports import UnitOfWork, UnitOfWorkFactory
from controlplane.service.serving import ServingReading
from controlplane.service.telemetry_window import TelemetryWindow, WindowQuery


def idle_subject(prefix: str, cluster: str) -> str:
    return f"{prefix}.events.idle.{cluster}"


# --- configuration -----------------------------------------------------------------------------


class IdlePolicySpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    threshold: float = Field(default=0.05, ge=0, le=1)
    window_seconds: int = Field(default=300, ge=1)
    grace_seconds: float = Field(default=1800, ge=0)
    notify_after: int = Field(default=2, ge=1)
    deprioritize_after: int = Field(default=4, ge=1)
    reclaim_after: int = Field(default=6, ge=1)
    action: str = Field(default="requeue", pattern="^(requeue|stop)$")
    min_gpu_coverage: float = Field(default=0.9, gt=0, le=1)
    min_samples_per_gpu: int = Field(default=3, ge=1)
    stale_seconds: float = Field(default=900, gt=0)

    def value(self) -> IdlePolicy:
        return IdlePolicy(**self.model_dump())


class WorkingHoursSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    start_hour: int = Field(default=8, ge=0, le=23)
    end_hour: int = Field(default=20, ge=1, le=24)
    weekdays: list[int] = Field(default_factory=lambda: [0, 1, 2, 3, 4])
    utc_offset_minutes: int = Field(default=0, ge=-14 * 60, le=14 * 60)


class IdleRulesSpec(BaseModel):
    """The `idle:` map of the config file."""

    model_config = ConfigDict(extra="forbid")

    default: IdlePolicySpec = Field(default_factory=IdlePolicySpec)
    queues: dict[str, IdlePolicySpec] = Field(default_factory=dict)
    priority_classes: dict[str, IdlePolicySpec] = Field(default_factory=dict)
    kinds: dict[str, IdlePolicySpec] = Field(default_factory=dict)
    exempt_workloads: list[str] = Field(default_factory=list)
    exempt_teams: list[str] = Field(default_factory=list)
    working_hours: WorkingHoursSpec | None = Field(default_factory=WorkingHoursSpec)

    def value(self) -> IdleRules:
        hours = self.working_hours
        return IdleRules(
            default=self.default.value(),
            by_queue={k: v.value() for k, v in self.queues.items()},
            by_priority_class={k: v.value() for k, v in self.priority_classes.items()},
            by_kind={k: v.value() for k, v in self.kinds.items()},
            exempt_workloads=frozenset(self.exempt_workloads),
            exempt_teams=frozenset(self.exempt_teams),
            working_hours=None
            if hours is None
            else WorkingHours(hours.start_hour, hours.end_hour, tuple(hours.weekdays), hours.utc_offset_minutes),
        )


def parse_idle_rules(raw: Mapping[str, Any] | None) -> IdleRules:
    return IdleRulesSpec.model_validate(dict(raw or {})).value()


# --- the pass ----------------------------------------------------------------------------------


@dataclass
class IdlePassStats:
    runs: int = 0
    windows: int = 0
    changed: int = 0
    events: int = 0
    by_stage: dict[str, int] | None = None


def _lookback(rules: IdleRules) -> timedelta:
    policies = [rules.default, *rules.by_queue.values(), *rules.by_priority_class.values(), *rules.by_kind.values()]
    longest = max((p.reclaim_after + 2) * p.window_seconds + p.stale_seconds for p in policies)
    return timedelta(seconds=longest)


def _activity(
    candidate: IdleCandidate, windows: Sequence[TelemetryWindow], traffic: ServingReading | None = None
) -> RunActivity:
    return RunActivity(
        run_id=candidate.run_id,
        workload_id=candidate.workload_id,
        workload_name=candidate.workload_name,
        team=candidate.team,
        queue=candidate.queue,
        priority_class=candidate.priority_class,
        kind=candidate.kind,
        cluster=candidate.cluster,
        started_at=candidate.started_at,
        gpu_devices=candidate.gpu_devices,
        readings=tuple(GpuReading(w.gpu_key, w.window_start, w.activity_mean, w.activity_samples) for w in windows),
        traffic_rps=None if traffic is None else traffic.requests_per_second,
        traffic_at=None if traffic is None else traffic.observed_at,
    )


def _evidence(verdict: IdleVerdict) -> tuple[Mapping[str, Any], ...]:
    return tuple(
        {
            "window_start": e.start.isoformat(),
            "status": str(e.status),
            "gpus_reporting": e.gpus_reporting,
            "max_activity": e.max_activity,
        }
        for e in verdict.evidence
    )


def idle_pass(
    uow_factory: UnitOfWorkFactory,
    rules: IdleRules,
    prefix: str,
    now: datetime,
) -> IdlePassStats:
    """Judge every running run; record what changed and announce stage changes."""
    stats = IdlePassStats(by_stage={})
    with uow_factory() as uow:
        repo = uow.idle
        candidates = repo.candidates()
        previous = repo.findings()
        windows = uow.telemetry.windows(WindowQuery(since=now - _lookback(rules), limit=5_000_000))
        # The declared traffic signal of inference runs (see serving.py): without it they stay exempt.
        traffic = uow.serving.latest([c.run_id for c in candidates if c.kind == "inference"])
    by_run: dict[str, list[TelemetryWindow]] = {}
    for window in windows:
        if window.run_id is not None:
            by_run.setdefault(window.run_id, []).append(window)
    stats.runs, stats.windows = len(candidates), len(windows)
    verdicts = [
        (c, evaluate(_activity(c, by_run.get(c.run_id, ()), traffic.get(c.run_id)), rules, now)) for c in candidates
    ]

    with uow_factory() as uow:
        repo = uow.idle
        live = {c.run_id for c in candidates}
        gone = [run_id for run_id in previous if run_id not in live]
        if gone:
            repo.drop_findings(gone)
        for candidate, verdict in verdicts:
            assert stats.by_stage is not None
            stats.by_stage[str(verdict.stage)] = stats.by_stage.get(str(verdict.stage), 0) + 1
            before = previous.get(candidate.run_id)
            stage_changed = before is None or before.stage != str(verdict.stage)
            finding = IdleFinding(
                run_id=candidate.run_id,
                workload_id=candidate.workload_id,
                cluster=candidate.cluster,
                status=str(verdict.status),
                stage=str(verdict.stage),
                idle_windows=verdict.idle_windows,
                reason=verdict.reason,
                evidence=_evidence(verdict),
                action=verdict.action,
                stage_since=now if stage_changed or before is None else before.stage_since,
                updated_at=now,
            )
            if before is not None and replace(before, updated_at=now) == finding:
                continue
            repo.put_finding(finding)
            stats.changed += 1
            announce = stage_changed and (
                verdict.stage is not Stage.NONE or (before is not None and before.stage != "none")
            )
            if announce:
                _announce(uow, prefix, candidate, finding, now)
                stats.events += 1
        uow.commit()
    return stats


def _announce(uow: UnitOfWork, prefix: str, candidate: IdleCandidate, finding: IdleFinding, now: datetime) -> None:
    event = finding.stage if finding.stage != "none" else "cleared"
    data = {
        "run_id": candidate.run_id,
        "workload_id": candidate.workload_id,
        "workload": candidate.workload_name,
        "team": candidate.team,
        "queue": candidate.queue,
        "cluster": candidate.cluster,
        "stage": finding.stage,
        "status": finding.status,
        "idle_windows": finding.idle_windows,
        "gpu_eq": candidate.gpu_eq,
        "action": finding.action,
        "reason": finding.reason,
        "evidence": list(finding.evidence),
    }
    event_id, payload = envelope(f"idle.{event}", data, now)
    uow.outbox.add(idle_subject(prefix, candidate.cluster), event_id, payload, now)


def marks(findings: Mapping[str, IdleFinding]) -> dict[str, tuple[bool, bool]]:
    """Per run id, (idle, idle_reclaimable) for the scheduling snapshot."""
    return {
        run_id: (f.stage in (Stage.DEPRIORITIZE, Stage.RECLAIM), f.stage == Stage.RECLAIM and f.status == Status.IDLE)
        for run_id, f in findings.items()
    }
