"""`gpufleet audit`: the fleet against the field's checklist, as findings people and CI can read.

Facts are loaded in one read transaction (the queue tree, priority classes, clusters and pools
through the admin repository; runs, telemetry recency and non-GPU pods through the audit
repository; idle findings; the utilization report's accounting over the lookback), the pure rules
(`controlplane.core.audit`) judge them, and `audit_wording` renders them.

Who sees what: an admin sees every finding. A team token sees the findings about its own team's
objects (its teams, queues, runs, its share of a shared pool) and the fleet findings that name only
pools, clusters and priority classes (an untainted pool, a time-sliced pool open to all, no
guarantee anywhere): those concern every tenant and name nobody's work. Findings that name other
tenants' pods (non-GPU pods on GPU nodes) are for admins only.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel, Field

from controlplane.core.audit import (
    AuditFacts,
    AuditThresholds,
    ClassFact,
    ClusterFact,
    Finding,
    PoolFact,
    Rule,
    RunFact,
    ServingFact,
    Severity,
    TeamUseFact,
    TreeFact,
    evaluate,
)
from controlplane.core.decision import EndCause
from controlplane.core.idle import IdleRules, RunActivity
from controlplane.domain.model import Taint
from controlplane.domain.sharing import InvalidSharingMode, SharingMode
from controlplane.service import report_accounting, reports
from controlplane.service.audit_records import AuditRun
from controlplane.service.audit_wording import TITLES, evidence_fields, evidence_text, fix_text
from controlplane.service.constraints import Strict
from controlplane.service.errors import Invalid
from controlplane.service.events import envelope
from controlplane.service.ports import UnitOfWork, UnitOfWorkFactory
from controlplane.service.views import Principal

AUDIT_EVENT = "audit.report"
AUDIT_ACTION = "report.audit"
MAX_RULE_FILTERS = len(Rule)
# The daily event carries at most this many findings (the most severe), so it stays one NATS message
# on any fleet; `findings_total` says how many there were.
MAX_EVENT_FINDINGS = 500
MAX_SERVING_RUNS = 10_000  # live inference runs whose serving signal the audit reads
LIVE = ("admitted", "dispatching", "running")


class AuditSettings(Strict):
    """`audit:` of gpufleet.yaml (every field optional; defaults in docs/concepts/audit.md)."""

    # The defaults live with the thresholds themselves (`AuditThresholds`).
    lookback_hours: float = Field(default=AuditThresholds.lookback_hours, gt=0, le=24 * 92)
    min_utilization: float = Field(default=AuditThresholds.min_utilization, ge=0, le=1)
    min_measured_gpu_hours: float = Field(default=AuditThresholds.min_measured_gpu_hours, ge=0, le=1e9)
    high_utilization: float = Field(default=AuditThresholds.high_utilization, ge=0, le=1)

    def thresholds(self) -> AuditThresholds:
        return AuditThresholds(
            lookback_hours=self.lookback_hours,
            min_utilization=self.min_utilization,
            min_measured_gpu_hours=self.min_measured_gpu_hours,
            high_utilization=self.high_utilization,
        )


def parse_audit_settings(raw: Mapping[str, Any]) -> AuditThresholds:
    return AuditSettings.model_validate(dict(raw), strict=False).thresholds()


# --- the API's answer ----------------------------------------------------------------------------


class FindingObject(BaseModel):
    kind: str = Field(description="pool | node | cluster | team | queue | priority-class | run")
    name: str


class FindingView(BaseModel):
    rule: str = Field(description="stable rule id, e.g. gpu-pool-untainted")
    severity: Severity
    title: str
    objects: list[FindingObject]
    evidence: dict[str, Any] = Field(description="the figures behind the finding (one shape per rule)")
    evidence_text: str
    fix: str = Field(description="the fix's id")
    fix_text: str


class AuditReport(BaseModel):
    generated_at: datetime
    findings: list[FindingView] = Field(description="most severe first, then by rule id and objects")
    counts: dict[str, int] = Field(description="findings per severity (every severity, 0 included)")


def finding_view(finding: Finding) -> FindingView:
    return FindingView(
        rule=finding.rule.value,
        severity=finding.severity,
        title=TITLES[finding.rule],
        objects=[FindingObject(kind=o.kind, name=o.name) for o in finding.objects],
        evidence=evidence_fields(finding.evidence),
        evidence_text=evidence_text(finding),
        fix=finding.fix.value,
        fix_text=fix_text(finding),
    )


def report_of(findings: Sequence[Finding], now: datetime) -> AuditReport:
    counts = {s.value: 0 for s in Severity}
    for f in findings:
        counts[f.severity.value] += 1
    return AuditReport(generated_at=now, findings=[finding_view(f) for f in findings], counts=counts)


# --- facts ---------------------------------------------------------------------------------------


def _sharing(text: str) -> SharingMode:
    try:
        return SharingMode.parse(text)
    except InvalidSharingMode:
        return SharingMode.parse("exclusive")  # stored pools were validated; an unknown mode judges as whole GPUs


def _stale_seconds(rules: IdleRules, run: AuditRun) -> float:
    activity = RunActivity(
        run_id=run.run_id,
        workload_id="",
        workload_name=run.workload,
        team=run.team,
        queue=run.queue,
        priority_class=run.priority_class,
        kind=run.kind,
        cluster=run.cluster,
        started_at=run.started_at,
        gpu_devices=0,
        readings=(),
    )
    return rules.policy_for(activity).stale_seconds


def load_facts(uow: UnitOfWork, rules: IdleRules, thresholds: AuditThresholds, now: datetime) -> AuditFacts:
    """Everything the rules read, in the caller's transaction."""
    since = now - timedelta(hours=thresholds.lookback_hours)
    clusters = uow.admin.list_clusters()
    pools = tuple(
        PoolFact(
            cluster=c.name,
            name=p.name,
            gpu_model=p.gpu_model,
            sharing=_sharing(p.sharing),
            gpus_per_node=p.gpus_per_node,
            node_count=p.node_count,
            taints=tuple(Taint(t.get("key", ""), t.get("value", ""), t.get("effect", "NoSchedule")) for t in p.taints),
        )
        for c in clusters
        for p in c.pools
    )
    tree = tuple(
        TreeFact(level, n.name, n.parent, dict(n.guaranteed), dict(n.limit))
        for level in ("cohort", "team", "queue")
        for n in uow.admin.list_tree_nodes(level)
    )
    classes = tuple(
        ClassFact(c.name, c.value, c.preemptible, c.min_runtime_seconds) for c in uow.admin.list_priority_classes()
    )
    # Allocation against use: the utilization report's accounting over the lookback. Its read of
    # the runs (every run overlapping the lookback: a superset of the audit's) is also where the
    # audit takes what each run's pods hold, so the pods are read once.
    report_runs, sums = reports.runs_and_sums(uow, None, [(since, now)], now)
    held = {r.run_id: r.slices for r in report_runs}
    idle = uow.idle.findings()
    runs = []
    for r in uow.audit_facts.runs(since):
        if r.created_at >= now:
            continue  # admitted after this audit's instant (outside the accounting's read): the next one sees it
        marked = idle.get(r.run_id)
        stage = marked.stage if marked is not None and marked.status == "idle" else ""
        slices = held.get(r.run_id, ())
        runs.append(
            RunFact(
                run_id=r.run_id,
                workload=r.workload,
                team=r.team,
                queue=r.queue,
                cluster=r.cluster,
                pools=tuple(sorted({f"{r.cluster}/{pod.pool}" for pod in slices})),
                kind=r.kind,
                preemptible=r.preemptible,
                pods=len(slices),
                live=r.state in LIVE,
                running=r.state == "running",
                created_at=r.created_at,
                started_at=r.started_at,
                gpu_eq=round(sum(pod.gpu_eq for pod in slices), 6),
                last_window_end=r.last_window_end,
                stale_seconds=_stale_seconds(rules, r),
                idle_stage=stage,
                idle_windows=marked.idle_windows if marked is not None else 0,
                reclaimed_idle_at=r.finished_at if r.end_cause == EndCause.RECLAIMED_IDLE else None,
            )
        )
    usage = reports.aggregate_sums(report_runs, sums, since, now, reports.GroupBy.TEAM, now, top=0)
    prices = report_accounting.mean_price_by_team(report_runs, since, now, now)
    team_use = tuple(
        TeamUseFact(
            team=g.group,
            allocated_gpu_hours=g.allocated_gpu_hours,
            measured_gpu_hours=g.measured_gpu_hours,
            used_gpu_hours=g.used_gpu_hours,
            price_per_gpu_hour=prices.get(g.group, 0.0),
        )
        for g in usage.groups
    )
    gangs = tuple(ClusterFact(c.name, c.provider, str(c.kubernetes.get("gang", "none"))) for c in clusters)
    running_since = {r.run_id: r.started_at for r in runs if r.running}
    serving = tuple(
        ServingFact(
            run_id=s.run_id,
            workload=s.workload,
            team=s.team,
            running_since=running_since.get(s.run_id),
            traffic_declared=s.traffic_declared,
            latency_objective_ms=s.latency_objective_ms,
            requests_per_second=s.requests_per_second,
            latency_ms=s.latency_ms,
            observed_at=s.observed_at,
        )
        for s in uow.serving.signals(MAX_SERVING_RUNS)
    )
    return AuditFacts(
        pools=pools,
        node_pods=tuple(uow.audit_facts.node_pods()),
        clusters=gangs,
        tree=tree,
        classes=classes,
        runs=tuple(runs),
        team_use=team_use,
        serving=serving,
        stale_seconds=rules.default.stale_seconds,
    )


# --- use cases -----------------------------------------------------------------------------------


def check_filters(min_severity: str | None, rules: Sequence[str]) -> tuple[Severity, frozenset[Rule]]:
    """Validated filters; `Invalid` (422) with a sentence otherwise."""
    if min_severity is not None and min_severity not in set(Severity):
        raise Invalid(f"unknown min_severity {min_severity!r}; use one of {', '.join(s.value for s in Severity)}")
    if len(rules) > MAX_RULE_FILTERS:
        raise Invalid(f"at most {MAX_RULE_FILTERS} rule filters")
    unknown = sorted({r for r in rules if r not in set(Rule)})
    if unknown:
        shown = ", ".join(repr(r[:80]) for r in unknown[:5])
        raise Invalid(f"unknown rule(s) {shown}; known: {', '.join(r.value for r in Rule)}")
    return Severity(min_severity or Severity.INFO), frozenset(Rule(r) for r in rules)


def findings(
    uow_factory: UnitOfWorkFactory, rules: IdleRules, thresholds: AuditThresholds, now: datetime
) -> tuple[Finding, ...]:
    with uow_factory() as uow:
        return evaluate(load_facts(uow, rules, thresholds, now), thresholds, now)


def audit(
    uow_factory: UnitOfWorkFactory,
    who: Principal,
    rules: IdleRules,
    thresholds: AuditThresholds,
    now: datetime,
    min_severity: str | None = None,
    rule_filter: Sequence[str] = (),
) -> AuditReport:
    """The audit as `who` may see it, filtered by severity and rule ids."""
    least, wanted = check_filters(min_severity, rule_filter)
    team: str | None = None
    with uow_factory() as uow:
        if not who.is_admin:
            team = next((t.name for t in uow.admin.list_tree_nodes("team") if t.id == who.team_id), None)
            if team is None:
                raise Invalid("this token belongs to no team")
        found = evaluate(load_facts(uow, rules, thresholds, now), thresholds, now)
    shown = [f for f in found if f.visible_to(team) and f.severity.at_least(least) and (not wanted or f.rule in wanted)]
    return report_of(shown, now)


# --- the daily event -----------------------------------------------------------------------------


def audit_subject(prefix: str) -> str:
    return f"{prefix}.events.report.audit"


def audit_day(now: datetime) -> str:
    return now.astimezone(UTC).date().isoformat()


def publish_daily_audit(
    uow_factory: UnitOfWorkFactory, prefix: str, rules: IdleRules, thresholds: AuditThresholds, now: datetime
) -> bool:
    """Write the day's `audit.report` event (every finding, as an admin sees them) to the outbox,
    once per UTC day: the audit log keeps a `report.audit` entry keyed by the day, written in the
    same transaction, and the event id is derived from the day (JetStream drops a copy too).
    Returns whether it wrote the event."""
    day = audit_day(now)
    with uow_factory() as uow:
        if uow.reports.marked(AUDIT_ACTION, day):
            return False
        found = evaluate(load_facts(uow, rules, thresholds, now), thresholds, now)
        report = report_of(found, now)  # counts over every finding
        data: dict[str, Any] = {"day": day, "findings_total": len(found), **report.model_dump(mode="json")}
        data["findings"] = data["findings"][:MAX_EVENT_FINDINGS]
        event_id = uuid.uuid5(uuid.NAMESPACE_URL, f"gpufleet:{prefix}:{AUDIT_EVENT}:{day}").hex
        _, payload = envelope(AUDIT_EVENT, data, now, event_id=event_id)
        uow.outbox.add(audit_subject(prefix), event_id, payload, now)
        uow.audit.record("reporter", AUDIT_ACTION, "report", day, {"event_id": event_id, "findings": len(found)}, now)
        uow.commit()
    return True
