"""The fleet audit: the field's GPU-fleet checklist as pure rules (typed facts in, typed findings out).

`evaluate(facts, thresholds, now)` runs every rule; the service layer loads the facts and the
wording layer (`controlplane/service/audit_wording.py`) renders titles, evidence and fixes.
"""

from controlplane.core.audit.evaluate import evaluate
from controlplane.core.audit.facts import (
    AuditFacts,
    AuditThresholds,
    ClassFact,
    ClusterFact,
    NodePodsFact,
    PoolFact,
    RunFact,
    ServingFact,
    TeamUseFact,
    TreeFact,
)
from controlplane.core.audit.findings import Audience, Finding, ObjectRef, Rule, Severity

__all__ = [
    "Audience",
    "AuditFacts",
    "AuditThresholds",
    "ClassFact",
    "ClusterFact",
    "Finding",
    "NodePodsFact",
    "ObjectRef",
    "PoolFact",
    "Rule",
    "RunFact",
    "ServingFact",
    "Severity",
    "TeamUseFact",
    "TreeFact",
    "evaluate",
]
