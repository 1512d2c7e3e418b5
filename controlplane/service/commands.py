"""Validated inputs of the service layer, shared by REST and NATS so both validate alike.

Each model states in its JSON Schema (the OpenAPI) every rule it enforces (see `constraints`); the
fleet's own inputs (clusters, pools) are in `cluster_specs`."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from controlplane.domain import kubernetes_syntax as k8s
from controlplane.domain.limits import (
    MAX_CONTAINER_BYTES,
    MAX_ENV_VARS,
    MAX_LABELS,
    MAX_POD_SETS,
    MAX_PODS_PER_GANG,
    MAX_PRICE_PER_GPU_HOUR,
    MAX_QUOTA_AMOUNT,
    MAX_QUOTA_KEYS,
    MAX_TOLERATIONS,
)
from controlplane.domain.model import RESERVED_LABEL_PATTERN, PodSet, WorkloadKind, reserved_label
from controlplane.domain.sharing import MIG_PROFILE_PATTERN
from controlplane.service.constraints import Also, KeysMatch, Strict, matching, rules
from controlplane.service.serving import ServingSpec

NAME_PATTERN = k8s.DNS1123_LABEL_PATTERN
NAME_SENTENCE = "must be lower-case letters, digits and '-', starting and ending with a letter or digit"
Name = Annotated[str, Field(min_length=1, max_length=63, pattern=NAME_PATTERN), matching(NAME_SENTENCE)]
QuotaAmount = Annotated[float, Field(ge=0, le=MAX_QUOTA_AMOUNT, allow_inf_nan=False)]
QuotaMap = Annotated[
    dict[Annotated[str, Field(min_length=1, max_length=40)], QuotaAmount], Field(max_length=MAX_QUOTA_KEYS)
]
Price = Annotated[float, Field(ge=0, le=MAX_PRICE_PER_GPU_HOUR, allow_inf_nan=False)]

# Kubernetes syntax: checked by `kubernetes_syntax` (for its sentences), published from its patterns.
_LABEL_KEY_SCHEMA = {"pattern": k8s.QUALIFIED_NAME_PATTERN, "allOf": [{"pattern": k8s.PREFIX_LENGTH_PATTERN}]}
LabelKey = Annotated[str, Field(max_length=k8s.QUALIFIED_KEY_MAX), Also(_LABEL_KEY_SCHEMA)]
LabelValue = Annotated[str, Also({"pattern": k8s.LABEL_VALUE_PATTERN})]
PoolLabels = Annotated[dict[LabelKey, LabelValue], KeysMatch()]
_WorkloadLabelKey = Annotated[
    str,
    Field(max_length=k8s.QUALIFIED_KEY_MAX),
    Also({**_LABEL_KEY_SCHEMA, "not": {"pattern": RESERVED_LABEL_PATTERN}}),
]
WorkloadLabels = Annotated[dict[_WorkloadLabelKey, LabelValue], KeysMatch()]


def _refuse(errors: list[str], what: str) -> None:
    if errors:
        raise ValueError(f"{what}: {'; '.join(errors)}")


def check_labels(labels: dict[str, str], reserved: Callable[[str], bool] | None = None) -> dict[str, str]:
    """Kubernetes label syntax for every key and value, at most MAX_LABELS of them."""
    if len(labels) > MAX_LABELS:
        raise ValueError(f"at most {MAX_LABELS} labels")
    for key, value in labels.items():
        _refuse(k8s.qualified_name_errors(key), f"label key {key[:80]!r}")
        _refuse(k8s.label_value_errors(value), f"label {key!r} value {value[:80]!r}")
        if reserved is not None and reserved(key):
            raise ValueError(
                f"label {key} is reserved: set by gpufleet or the controllers it drives "
                "(Jobs, JobSet, Kueue, gang schedulers)"
            )
    return labels


class TaintSpec(Strict):
    key: LabelKey = Field(min_length=1)
    value: LabelValue = Field(default="", max_length=63)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"

    @model_validator(mode="after")
    def _kubernetes_syntax(self) -> TaintSpec:
        _refuse(k8s.taint_errors(self.key, self.value, self.effect), f"taint {self.key[:80]!r}")
        return self


class TolerationSpec(Strict):
    # Kubernetes' rule that operator Exists takes no value.
    model_config = ConfigDict(
        json_schema_extra={
            "if": {"properties": {"operator": {"const": "Exists"}}, "required": ["operator"]},
            "then": {"properties": {"value": {"maxLength": 0}}},
        }
    )

    key: LabelKey = Field(min_length=1, description="[prefix/]name, as a Kubernetes label key")
    operator: Literal["Equal", "Exists"] = "Equal"
    value: LabelValue = Field(default="", max_length=63)
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = ""

    @model_validator(mode="after")
    def _kubernetes_syntax(self) -> TolerationSpec:
        errors = k8s.toleration_errors(self.key, self.operator, self.value, self.effect)
        _refuse(errors, f"toleration {self.key[:80]!r}")
        return self


def guarantee_over_limit(guaranteed: dict[str, float], limit: dict[str, float]) -> str | None:
    """Why a guarantee is above its limit for some key, or None."""
    for key, amount in guaranteed.items():
        bound = limit.get(key)
        if bound is not None and amount > bound:
            return f"guaranteed {key} ({amount:g}) is above its limit ({bound:g})"
    return None


_GUARANTEE_RULE = rules(guarantee_within_limit="for each key in both, `guaranteed` is at most `limit`")


class TreeNodeSpec(Strict):
    model_config = ConfigDict(json_schema_extra=_GUARANTEE_RULE)

    name: Name
    guaranteed: QuotaMap = Field(
        default_factory=dict, description="per GPU model (of a registered pool) and/or 'gpu-eq'; else 409"
    )
    limit: QuotaMap = Field(default_factory=dict, description="never above; missing key = unbounded")
    weight: float = Field(default=1.0, gt=0, le=1000)
    borrowing_limit: QuotaMap = Field(default_factory=dict, description="most it may use above its guarantee")
    lending_limit: QuotaMap = Field(default_factory=dict, description="most of its unused guarantee it lends")

    @model_validator(mode="after")
    def _guarantee_within_limit(self) -> TreeNodeSpec:
        problem = guarantee_over_limit(self.guaranteed, self.limit)
        if problem:
            raise ValueError(problem)
        return self


class CohortSpec(TreeNodeSpec):
    pass


class TeamSpec(TreeNodeSpec):
    cohort: Name | None = None


class QueueSpec(TreeNodeSpec):
    team: Name


class QuotaUpdate(Strict):
    """The fields given replace the stored ones; a guarantee above the stored limit (or a limit below
    the stored guarantee) conflicts with the object's state (409)."""

    model_config = ConfigDict(json_schema_extra=_GUARANTEE_RULE)

    guaranteed: QuotaMap | None = None
    limit: QuotaMap | None = None
    weight: float | None = Field(default=None, gt=0, le=1000)
    borrowing_limit: QuotaMap | None = None
    lending_limit: QuotaMap | None = None

    @model_validator(mode="after")
    def _guarantee_within_limit(self) -> QuotaUpdate:
        problem = guarantee_over_limit(self.guaranteed or {}, self.limit or {})
        if problem:
            raise ValueError(problem)
        return self


class PriorityClassSpec(Strict):
    name: Name
    value: int = Field(ge=-1_000_000, le=1_000_000)
    preemptible: bool = True
    min_runtime_seconds: int = Field(default=0, ge=0, le=30 * 86400)
    is_default: bool = False


class TokenSpec(Strict):
    # role team (the default) needs a team; role admin takes none.
    model_config = ConfigDict(
        json_schema_extra={
            "if": {"properties": {"role": {"const": "admin"}}, "required": ["role"]},
            "then": {"properties": {"team": {"type": "null"}}},
            "else": {"properties": {"team": {"type": "string"}}, "required": ["team"]},
        }
    )

    name: Name
    team: Name | None = Field(default=None, description="team the token acts for; omit with role admin or metrics")
    role: Literal["team", "admin", "metrics"] = Field(
        default="team", description="metrics: may read /metrics and nothing else (for a Prometheus scrape config)"
    )

    @model_validator(mode="after")
    def _team_matches_role(self) -> TokenSpec:
        if self.role == "team" and not self.team:
            raise ValueError("a team token needs 'team'")
        if self.role != "team" and self.team:
            raise ValueError(f"a token of role {self.role} belongs to no team")
        return self


# What a pod set asks of GPUs: whole ones, a MIG profile or a fraction (at most one of them).
_WHOLE_GPUS: dict[str, Any] = {"properties": {"gpus": {"minimum": 1}}, "required": ["gpus"]}
_A_MIG_PROFILE: dict[str, Any] = {"properties": {"mig_profile": {"type": "string"}}, "required": ["mig_profile"]}
_A_FRACTION: dict[str, Any] = {"properties": {"gpu_fraction": {"type": "number"}}, "required": ["gpu_fraction"]}
MigProfile = Annotated[
    str, Field(max_length=20, pattern=MIG_PROFILE_PATTERN), matching("is not a MIG profile like 3g.40gb")
]


class PodSetSpec(Strict):
    model_config = ConfigDict(
        json_schema_extra={
            "not": {
                "anyOf": [
                    {"allOf": [_WHOLE_GPUS, _A_MIG_PROFILE]},
                    {"allOf": [_WHOLE_GPUS, _A_FRACTION]},
                    {"allOf": [_A_MIG_PROFILE, _A_FRACTION]},
                ]
            },
            **rules(min_replicas_within_replicas="`min_replicas` is at most `replicas`"),
        }
    )

    name: Name = "workers"
    replicas: int = Field(default=1, ge=1, le=MAX_PODS_PER_GANG)
    gpus: int = Field(default=0, ge=0, le=64, description="whole GPUs per pod; not with mig_profile or gpu_fraction")
    mig_profile: MigProfile | None = Field(default=None, examples=["3g.40gb"])
    gpu_fraction: float | None = Field(default=None, gt=0, lt=1, description="share of one GPU (MPS or time-slicing)")
    cpu_millis: int = Field(default=1000, ge=1, le=1_000_000)
    memory_mib: int = Field(default=4096, ge=1, le=10_000_000)
    gpu_models: list[str] = Field(default_factory=list, max_length=20)
    min_replicas: int | None = Field(
        default=None,
        ge=1,
        le=MAX_PODS_PER_GANG,
        description="the gang may start with as few as this many of the replicas (1 to replicas), the most "
        "that fit being admitted; the counts are fixed for the run. Default: all replicas are required",
    )

    def to_pod_set(self) -> PodSet:
        return PodSet(
            name=self.name,
            replicas=self.replicas,
            gpus=self.gpus,
            mig_profile=self.mig_profile,
            gpu_fraction=self.gpu_fraction,
            cpu_millis=self.cpu_millis,
            memory_mib=self.memory_mib,
            gpu_models=tuple(self.gpu_models),
            min_replicas=self.min_replicas,
        )

    @property
    def least(self) -> int:
        return self.replicas if self.min_replicas is None else self.min_replicas

    @model_validator(mode="after")
    def _one_gpu_request(self) -> PodSetSpec:
        if self.min_replicas is not None and self.min_replicas > self.replicas:
            raise ValueError(
                f"pod set {self.name}: min_replicas {self.min_replicas} is more than its {self.replicas} replicas"
            )
        asked = [self.gpus > 0, self.mig_profile is not None, self.gpu_fraction is not None]
        if sum(asked) > 1:
            raise ValueError("a pod set asks for whole GPUs, a MIG profile or a GPU fraction, not several")
        return self


class SubmitWorkload(Strict):
    model_config = ConfigDict(
        json_schema_extra={
            # `serving` is for inference workloads only (`kind` defaults to training)
            "if": {"not": {"properties": {"kind": {"const": WorkloadKind.INFERENCE.value}}, "required": ["kind"]}},
            "then": {"properties": {"serving": {"type": "null"}}},
            **rules(
                gang_pods=f"a gang has at most {MAX_PODS_PER_GANG} pods over all its pod sets (the sum of replicas)",
                unique_pod_set_names="pod set names are unique within a workload",
                min_available_within_pods="`min_available` is at most the gang's pods (the sum of replicas)",
                min_available_matches_minimums="with pod sets' `min_replicas`, a `min_available` given is their sum "
                "(`replicas` for a pod set without one)",
                container_bytes=f"`container` is at most {MAX_CONTAINER_BYTES} characters as compact JSON with "
                "non-ASCII characters escaped (`\\uXXXX`)",
            ),
        }
    )

    name: Name
    queue: Name
    priority_class: Name | None = None
    kind: WorkloadKind = Field(default=WorkloadKind.TRAINING, strict=False)  # strict takes only enum members
    pod_sets: list[PodSetSpec] = Field(
        min_length=1,
        max_length=MAX_POD_SETS,
        description="at least one asks for GPUs (gpus, mig_profile or gpu_fraction)",
        json_schema_extra={"contains": {"anyOf": [_WHOLE_GPUS, _A_MIG_PROFILE, _A_FRACTION]}},
    )
    min_available: int | None = Field(default=None, ge=1, description="gang threshold; default all pods")
    requires_isolation: bool | None = Field(
        default=None, description="never place on time-sliced GPUs; default true for inference"
    )
    tolerations: list[TolerationSpec] = Field(default_factory=list, max_length=MAX_TOLERATIONS)
    duration_seconds: float | None = Field(
        default=None, gt=0, le=30 * 86400, description="read by simulated clusters only"
    )
    max_runtime_seconds: float | None = Field(
        default=None, gt=0, le=90 * 86400, description="declared upper bound; lets a gang backfill before a reservation"
    )
    spot: Literal["allow", "prefer", "avoid", "never"] = Field(
        default="allow", description="spot pools: allow, prefer, avoid (only if nothing else fits) or never"
    )
    same_pool: Literal["preferred", "required"] = Field(
        default="preferred", description="required: all pods in one node pool, or not at all"
    )
    labels: WorkloadLabels = Field(default_factory=dict, max_length=MAX_LABELS)
    container: dict[str, Any] = Field(
        default_factory=dict,
        json_schema_extra={"properties": {"env": {"maxItems": MAX_ENV_VARS, "maxProperties": MAX_ENV_VARS}}},
        description=f"passed to Kubernetes (image, command, args, env...); at most {MAX_CONTAINER_BYTES} bytes as "
        f"JSON and {MAX_ENV_VARS} env entries",
    )
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=100)
    serving: ServingSpec | None = Field(
        default=None, description="inference only: where the server's Prometheus metrics tell its traffic and latency"
    )

    def serving_declaration(self) -> dict[str, Any] | None:
        """The `serving` block as stored with the workload (None without one)."""
        return None if self.serving is None else self.serving.model_dump(mode="json")

    @field_validator("pod_sets")
    @classmethod
    def _unique_pod_set_names(cls, pod_sets: list[PodSetSpec]) -> list[PodSetSpec]:
        names = [p.name for p in pod_sets]
        if len(names) != len(set(names)):
            raise ValueError("pod set names must be unique within a workload")
        return pod_sets

    @field_validator("labels")
    @classmethod
    def _labels_are_kubernetes_labels(cls, labels: dict[str, str]) -> dict[str, str]:
        return check_labels(labels, reserved=reserved_label)

    @field_validator("container")
    @classmethod
    def _container_is_bounded(cls, container: dict[str, Any]) -> dict[str, Any]:
        size = len(json.dumps(container, separators=(",", ":"), allow_nan=False, default=str))
        if size > MAX_CONTAINER_BYTES:
            raise ValueError(f"container is {size} bytes as JSON; at most {MAX_CONTAINER_BYTES}")
        env = container.get("env")
        if isinstance(env, (list, dict)) and len(env) > MAX_ENV_VARS:
            raise ValueError(f"container.env has {len(env)} entries; at most {MAX_ENV_VARS}")
        return container

    @model_validator(mode="after")
    def _gang_is_consistent(self) -> SubmitWorkload:
        total = sum(p.replicas for p in self.pod_sets)
        if total > MAX_PODS_PER_GANG:
            raise ValueError(f"a gang has at most {MAX_PODS_PER_GANG} pods in all its pod sets, not {total}")
        if self.min_available is not None and self.min_available > total:
            raise ValueError(f"min_available {self.min_available} is more than the {total} pods of the gang")
        check_minimums(self.pod_sets, self.min_available)
        if self.serving is not None and self.kind is not WorkloadKind.INFERENCE:
            raise ValueError(f"serving is for inference workloads only, not {self.kind.value}")
        if not any(p.gpus or p.mig_profile or p.gpu_fraction for p in self.pod_sets):
            raise ValueError("a workload must request at least one GPU (gpus, mig_profile or gpu_fraction)")
        return self


def gang_minimum(pod_sets: list[PodSetSpec], min_available: int | None) -> int:
    """The gang's `min_available`: as given, else with pod-set minimums their sum, else all pods."""
    if min_available is not None:
        return min_available
    return sum(p.least for p in pod_sets)


def check_minimums(pod_sets: list[PodSetSpec], min_available: int | None) -> None:
    """Pod-set minimums and `min_available` are two ways to say how small the gang may start: with
    minimums, the gang's threshold is their sum, so a `min_available` given too must be that sum."""
    if min_available is None or all(p.min_replicas is None for p in pod_sets):
        return
    least = sum(p.least for p in pod_sets)
    if min_available != least:
        raise ValueError(
            f"min_available {min_available} disagrees with the pod sets' min_replicas, which let the gang start "
            f"with {least} pods; leave min_available out (it is then {least})"
        )


class CancelWorkload(Strict):
    workload_id: str = Field(min_length=1, max_length=40)
    reason: str = Field(default="cancelled by user", max_length=200)
