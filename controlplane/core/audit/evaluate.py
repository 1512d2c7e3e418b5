"""Every rule of the audit over one set of facts, in a deterministic order."""

from __future__ import annotations

from datetime import datetime

from controlplane.core.audit import rules_fleet as fleet
from controlplane.core.audit import rules_serving as serving
from controlplane.core.audit import rules_work as work
from controlplane.core.audit.facts import AuditFacts, AuditThresholds
from controlplane.core.audit.findings import Finding


def evaluate(facts: AuditFacts, thresholds: AuditThresholds, now: datetime) -> tuple[Finding, ...]:
    """All findings, most severe first, then by rule id, then by the objects they concern."""
    silent = fleet.clusters_without_telemetry(facts, now)
    found = [
        *fleet.untainted_gpu_pools(facts),
        *fleet.non_gpu_pods_on_gpu_nodes(facts),
        *fleet.timeslice_pools_open_to_all(facts),
        *fleet.missing_limits(facts),
        *fleet.classes_without_preemption_policy(facts),
        *fleet.fleet_without_guarantee(facts),
        *silent,
        *work.shared_production(facts),
        *work.shared_inference_without_mig(facts),
        *work.training_without_gang(facts),
        *work.unmeasured_runs(facts, now, {f.objects[0].name for f in silent}),
        *work.allocation_unused(facts, thresholds),
        *work.idle_runs(facts),
        *work.idle_reclaimed(facts, thresholds),
        *serving.traffic_unknown(facts, now),
        *serving.latency_missed(facts, now),
    ]
    return tuple(sorted(found, key=lambda f: f.sort_key))
