"""Validated inputs of the service layer, shared by REST and NATS so both validate alike."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

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
from controlplane.domain.model import NodePool, PodSet, Taint, WorkloadKind, reserved_label
from controlplane.domain.sharing import InvalidSharingMode, SharingMode, mig_compute_slices
from controlplane.service.serving import ServingSpec

NAME_PATTERN = k8s.DNS1123_LABEL_PATTERN
Name = Annotated[str, Field(min_length=1, max_length=63, pattern=NAME_PATTERN)]
# An extended resource name: `<DNS subdomain>/<name>` outside the kubernetes.io and requests. namespaces.
EXTENDED_RESOURCE = re.compile(
    r"^(?!(?:[^/]*\.)?kubernetes\.io/)(?!requests\.)"
    r"(?=[^/]{1,253}/)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
    r"/(?=.{1,63}$)[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
QuotaAmount = Annotated[float, Field(ge=0, le=MAX_QUOTA_AMOUNT, allow_inf_nan=False)]
QuotaMap = Annotated[
    dict[Annotated[str, Field(min_length=1, max_length=40)], QuotaAmount], Field(max_length=MAX_QUOTA_KEYS)
]
Price = Annotated[float, Field(ge=0, le=MAX_PRICE_PER_GPU_HOUR, allow_inf_nan=False)]


class Strict(BaseModel):
    """Inputs are taken as their schema says, never coerced: `true` is no number, `"5"` no integer,
    `" a"` no name (the published OpenAPI must describe exactly what is accepted). No NaN or
    infinities in any float field of any request (REST or NATS): they break quota arithmetic and
    JSON columns, and no quantity gpufleet takes can be infinite."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


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
    key: str = Field(min_length=1, max_length=317)
    value: str = Field(default="", max_length=63)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"

    @model_validator(mode="after")
    def _kubernetes_syntax(self) -> TaintSpec:
        _refuse(k8s.taint_errors(self.key, self.value, self.effect), f"taint {self.key[:80]!r}")
        return self


class TolerationSpec(Strict):
    key: str = Field(min_length=1, max_length=317, description="[prefix/]name, as a Kubernetes label key")
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str = Field(default="", max_length=63)
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = ""

    @model_validator(mode="after")
    def _kubernetes_syntax(self) -> TolerationSpec:
        errors = k8s.toleration_errors(self.key, self.operator, self.value, self.effect)
        _refuse(errors, f"toleration {self.key[:80]!r}")
        return self


class PoolSpec(Strict):
    name: Name
    gpu_model: str = Field(min_length=1, max_length=40, examples=["H100-80GB"])
    gpus_per_node: int = Field(ge=1, le=64)
    cpu_millis: int = Field(ge=1000, le=10_000_000)
    memory_mib: int = Field(ge=1024, le=100_000_000)
    sharing: str = Field(default="exclusive", examples=["exclusive", "mig:all-balanced", "timeslice:4"])
    taints: list[TaintSpec] = Field(default_factory=list, max_length=32)
    labels: dict[str, str] = Field(default_factory=dict, max_length=MAX_LABELS)
    price_per_gpu_hour: Price = 0.0
    spot: bool = False
    node_count: int = Field(ge=0, le=20_000)

    def to_pool(self, pool_id: str, cluster_id: str) -> NodePool:
        return NodePool(
            id=pool_id,
            cluster_id=cluster_id,
            name=self.name,
            gpu_model=self.gpu_model,
            gpus_per_node=self.gpus_per_node,
            cpu_millis=self.cpu_millis,
            memory_mib=self.memory_mib,
            sharing=SharingMode.parse(self.sharing),
            taints=tuple(Taint(t.key, t.value, t.effect) for t in self.taints),
            labels=dict(self.labels),
            price_per_gpu_hour=self.price_per_gpu_hour,
            spot=self.spot,
            node_count=self.node_count,
        )

    @field_validator("labels")
    @classmethod
    def _labels_are_kubernetes_labels(cls, labels: dict[str, str]) -> dict[str, str]:
        return check_labels(labels)

    @model_validator(mode="after")
    def _sharing_is_valid(self) -> PoolSpec:
        try:
            SharingMode.parse(self.sharing).mig_slices_per_gpu(self.gpu_model)
        except InvalidSharingMode as exc:
            raise ValueError(str(exc)) from exc
        return self


# Nodes of one cluster, all pools together: one pool may already have this many, and each node is a row
# written on registration and read with the cluster (100 pools at the pool bound would be 2 million).
MAX_CLUSTER_NODES = 20_000


def _pools_fit_one_cluster(pools: list[PoolSpec]) -> list[PoolSpec]:
    names = [p.name for p in pools]
    if len(names) != len(set(names)):
        raise ValueError("pool names must be unique within a cluster")
    if sum(p.node_count for p in pools) > MAX_CLUSTER_NODES:
        raise ValueError(f"a cluster has at most {MAX_CLUSTER_NODES} nodes over all its pools")
    return pools


CLOUD_PROVIDERS = ("eks", "aks", "gke", "oke")
Provider = Literal["sim", "kubernetes", "eks", "aks", "gke", "oke"]


class KubernetesSettingsSpec(Strict):
    """How gpufleet talks to a real cluster's scheduler stack (see adapters.kubernetes.KubeSettings)."""

    namespace: Name = "gpufleet"
    gang: Literal["none", "volcano", "coscheduling", "kueue"] = "none"
    use_jobset: bool = Field(default=False, description="one JobSet per run; always so with gang kueue")
    kueue_queue: Name = "gpufleet"
    # Node inventory: the label that names a node's pool, tried before the providers' own pool labels.
    pool_label_key: str | None = Field(default=None, max_length=317)
    # Resource names; None requests what the pool's nodes advertise (see the README, "Kubernetes settings").
    mig_strategy: Literal["mixed", "single"] | None = None
    gpu_resource: str | None = Field(default=None, max_length=317)
    timeslice_resource: str | None = Field(default=None, max_length=317)
    mps_resource: str | None = Field(default=None, max_length=317)
    # The device plugin's time-slicing `failRequestsGreaterThanOne`: nodes cannot tell it, so say it here.
    fail_requests_greater_than_one: bool = False

    @field_validator("gpu_resource", "timeslice_resource", "mps_resource")
    @classmethod
    def _extended_resource(cls, value: str | None) -> str | None:
        if value is not None and not EXTENDED_RESOURCE.match(value):
            raise ValueError(
                f"{value!r} is not a Kubernetes extended resource name (<domain>/<name>, e.g. nvidia.com/gpu.shared)"
            )
        return value

    @field_validator("pool_label_key")
    @classmethod
    def _label_key(cls, value: str | None) -> str | None:
        if value is not None and k8s.qualified_name_errors(value):
            raise ValueError(f"{value!r} is not a Kubernetes label key")
        return value

    priority_class_map: dict[Name, Annotated[str, Field(min_length=1, max_length=253, pattern=_DNS_SUBDOMAIN)]] = Field(
        default_factory=dict,
        max_length=100,
        description="gpufleet priority class -> an existing PriorityClass of the cluster; a class not listed "
        "becomes `gpufleet-<class>`, which gpufleet creates in the cluster",
    )
    kueue_max_pod_sets: int = Field(
        default=8,
        ge=1,
        le=18,
        description="pod sets Kueue admits per Workload: 8 to v0.17, 10 in v0.18, 18 since v0.19",
    )


class ClusterSpec(Strict):
    name: Name
    provider: Provider = Field(
        default="sim",
        description="sim: simulated; kubernetes: any cluster, reached with `kubeconfig`, its pools and nodes "
        "read from its Kubernetes API; eks|aks|gke|oke: discovered from the cloud and the cluster's nodes "
        "(pools never come from the request)",
    )
    region: str = Field(default="", max_length=63)
    pools: list[PoolSpec] = Field(default_factory=list, max_length=100)
    account: str = Field(
        default="", max_length=255, description="AWS account / Azure subscription / GCP project / OCI compartment"
    )
    cluster: str = Field(default="", max_length=253, description="the cloud's name for the cluster")
    resource_group: str = Field(default="", max_length=90, description="AKS only")
    cluster_id: str = Field(default="", max_length=255, description="OKE only: the cluster OCID")
    kubernetes: KubernetesSettingsSpec = Field(default_factory=KubernetesSettingsSpec)
    kubeconfig: str | None = Field(
        default=None,
        max_length=256 * 1024,
        description="provider kubernetes only: inline credentials (no exec, auth-provider or file references); "
        "stored in a 0600 file of the state dir, never in the database",
    )
    pool_prices: dict[Name, Price] = Field(
        default_factory=dict,
        description="real clusters: price per GPU-hour by pool name (neither nodes nor discovery have one)",
    )

    @field_validator("pools")
    @classmethod
    def _pools_fit(cls, pools: list[PoolSpec]) -> list[PoolSpec]:
        return _pools_fit_one_cluster(pools)

    @model_validator(mode="after")
    def _fields_fit_the_provider(self) -> ClusterSpec:
        cloud = self.provider in CLOUD_PROVIDERS
        if cloud:
            if self.pools:
                raise ValueError(f"{self.provider} pools are discovered from the cloud; do not list them")
            if not self.cluster or not self.region:
                raise ValueError(f"provider {self.provider} needs `cluster` and `region`")
            if self.provider != "oke" and not self.account and self.provider != "eks":
                raise ValueError(f"provider {self.provider} needs `account`")
            if self.provider == "oke" and not (self.account or self.cluster_id):
                raise ValueError("provider oke needs `account` (the compartment) or `cluster_id`")
        else:
            if self.provider == "kubernetes" and self.pools:
                raise ValueError("kubernetes pools and nodes are discovered from the cluster's nodes; do not list them")
            if self.provider == "sim" and not self.pools:
                raise ValueError("provider sim needs at least one pool")
            locator = [f for f in ("account", "cluster", "resource_group", "cluster_id") if getattr(self, f)]
            if self.provider == "sim" and self.pool_prices:
                locator.append("pool_prices")
            if locator:
                raise ValueError(f"{', '.join(locator)}: only for cloud providers")
        if self.resource_group and self.provider != "aks":
            raise ValueError("resource_group is for aks only")
        if self.cluster_id and self.provider != "oke":
            raise ValueError("cluster_id is for oke only")
        if (self.kubeconfig is not None) != (self.provider == "kubernetes"):
            raise ValueError("provider kubernetes needs `kubeconfig`, and only it takes one")
        return self


class ClusterUpdate(Strict):
    region: str | None = Field(default=None, max_length=63)
    pools: list[PoolSpec] | None = Field(default=None, min_length=1, max_length=100)
    # Real clusters: the fields given replace the stored ones; the others stay as they are.
    kubernetes: KubernetesSettingsSpec | None = None

    @field_validator("pools")
    @classmethod
    def _pools_fit(cls, pools: list[PoolSpec] | None) -> list[PoolSpec] | None:
        return None if pools is None else _pools_fit_one_cluster(pools)


class TreeNodeSpec(Strict):
    name: Name
    guaranteed: QuotaMap = Field(default_factory=dict, description="per GPU model and/or 'gpu-eq'")
    limit: QuotaMap = Field(default_factory=dict, description="never above; missing key = unbounded")
    weight: float = Field(default=1.0, gt=0, le=1000)
    borrowing_limit: QuotaMap = Field(default_factory=dict, description="most it may use above its guarantee")
    lending_limit: QuotaMap = Field(default_factory=dict, description="most of its unused guarantee it lends")


class CohortSpec(TreeNodeSpec):
    pass


class TeamSpec(TreeNodeSpec):
    cohort: Name | None = None


class QueueSpec(TreeNodeSpec):
    team: Name


class QuotaUpdate(Strict):
    guaranteed: QuotaMap | None = None
    limit: QuotaMap | None = None
    weight: float | None = Field(default=None, gt=0, le=1000)
    borrowing_limit: QuotaMap | None = None
    lending_limit: QuotaMap | None = None


class PriorityClassSpec(Strict):
    name: Name
    value: int = Field(ge=-1_000_000, le=1_000_000)
    preemptible: bool = True
    min_runtime_seconds: int = Field(default=0, ge=0, le=30 * 86400)
    is_default: bool = False


class TokenSpec(Strict):
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


class PodSetSpec(Strict):
    name: Name = "workers"
    replicas: int = Field(default=1, ge=1, le=MAX_PODS_PER_GANG)
    gpus: int = Field(default=0, ge=0, le=64, description="whole GPUs per pod")
    mig_profile: str | None = Field(default=None, max_length=20, examples=["3g.40gb"])
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
        if self.mig_profile is not None:
            try:
                mig_compute_slices(self.mig_profile)
            except InvalidSharingMode as exc:
                raise ValueError(str(exc)) from exc
        return self


class SubmitWorkload(Strict):
    name: Name
    queue: Name
    priority_class: Name | None = None
    kind: WorkloadKind = Field(default=WorkloadKind.TRAINING, strict=False)  # strict takes only enum members
    pod_sets: list[PodSetSpec] = Field(min_length=1, max_length=MAX_POD_SETS)
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
    labels: dict[str, str] = Field(default_factory=dict, max_length=MAX_LABELS)
    container: dict[str, Any] = Field(
        default_factory=dict,
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
