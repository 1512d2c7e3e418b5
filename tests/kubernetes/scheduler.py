"""The scheduler's filters as the fake API server plays them (pure functions over dicts).

Filter order and messages follow kube-scheduler's default plugins (`pkg/scheduler/framework/plugins`):
NodeUnschedulable ("node(s) were unschedulable"), TaintToleration ("node(s) had untolerated taint
{key: value}"), NodeAffinity ("node(s) didn't match Pod's node affinity/selector"),
NodeResourcesFit ("Insufficient <resource>", "Too many pods"); a node stops at its first failing
plugin, and the pod's condition reads "0/N nodes are available: <count> <reason>, ..." with the
reasons sorted (`FitError.Error`). A node that is not Ready carries the node lifecycle controller's
`node.kubernetes.io/not-ready` (or `unreachable`) NoSchedule taint.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from tests.kubernetes.admission import pod_requests
from tests.kubernetes.quantity import QuantityError, parse_quantity

TERMINAL_PHASES = ("Succeeded", "Failed")


def node_ready(node: Mapping[str, Any]) -> str:
    """The Ready condition's status ("True", "False", "Unknown"; "Unknown" when missing)."""
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return str(cond.get("status", "Unknown"))
    return "Unknown"


def effective_taints(node: Mapping[str, Any]) -> list[dict[str, str]]:
    taints = list((node.get("spec") or {}).get("taints") or [])
    ready = node_ready(node)
    if ready == "False":
        taints.append({"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"})
    elif ready == "Unknown":
        taints.append({"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"})
    return taints


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """v1 helper ToleratesTaint."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if key and key != taint.get("key"):
        return False
    if toleration.get("operator", "Equal") == "Exists":
        return True
    return bool(toleration.get("value", "") == taint.get("value", ""))


def _requirement_matches(req: Mapping[str, Any], value: str | None) -> bool:
    op, values = req.get("operator"), [str(v) for v in req.get("values") or []]
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and values:
        try:
            have, want = int(value), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    return False


def matches_node_affinity(pod_spec: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    labels = (node.get("metadata") or {}).get("labels") or {}
    for key, value in (pod_spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return False
    required = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if not required:
        return True
    fields = {"metadata.name": (node.get("metadata") or {}).get("name")}
    for term in required.get("nodeSelectorTerms") or []:
        exprs, field_reqs = term.get("matchExpressions") or [], term.get("matchFields") or []
        if not exprs and not field_reqs:
            continue  # an empty term matches nothing
        if all(_requirement_matches(r, labels.get(r.get("key"))) for r in exprs) and all(
            _requirement_matches(r, fields.get(r.get("key"))) for r in field_reqs
        ):
            return True
    return False


def allocatable(node: Mapping[str, Any]) -> dict[str, Fraction]:
    out: dict[str, Fraction] = {}
    for name, raw in ((node.get("status") or {}).get("allocatable") or {}).items():
        try:
            out[name] = parse_quantity(raw)
        except QuantityError:
            continue
    return out


@dataclass
class NodeState:
    """A node and what the pods bound to it already hold."""

    node: dict[str, Any]
    used: dict[str, Fraction] = field(default_factory=dict)
    pods: int = 0

    @property
    def name(self) -> str:
        return str(self.node["metadata"]["name"])

    def hold(self, requests: Mapping[str, Fraction]) -> None:
        for name, amount in requests.items():
            self.used[name] = self.used.get(name, Fraction(0)) + amount
        self.pods += 1

    def release(self, requests: Mapping[str, Fraction]) -> None:
        for name, amount in requests.items():
            self.used[name] = self.used.get(name, Fraction(0)) - amount
        self.pods -= 1


def node_states(nodes: Iterable[dict[str, Any]], pods: Iterable[dict[str, Any]]) -> dict[str, NodeState]:
    states = {n["metadata"]["name"]: NodeState(n) for n in nodes}
    for pod in pods:
        bound = (pod.get("spec") or {}).get("nodeName")
        if bound in states and (pod.get("status") or {}).get("phase") not in TERMINAL_PHASES:
            states[bound].hold(pod_requests(pod["spec"]))
    return states


def filter_reasons(pod_spec: Mapping[str, Any], state: NodeState) -> list[str]:
    """Why the pod cannot go to this node ([] = it fits), first failing plugin only."""
    node = state.node
    tolerations = pod_spec.get("tolerations") or []
    if (node.get("spec") or {}).get("unschedulable") and not any(
        tolerates(t, {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}) for t in tolerations
    ):
        return ["node(s) were unschedulable"]
    for taint in effective_taints(node):
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not any(tolerates(t, taint) for t in tolerations):
            return [f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value', '')}}}"]
    if not matches_node_affinity(pod_spec, node):
        return ["node(s) didn't match Pod's node affinity/selector"]
    free = allocatable(node)
    reasons = []
    if state.pods + 1 > free.get("pods", Fraction(110)):
        reasons.append("Too many pods")
    for name, amount in sorted(pod_requests(pod_spec).items()):
        if amount > 0 and state.used.get(name, Fraction(0)) + amount > free.get(name, Fraction(0)):
            reasons.append(f"Insufficient {name}")
    return reasons


def fit_error(node_count: int, reasons: Mapping[str, list[str]]) -> str:
    histogram: dict[str, int] = {}
    for per_node in reasons.values():
        for reason in per_node:
            histogram[reason] = histogram.get(reason, 0) + 1
    parts = sorted(f"{count} {reason}" for reason, count in histogram.items())
    return (
        f"0/{node_count} nodes are available: {', '.join(parts)}." if parts else f"0/{node_count} nodes are available."
    )


def place(pod_spec: Mapping[str, Any], states: Mapping[str, NodeState]) -> tuple[str | None, str]:
    """The node the pod goes to (the first fitting node by name: deterministic, no scoring),
    or None and the scheduler's message."""
    reasons: dict[str, list[str]] = {}
    fitting: list[NodeState] = []
    for name in sorted(states):
        why = filter_reasons(pod_spec, states[name])
        if why:
            reasons[name] = why
        else:
            fitting.append(states[name])
    if not fitting:
        return None, fit_error(len(states), reasons)
    return fitting[0].name, ""
