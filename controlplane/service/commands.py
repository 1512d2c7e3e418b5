"""Validated inputs of the service layer, shared by REST and NATS so both validate alike."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from controlplane.domain.model import NodePool, PodSet, Taint, WorkloadKind
from controlplane.domain.sharing import InvalidSharingMode, SharingMode, mig_compute_slices

NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
Name = Annotated[str, Field(min_length=1, max_length=63, pattern=NAME_PATTERN)]
LABEL_KEY = re.compile(r"^([a-z0-9.-]{1,253}/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
RESERVED_LABEL_PREFIX = "gpufleet.io/"
QuotaMap = dict[Annotated[str, Field(min_length=1, max_length=40)], Annotated[float, Field(ge=0)]]


class Strict(BaseModel):
    """Inputs are taken as their schema says, never coerced: `true` is no number, `"5"` no integer,
    `" a"` no name (the published OpenAPI must describe exactly what is accepted)."""

    model_config = ConfigDict(extra="forbid", strict=True)


class TaintSpec(Strict):
    key: str = Field(min_length=1, max_length=253)
    value: str = Field(default="", max_length=63)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"


class TolerationSpec(Strict):
    key: str = Field(min_length=1, max_length=253)
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str = Field(default="", max_length=63)
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = ""


class PoolSpec(Strict):
    name: Name
    gpu_model: str = Field(min_length=1, max_length=40, examples=["H100-80GB"])
    gpus_per_node: int = Field(ge=1, le=64)
    cpu_millis: int = Field(ge=1000, le=10_000_000)
    memory_mib: int = Field(ge=1024, le=100_000_000)
    sharing: str = Field(default="exclusive", examples=["exclusive", "mig:all-balanced", "timeslice:4"])
    taints: list[TaintSpec] = Field(default_factory=list, max_length=32)
    labels: dict[str, str] = Field(default_factory=dict)
    price_per_gpu_hour: float = Field(default=0.0, ge=0)
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
    use_jobset: bool = False
    kueue_queue: Name = "gpufleet"


class ClusterSpec(Strict):
    name: Name
    provider: Provider = Field(
        default="sim",
        description="sim: simulated; kubernetes: any cluster, reached with `kubeconfig`; eks|aks|gke|oke: "
        "discovered from the cloud (pools come from the cloud, not from the request)",
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
    pool_prices: dict[Name, Annotated[float, Field(ge=0)]] = Field(
        default_factory=dict, description="cloud clusters: price per GPU-hour by pool name (discovery has none)"
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
            if not self.pools:
                raise ValueError(f"provider {self.provider} needs at least one pool")
            locator = [f for f in ("account", "cluster", "resource_group", "cluster_id") if getattr(self, f)]
            if locator or self.pool_prices:
                raise ValueError(f"{', '.join(locator or ['pool_prices'])}: only for cloud providers")
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
    team: Name | None = Field(default=None, description="team the token acts for; omit with role admin")
    role: Literal["team", "admin"] = "team"

    @model_validator(mode="after")
    def _team_matches_role(self) -> TokenSpec:
        if self.role == "team" and not self.team:
            raise ValueError("a team token needs 'team'")
        if self.role == "admin" and self.team:
            raise ValueError("an admin token belongs to no team")
        return self


class PodSetSpec(Strict):
    name: Name = "workers"
    replicas: int = Field(default=1, ge=1, le=10_000)
    gpus: int = Field(default=0, ge=0, le=64, description="whole GPUs per pod")
    mig_profile: str | None = Field(default=None, max_length=20, examples=["3g.40gb"])
    gpu_fraction: float | None = Field(default=None, gt=0, lt=1, description="share of one GPU (MPS or time-slicing)")
    cpu_millis: int = Field(default=1000, ge=1, le=1_000_000)
    memory_mib: int = Field(default=4096, ge=1, le=10_000_000)
    gpu_models: list[str] = Field(default_factory=list, max_length=20)

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
        )

    @model_validator(mode="after")
    def _one_gpu_request(self) -> PodSetSpec:
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
    pod_sets: list[PodSetSpec] = Field(min_length=1, max_length=16)
    min_available: int | None = Field(default=None, ge=1, description="gang threshold; default all pods")
    requires_isolation: bool | None = Field(
        default=None, description="never place on time-sliced GPUs; default true for inference"
    )
    tolerations: list[TolerationSpec] = Field(default_factory=list, max_length=32)
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
    labels: dict[str, str] = Field(default_factory=dict)
    container: dict[str, Any] = Field(default_factory=dict, description="opaque, passed to Kubernetes")
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=100)

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
        if len(labels) > 64:
            raise ValueError("at most 64 labels")
        for key, value in labels.items():
            if not LABEL_KEY.match(key) or len(value) > 63:
                raise ValueError(f"label {key!r} is not a valid Kubernetes label")
            if key.startswith(RESERVED_LABEL_PREFIX):
                raise ValueError(f"labels under {RESERVED_LABEL_PREFIX} are set by gpufleet")
        return labels

    @model_validator(mode="after")
    def _gang_is_consistent(self) -> SubmitWorkload:
        total = sum(p.replicas for p in self.pod_sets)
        if self.min_available is not None and self.min_available > total:
            raise ValueError(f"min_available {self.min_available} is more than the {total} pods of the gang")
        if not any(p.gpus or p.mig_profile or p.gpu_fraction for p in self.pod_sets):
            raise ValueError("a workload must request at least one GPU (gpus, mig_profile or gpu_fraction)")
        return self


class CancelWorkload(Strict):
    workload_id: str = Field(min_length=1, max_length=40)
    reason: str = Field(default="cancelled by user", max_length=200)
