"""Inputs of the queueing simulator: a fleet document (YAML) and a workload (CSV or YAML).

The fleet document is the scenario format's `fleet` (clusters of node pools, the REST API's own
`ClusterSpec`) plus `teams` and `queues` carrying `guaranteed` / `weight`. A fleet without
`queues` gets one queue per team, named like the team and holding the team's guarantee, so a
generated fleet stays short.

The workload is one row per job; `utilization`, `max_runtime` and `idle_after` are optional columns.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from controlplane.domain.model import (
    GPU_EQ,
    Cluster,
    Node,
    QueueNode,
    Quota,
    WorkloadKind,
)
from controlplane.service.cluster_specs import ClusterSpec
from controlplane.service.commands import Name, QuotaMap

WORKLOAD_COLUMNS = ("id", "submit_time", "queue", "gpus_per_pod", "pods", "duration", "priority", "kind")
OPTIONAL_COLUMNS = ("utilization", "max_runtime", "idle_after")


class InputError(ValueError):
    """A fleet or workload file that cannot be simulated, with what is wrong."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


class TeamDoc(_Strict):
    name: Name
    guaranteed: QuotaMap = Field(default_factory=dict)
    weight: float = Field(default=1.0, gt=0, le=1000)


class QueueDoc(TeamDoc):
    parent: Name


class FleetDoc(_Strict):
    clusters: list[ClusterSpec] = Field(min_length=1)
    teams: list[TeamDoc] = Field(min_length=1)
    queues: list[QueueDoc] = Field(default_factory=list)

    @model_validator(mode="after")
    def _names_resolve(self) -> FleetDoc:
        teams = {t.name for t in self.teams}
        if len(teams) != len(self.teams):
            raise ValueError("team names must be unique")
        for queue in self.queues:
            if queue.parent not in teams:
                raise ValueError(f"queue {queue.name}: parent team {queue.parent} is not declared")
        if len({q.name for q in self.queues}) != len(self.queues):
            raise ValueError("queue names must be unique")
        return self

    def effective_queues(self) -> list[QueueDoc]:
        if self.queues:
            return list(self.queues)
        return [
            QueueDoc(name=t.name, parent=t.name, guaranteed=dict(t.guaranteed), weight=t.weight) for t in self.teams
        ]


@dataclass(frozen=True)
class Fleet:
    """Domain values built from a fleet document; ids follow the scenario package's scheme."""

    clusters: tuple[Cluster, ...]
    nodes: tuple[Node, ...]
    tree: dict[str, QueueNode]
    queue_ids: dict[str, str]  # queue name -> tree id
    team_of: dict[str, str]  # queue name -> team tree id

    @property
    def capacity_gpus(self) -> int:
        pools = {p.id: p for c in self.clusters for p in c.pools}
        return sum(pools[n.pool_id].gpus_per_node for n in self.nodes)

    def entitlements(self) -> dict[str, float]:
        """Each queue's entitled part of the fleet: its gpu-eq guarantee over all guarantees, or its
        weight over all weights when nobody declares a guarantee."""
        guaranteed = {
            name: float(self.tree[qid].guaranteed.amounts.get(GPU_EQ, 0.0)) for name, qid in self.queue_ids.items()
        }
        total = sum(guaranteed.values())
        if total > 0:
            return {name: value / total for name, value in guaranteed.items()}
        weights = {name: self.tree[qid].weight for name, qid in self.queue_ids.items()}
        total_w = sum(weights.values())
        return {name: w / total_w for name, w in weights.items()}


def build_fleet(doc: FleetDoc) -> Fleet:
    clusters: list[Cluster] = []
    nodes: list[Node] = []
    for spec in doc.clusters:
        pools = tuple(p.to_pool(f"{spec.name}/{p.name}", spec.name) for p in spec.pools)
        clusters.append(Cluster(spec.name, spec.name, spec.provider, spec.region, pools))
        for pool in pools:
            nodes.extend(Node(f"{pool.id}/{i}", spec.name, pool.id, f"{pool.id}/{i}") for i in range(pool.node_count))
    tree: dict[str, QueueNode] = {}
    for team in doc.teams:
        tree[f"team/{team.name}"] = QueueNode(
            f"team/{team.name}", team.name, None, Quota(dict(team.guaranteed)), weight=team.weight
        )
    queue_ids: dict[str, str] = {}
    team_of: dict[str, str] = {}
    for queue in doc.effective_queues():
        qid = f"queue/{queue.name}"
        tree[qid] = QueueNode(
            qid, queue.name, f"team/{queue.parent}", Quota(dict(queue.guaranteed)), weight=queue.weight
        )
        queue_ids[queue.name] = qid
        team_of[queue.name] = f"team/{queue.parent}"
    return Fleet(tuple(clusters), tuple(nodes), tree, queue_ids, team_of)


def load_fleet(path: Path) -> Fleet:
    try:
        raw = yaml.safe_load(path.read_text())
        return build_fleet(FleetDoc.model_validate(raw))
    except (yaml.YAMLError, ValidationError) as exc:
        raise InputError(f"{path}: {exc}") from exc


def dump_fleet(doc: FleetDoc, path: Path) -> None:
    path.write_text(yaml.safe_dump(doc.model_dump(mode="json", exclude_defaults=True), sort_keys=False))


@dataclass(frozen=True)
class Job:
    id: str
    submit_time: float
    queue: str
    gpus_per_pod: int
    pods: int
    duration: float
    priority: int
    kind: WorkloadKind
    utilization: float | None = None  # mean GPU utilization while running, 0..1, when known
    max_runtime: float | None = None  # declared bound (lets reservations and backfill plan)
    # Hoarding: from this many seconds into a run the job's work is done but it holds its GPUs
    # idle until `duration` (None: busy throughout).
    idle_after: float | None = None

    @property
    def gpus(self) -> int:
        return self.gpus_per_pod * self.pods


def _job(row: dict[str, Any], where: str) -> Job:
    missing = [c for c in WORKLOAD_COLUMNS if row.get(c) in (None, "")]
    if missing:
        raise InputError(f"{where}: missing {', '.join(missing)}")
    try:
        job = Job(
            id=str(row["id"]),
            submit_time=float(row["submit_time"]),
            queue=str(row["queue"]),
            gpus_per_pod=int(row["gpus_per_pod"]),
            pods=int(row["pods"]),
            duration=float(row["duration"]),
            priority=int(row["priority"]),
            kind=WorkloadKind(str(row["kind"])),
            utilization=None if row.get("utilization") in (None, "") else float(row["utilization"]),
            max_runtime=None if row.get("max_runtime") in (None, "") else float(row["max_runtime"]),
            idle_after=None if row.get("idle_after") in (None, "") else float(row["idle_after"]),
        )
    except ValueError as exc:
        raise InputError(f"{where}: {exc}") from exc
    if job.submit_time < 0 or job.duration <= 0 or job.gpus_per_pod < 1 or job.pods < 1:
        raise InputError(f"{where}: needs submit_time >= 0, duration > 0, gpus_per_pod >= 1 and pods >= 1")
    if job.utilization is not None and not 0 <= job.utilization <= 1:
        raise InputError(f"{where}: utilization must be within 0..1")
    if job.idle_after is not None and not 0 <= job.idle_after <= job.duration:
        raise InputError(f"{where}: idle_after must be within 0..duration")
    return job


def load_workload(path: Path) -> list[Job]:
    if path.suffix in (".yaml", ".yml"):
        raw = yaml.safe_load(path.read_text())
        rows = raw.get("jobs", []) if isinstance(raw, dict) else raw
        if not isinstance(rows, list):
            raise InputError(f"{path}: expected a list of jobs (or a mapping with `jobs`)")
        jobs = [_job(dict(r), f"{path} job {i + 1}") for i, r in enumerate(rows)]
    else:
        with path.open(newline="") as handle:
            jobs = [_job(r, f"{path} line {i + 2}") for i, r in enumerate(csv.DictReader(handle))]
    if len({j.id for j in jobs}) != len(jobs):
        raise InputError(f"{path}: job ids must be unique")
    return jobs


def write_workload(jobs: Sequence[Job], path: Path) -> None:
    extra = [c for c in OPTIONAL_COLUMNS if any(getattr(j, c) is not None for j in jobs)]
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow([*WORKLOAD_COLUMNS, *extra])
        writer.writerows(_row(j, extra) for j in jobs)


def _row(job: Job, extra: Iterable[str]) -> list[object]:
    row: list[object] = [
        job.id,
        f"{job.submit_time:.3f}",
        job.queue,
        job.gpus_per_pod,
        job.pods,
        f"{job.duration:.3f}",
        job.priority,
        job.kind.value,
    ]
    for column in extra:
        value = getattr(job, column)
        row.append("" if value is None else f"{value:.3f}")
    return row
