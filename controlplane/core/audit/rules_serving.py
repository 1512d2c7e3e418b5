"""Rules about inference's serving signals (the SLO link): traffic the idle policy cannot read,
and latency above the objective the workload declared."""

from __future__ import annotations

from datetime import datetime

from controlplane.core.audit.facts import AuditFacts
from controlplane.core.audit.findings import (
    Finding,
    Fix,
    LatencyMissed,
    ObjectRef,
    Rule,
    Severity,
    TrafficUnknown,
    team_of,
)


def traffic_unknown(facts: AuditFacts, now: datetime) -> list[Finding]:
    """A running inference run whose traffic the idle policy cannot read (no traffic metric
    declared, or no reading fresher than `stale_seconds` once it has run that long) is exempt from
    the idle policy: it may hold its GPUs unused for ever."""
    found = []
    for s in facts.serving:
        if s.running_since is None or (now - s.running_since).total_seconds() <= facts.stale_seconds:
            continue  # not running, or too recently started to expect a reading
        fresh = s.observed_at is not None and (now - s.observed_at).total_seconds() <= facts.stale_seconds
        if s.traffic_declared and fresh:
            continue
        found.append(
            Finding(
                Rule.INFERENCE_TRAFFIC_UNKNOWN,
                Severity.WARNING,
                (ObjectRef("run", s.run_id), ObjectRef("team", s.team)),
                TrafficUnknown(s.workload, s.traffic_declared, s.observed_at, facts.stale_seconds),
                Fix.DECLARE_TRAFFIC,
                team_of(s.team),
            )
        )
    return found


def latency_missed(facts: AuditFacts, now: datetime) -> list[Finding]:
    """A fresh latency reading above the run's declared objective. High on a time-sliced or MPS
    pool, where another tenant's work on the same GPU may be the cause."""
    pools_of = {r.run_id: r.pools for r in facts.runs}
    shared = {p.key for p in facts.pools if p.sharing.shared}
    found = []
    for s in facts.serving:
        if s.latency_objective_ms is None or s.latency_ms is None or s.observed_at is None:
            continue
        if s.latency_ms <= s.latency_objective_ms or (now - s.observed_at).total_seconds() > facts.stale_seconds:
            continue
        on_shared = tuple(sorted(p for p in pools_of.get(s.run_id, ()) if p in shared))
        found.append(
            Finding(
                Rule.LATENCY_OBJECTIVE_MISSED,
                Severity.HIGH if on_shared else Severity.WARNING,
                (ObjectRef("run", s.run_id), ObjectRef("team", s.team)),
                LatencyMissed(s.workload, s.latency_ms, s.latency_objective_ms, s.observed_at, on_shared),
                Fix.ISOLATE_OR_SCALE,
                team_of(s.team),
            )
        )
    return found
