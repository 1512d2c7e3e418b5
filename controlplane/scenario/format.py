"""The scenario document: a fleet, a queue tree, priority classes, workloads over time, steps and
expectations, as pydantic models that forbid unknown fields (documented in docs/scenarios.md).

Pool, toleration and pod-set fields are the REST API's own models, so a scenario validates
exactly like the requests it stands for.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator

from controlplane.core.snapshot import Policy
from controlplane.domain.model import WorkloadKind
from controlplane.service.cluster_specs import ClusterSpec
from controlplane.service.commands import (
    Name,
    PodSetSpec,
    QuotaMap,
    TolerationSpec,
    check_minimums,
)

Seconds = float
# A scenario is a test: more cycles than this is a mistake in `until` or `cycle_seconds`.
MAX_CYCLES = 100_000


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


class TreeNodeDoc(Strict):
    """Quota fields shared by cohorts, teams and queues: maps of "gpu-eq" or a GPU model to amounts."""

    name: Name
    guaranteed: QuotaMap = Field(default_factory=dict)
    limit: QuotaMap = Field(default_factory=dict)
    weight: float = Field(default=1.0, gt=0, le=1000)
    borrowing_limit: QuotaMap = Field(default_factory=dict)
    lending_limit: QuotaMap = Field(default_factory=dict)


class CohortDoc(TreeNodeDoc):
    pass


class TeamDoc(TreeNodeDoc):
    parent: Name | None = None  # a cohort, or none


class QueueDoc(TreeNodeDoc):
    parent: Name  # the team


class PriorityClassDoc(Strict):
    name: Name
    value: int = Field(ge=-1_000_000, le=1_000_000)
    preemptible: bool = True
    min_runtime_seconds: int = Field(default=0, ge=0)
    default: bool = False


# What `gpufleet server init` seeds, so a scenario without priority classes behaves like a fresh install.
DEFAULT_PRIORITY_CLASSES = (
    PriorityClassDoc(name="batch", value=100, default=True),
    PriorityClassDoc(name="production", value=1000, preemptible=False),
)


class WorkloadDoc(Strict):
    name: Name
    queue: Name
    priority_class: Name | None = None
    submit_at: Seconds = Field(default=0, ge=0)
    duration: Seconds | None = Field(default=None, gt=0, description="None: runs until the scenario ends")
    kind: WorkloadKind = WorkloadKind.TRAINING
    pod_sets: list[PodSetSpec] = Field(min_length=1, max_length=16)
    min_available: int | None = Field(default=None, ge=1)
    requires_isolation: bool | None = None  # default: true for inference, as the API decides
    tolerations: list[TolerationSpec] = Field(default_factory=list)
    max_runtime_seconds: Seconds | None = Field(default=None, gt=0)
    spot: Literal["allow", "prefer", "avoid", "never"] = "allow"
    same_pool: Literal["preferred", "required"] = "preferred"
    idle_after: Seconds | None = Field(default=None, ge=0, description="a run is idle once it has run this long")
    idle_reclaim_after: Seconds | None = Field(
        default=None, ge=0, description="the idle policy marks the run reclaimable once it has run this long"
    )

    @model_validator(mode="after")
    def _gang_is_consistent(self) -> WorkloadDoc:
        names = [p.name for p in self.pod_sets]
        if len(names) != len(set(names)):
            raise ValueError("pod set names must be unique within a workload")
        total = sum(p.replicas for p in self.pod_sets)
        if self.min_available is not None and self.min_available > total:
            raise ValueError(f"min_available {self.min_available} is more than the {total} pods of the gang")
        check_minimums(self.pod_sets, self.min_available)
        if not any(p.gpus or p.mig_profile or p.gpu_fraction for p in self.pod_sets):
            raise ValueError("a workload must request at least one GPU (gpus, mig_profile or gpu_fraction)")
        return self


class QuotaChange(Strict):
    """New quota fields of one cohort, team or queue; fields left out keep their value."""

    cohort: Name | None = None
    team: Name | None = None
    queue: Name | None = None
    guaranteed: QuotaMap | None = None
    limit: QuotaMap | None = None
    weight: float | None = Field(default=None, gt=0, le=1000)
    borrowing_limit: QuotaMap | None = None
    lending_limit: QuotaMap | None = None

    @model_validator(mode="after")
    def _one_target(self) -> QuotaChange:
        if sum(x is not None for x in (self.cohort, self.team, self.queue)) != 1:
            raise ValueError("name exactly one of cohort, team or queue")
        return self

    @property
    def target(self) -> tuple[str, str]:
        for level in ("cohort", "team", "queue"):
            name: str | None = getattr(self, level)
            if name is not None:
                return level, name
        raise AssertionError("validated to name one target")


class HistoryDoc(Strict):
    """Consumption before the scenario starts (negative seconds), for fair-share history."""

    queue: Name
    gpu_eq: float = Field(gt=0)
    start: Seconds = Field(le=0)
    end: Seconds = Field(le=0)

    @model_validator(mode="after")
    def _ordered(self) -> HistoryDoc:
        if self.end <= self.start:
            raise ValueError("history: end must be after start")
        return self


class StepDoc(Strict):
    """One change to the world at a moment: exactly one action."""

    at: Seconds = Field(ge=0)
    cancel: Name | None = None  # a workload
    set_quota: QuotaChange | None = None
    cordon: str | None = None  # a node, `<cluster>/<pool>/<index>`
    uncordon: str | None = None

    @model_validator(mode="after")
    def _one_action(self) -> StepDoc:
        actions = [self.cancel, self.set_quota, self.cordon, self.uncordon]
        if sum(a is not None for a in actions) != 1:
            raise ValueError("a step does exactly one of cancel, set_quota, cordon, uncordon")
        return self


Window = tuple[Seconds, Seconds]  # inclusive [earliest, latest]


class WorkloadExpectation(Strict):
    """What must be true of one workload when the scenario ends; unset fields are not checked."""

    state: Literal["unsubmitted", "queued", "running", "succeeded", "cancelled", "rejected"] | None = None
    admitted_at: Seconds | None = None  # the first admission
    admitted_within: Window | None = None
    never_admitted: bool = False
    runs: int | None = Field(default=None, ge=0)  # how many times it was admitted
    cluster: str | None = None  # of the last run, as are pool, pools, nodes, node_count, pod_count
    pool: str | None = None  # every pod in this pool
    pools: list[str] | None = None
    nodes: list[str] | None = None
    node_count: int | None = Field(default=None, ge=0)
    pod_count: int | None = Field(default=None, ge=0)
    preemptions: int | None = Field(default=None, ge=0)
    preempted_by: Name | None = None  # of the first preemption, as are the three below
    preempted_kind: Literal["idle", "preempt", "reclaim", "rebalance", "take-back"] | None = None
    preempted_at: Seconds | None = None
    preempted_within: Window | None = None
    preempted_others: int | None = Field(default=None, ge=0)  # evictions made for this workload
    # Its first run borrowed capacity reserved for this waiting workload (null: it did not).
    borrowed_from: Name | None = None
    finished_at: Seconds | None = None
    finished_within: Window | None = None
    pending_reason_contains: str | list[str] | None = None  # a list: each in a later reason than the last
    rejected_reason_contains: str | None = None


class QueueUsageExpectation(Strict):
    """GPU-equivalents a leaf queue holds right after the cycle at `at`."""

    queue: Name
    at: Seconds = Field(ge=0)
    min: float | None = None
    max: float | None = None


class Expectations(Strict):
    workloads: dict[Name, WorkloadExpectation] = Field(default_factory=dict)
    total_evictions: int | None = Field(default=None, ge=0)
    max_evictions_per_cycle: int | None = Field(default=None, ge=0)
    # The set of eviction kinds seen, sorted.
    eviction_kinds: list[Literal["idle", "preempt", "reclaim", "rebalance"]] | None = None
    queue_gpu_eq_at: list[QueueUsageExpectation] = Field(default_factory=list)


POLICY_FIELDS = {f.name for f in dataclasses.fields(Policy)}


class ScenarioDoc(Strict):
    description: str = ""
    xfail: str | None = None  # read by the test suite only: the scenario pins behaviour not built yet
    fleet: list[ClusterSpec] = Field(min_length=1)
    cohorts: list[CohortDoc] = Field(default_factory=list)
    teams: list[TeamDoc] = Field(min_length=1)
    queues: list[QueueDoc] = Field(min_length=1)
    priority_classes: list[PriorityClassDoc] = Field(default_factory=lambda: list(DEFAULT_PRIORITY_CLASSES))
    workloads: list[WorkloadDoc] = Field(default_factory=list)
    steps: list[StepDoc] = Field(default_factory=list)
    history: list[HistoryDoc] = Field(default_factory=list)
    policy: dict[str, Any] = Field(default_factory=dict)
    cycle_seconds: Seconds = Field(default=10.0, gt=0)
    until: Seconds = Field(default=3600.0, ge=0)
    expect: Expectations | None = None

    @field_validator("policy")
    @classmethod
    def _policy_fields_exist(cls, policy: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(policy) - POLICY_FIELDS)
        if unknown:
            raise ValueError(f"unknown policy field(s) {', '.join(unknown)}; known: {', '.join(sorted(POLICY_FIELDS))}")
        try:
            TypeAdapter(Policy).validate_python(policy)
        except ValidationError as exc:
            raise ValueError("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())) from exc
        return policy

    @model_validator(mode="after")
    def _bounded_run(self) -> ScenarioDoc:
        if self.until / self.cycle_seconds > MAX_CYCLES:
            raise ValueError(f"until / cycle_seconds is more than {MAX_CYCLES} cycles")
        return self

    def policy_value(self) -> Policy:
        return TypeAdapter(Policy).validate_python(self.policy)
