"""Turning a decoded YAML document into a ScenarioDoc, with every problem named by its field path.

Pydantic checks each field; the checks here are the ones across fields (a workload's queue must
exist, a step must name a real node, ...), reported in the same `path: message` form.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import ValidationError

from controlplane.scenario.format import ScenarioDoc


class ScenarioInvalid(ValueError):
    """The document is not a valid scenario; `problems` are (field path, message) pairs."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__("\n".join(f"{path}: {message}" for path, message in problems))


def parse_scenario(data: object) -> ScenarioDoc:
    if not isinstance(data, dict):
        raise ScenarioInvalid([("(document)", "a scenario is a YAML mapping with fleet, teams, queues, workloads")])
    try:
        doc = ScenarioDoc.model_validate(data)
    except ValidationError as exc:
        raise ScenarioInvalid(
            [(".".join(str(part) for part in error["loc"]) or "(document)", error["msg"]) for error in exc.errors()]
        ) from exc
    problems = reference_problems(doc)
    if problems:
        raise ScenarioInvalid(problems)
    return doc


def node_names(doc: ScenarioDoc) -> set[str]:
    return {
        f"{cluster.name}/{pool.name}/{index}"
        for cluster in doc.fleet
        for pool in cluster.pools
        for index in range(pool.node_count)
    }


def _duplicates(kind: str, path: str, names: Iterable[str]) -> list[tuple[str, str]]:
    seen: set[str] = set()
    problems = []
    for index, name in enumerate(names):
        if name in seen:
            problems.append((f"{path}.{index}.name", f"{kind} {name!r} is defined twice"))
        seen.add(name)
    return problems


def reference_problems(doc: ScenarioDoc) -> list[tuple[str, str]]:
    """Cross-field problems of a document that passed field validation."""
    problems = _duplicates("cluster", "fleet", (c.name for c in doc.fleet))
    problems += _duplicates("cohort", "cohorts", (c.name for c in doc.cohorts))
    problems += _duplicates("team", "teams", (t.name for t in doc.teams))
    problems += _duplicates("queue", "queues", (q.name for q in doc.queues))
    problems += _duplicates("priority class", "priority_classes", (p.name for p in doc.priority_classes))
    problems += _duplicates("workload", "workloads", (w.name for w in doc.workloads))

    cohorts = {c.name for c in doc.cohorts}
    teams = {t.name for t in doc.teams}
    queues = {q.name for q in doc.queues}
    classes = {p.name for p in doc.priority_classes}
    workloads = {w.name for w in doc.workloads}
    for i, team in enumerate(doc.teams):
        if team.parent is not None and team.parent not in cohorts:
            problems.append((f"teams.{i}.parent", f"unknown cohort {team.parent!r}"))
    for i, queue in enumerate(doc.queues):
        if queue.parent not in teams:
            problems.append((f"queues.{i}.parent", f"unknown team {queue.parent!r}"))
    defaults = [p.name for p in doc.priority_classes if p.default]
    if len(defaults) > 1:
        problems.append(("priority_classes", f"more than one default class: {', '.join(defaults)}"))
    for i, workload in enumerate(doc.workloads):
        if workload.queue not in queues:
            problems.append((f"workloads.{i}.queue", f"unknown queue {workload.queue!r}"))
        if workload.priority_class is None and not defaults:
            problems.append((f"workloads.{i}.priority_class", "no priority class given and none is the default"))
        elif workload.priority_class is not None and workload.priority_class not in classes:
            problems.append((f"workloads.{i}.priority_class", f"unknown priority class {workload.priority_class!r}"))

    for i, entry in enumerate(doc.history):
        if entry.queue not in queues:
            problems.append((f"history.{i}.queue", f"unknown queue {entry.queue!r}"))

    nodes = node_names(doc)
    levels = {"cohort": cohorts, "team": teams, "queue": queues}
    for i, step in enumerate(doc.steps):
        if step.cancel is not None and step.cancel not in workloads:
            problems.append((f"steps.{i}.cancel", f"unknown workload {step.cancel!r}"))
        if step.set_quota is not None:
            level, name = step.set_quota.target
            if name not in levels[level]:
                problems.append((f"steps.{i}.set_quota.{level}", f"unknown {level} {name!r}"))
        for action in ("cordon", "uncordon"):
            node: str | None = getattr(step, action)
            if node is not None and node not in nodes:
                problems.append((f"steps.{i}.{action}", f"unknown node {node!r}; nodes are <cluster>/<pool>/<index>"))

    if doc.expect is not None:
        for name in doc.expect.workloads:
            if name not in workloads:
                problems.append((f"expect.workloads.{name}", f"unknown workload {name!r}"))
        for i, usage in enumerate(doc.expect.queue_gpu_eq_at):
            if usage.queue not in queues:
                problems.append((f"expect.queue_gpu_eq_at.{i}.queue", f"unknown queue {usage.queue!r}"))
    return problems
