"""Validated inputs that describe the fleet: a cluster, its pools and its Kubernetes settings.

Each rule a model enforces is in the schema it publishes (see `constraints`): patterns and ranges
as such, the rules across fields of a provider or a pool as `if`/`then`, and what JSON Schema cannot
say (unique pool names, a sum of nodes, a kubeconfig's content, a MIG layout's fit) under `x-rules`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from controlplane.domain import kubernetes_syntax as k8s
from controlplane.domain.limits import MAX_LABELS
from controlplane.domain.model import NodePool, Taint
from controlplane.domain.sharing import MIG_PROFILES, InvalidSharingMode, SharingMode, sharing_pattern
from controlplane.service.commands import LabelKey, Name, PoolLabels, Price, TaintSpec, check_labels
from controlplane.service.constraints import Also, KeysMatch, Strict, matching, rules

SHARING_SENTENCE = "must be exclusive, mig:<layout> (e.g. mig:all-balanced), mps:<n> or timeslice:<n> with n from 2"
_MIG_MODELS = sorted(MIG_PROFILES)
# Per MIG-capable model, the layouts made of its own profiles; any other model takes no MIG layout.
_SHARING_FITS_THE_MODEL: list[Any] = [
    {
        "if": {"properties": {"sharing": {"pattern": "^mig:"}}, "required": ["sharing"]},
        "then": {"properties": {"gpu_model": {"enum": _MIG_MODELS}}},
    },
    *(
        {
            "if": {"properties": {"gpu_model": {"const": model}}},
            "then": {"properties": {"sharing": {"pattern": sharing_pattern(profiles)}}},
        }
        for model, profiles in sorted(MIG_PROFILES.items())
    ),
]


class PoolSpec(Strict):
    model_config = ConfigDict(
        json_schema_extra={
            "allOf": _SHARING_FITS_THE_MODEL,
            **rules(
                mig_layout_fits="a MIG layout fits one GPU of the pool's model: at most 7 compute slices, 8 memory "
                "slices and, per profile, the number of instances the model allows (NVIDIA's MIG user guide)",
            ),
        }
    )

    name: Name
    gpu_model: str = Field(min_length=1, max_length=40, examples=["H100-80GB"])
    gpus_per_node: int = Field(ge=1, le=64)
    cpu_millis: int = Field(ge=1000, le=10_000_000)
    memory_mib: int = Field(ge=1024, le=100_000_000)
    sharing: Annotated[str, Field(pattern=sharing_pattern()), matching(SHARING_SENTENCE)] = Field(
        default="exclusive",
        max_length=200,
        examples=["exclusive", "mig:all-balanced", "timeslice:4"],
        description="MIG layouts only on MIG-capable models (" + ", ".join(_MIG_MODELS) + "), of their profiles",
    )
    taints: list[TaintSpec] = Field(default_factory=list, max_length=32)
    labels: PoolLabels = Field(default_factory=dict, max_length=MAX_LABELS)
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
_POOLS_RULES = rules(
    unique_pool_names="pool names are unique within a cluster",
    cluster_nodes=f"a cluster has at most {MAX_CLUSTER_NODES} nodes over all its pools (the sum of node_count)",
)


def _pools_fit_one_cluster(pools: list[PoolSpec]) -> list[PoolSpec]:
    names = [p.name for p in pools]
    if len(names) != len(set(names)):
        raise ValueError("pool names must be unique within a cluster")
    if sum(p.node_count for p in pools) > MAX_CLUSTER_NODES:
        raise ValueError(f"a cluster has at most {MAX_CLUSTER_NODES} nodes over all its pools")
    return pools


CLOUD_PROVIDERS = ("eks", "aks", "gke", "oke")
Provider = Literal["sim", "kubernetes", "eks", "aks", "gke", "oke"]
_EXTENDED_RESOURCE_SCHEMA = {
    "pattern": k8s.EXTENDED_RESOURCE_PATTERN,
    "allOf": [{"pattern": k8s.PREFIX_LENGTH_PATTERN}],
    "not": {"pattern": k8s.RESERVED_RESOURCE_PATTERN},
}
ExtendedResource = Annotated[str, Field(max_length=k8s.QUALIFIED_KEY_MAX), Also(_EXTENDED_RESOURCE_SCHEMA)]
DnsSubdomain = Annotated[
    str,
    Field(min_length=1, max_length=k8s.DNS1123_SUBDOMAIN_MAX, pattern=k8s.DNS1123_SUBDOMAIN_PATTERN),
    matching("must be lower-case DNS labels separated by '.'"),
]


class KubernetesSettingsSpec(Strict):
    """How gpufleet talks to a real cluster's scheduler stack (see adapters.kubernetes.KubeSettings)."""

    namespace: Name = "gpufleet"
    gang: Literal["none", "volcano", "coscheduling", "kueue"] = "none"
    use_jobset: bool = Field(default=False, description="one JobSet per run; always so with gang kueue")
    kueue_queue: Name = "gpufleet"
    # Node inventory: the label that names a node's pool, tried before the providers' own pool labels.
    pool_label_key: LabelKey | None = None
    # Resource names; None requests what the pool's nodes advertise (see the README, "Kubernetes settings").
    mig_strategy: Literal["mixed", "single"] | None = None
    gpu_resource: ExtendedResource | None = None
    timeslice_resource: ExtendedResource | None = None
    mps_resource: ExtendedResource | None = None
    # The device plugin's time-slicing `failRequestsGreaterThanOne`: nodes cannot tell it, so say it here.
    fail_requests_greater_than_one: bool = False

    @field_validator("gpu_resource", "timeslice_resource", "mps_resource")
    @classmethod
    def _extended_resource(cls, value: str | None) -> str | None:
        if value is not None and not k8s.is_extended_resource(value):
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

    priority_class_map: Annotated[dict[Name, DnsSubdomain], KeysMatch()] = Field(
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


def _when(providers: tuple[str, ...], then: dict[str, Any]) -> dict[str, Any]:
    """`then` applies to a cluster of one of `providers` (`sim`, the default, also when none is given)."""
    condition: dict[str, Any] = {"properties": {"provider": {"enum": list(providers)}}}
    if "sim" not in providers:
        condition["required"] = ["provider"]
    return {"if": condition, "then": then}


_EMPTY = {"maxLength": 0}
_SET = {"type": "string", "minLength": 1}
# The fields each provider needs and refuses, as `ClusterSpec._fields_fit_the_provider` checks them.
_PROVIDER_FIELDS: list[Any] = [
    _when(CLOUD_PROVIDERS, {"properties": {"pools": {"maxItems": 0}, "cluster": _SET, "region": _SET}}),
    _when(CLOUD_PROVIDERS, {"required": ["cluster", "region"]}),
    _when(("aks", "gke"), {"properties": {"account": _SET}, "required": ["account"]}),
    _when(
        ("oke",),
        {
            "anyOf": [
                {"properties": {"account": _SET}, "required": ["account"]},
                {"properties": {"cluster_id": _SET}, "required": ["cluster_id"]},
            ]
        },
    ),
    _when(("sim", "kubernetes"), {"properties": dict.fromkeys(("account", "cluster", "cluster_id"), _EMPTY)}),
    _when(("sim", "kubernetes", "eks", "gke", "oke"), {"properties": {"resource_group": _EMPTY}}),
    _when(("eks", "aks", "gke"), {"properties": {"cluster_id": _EMPTY}}),
    _when(("sim",), {"properties": {"pools": {"minItems": 1}, "pool_prices": {"maxProperties": 0}}}),
    _when(("sim",), {"required": ["pools"]}),
    _when(("kubernetes",), {"properties": {"pools": {"maxItems": 0}, "kubeconfig": {"type": "string"}}}),
    _when(("kubernetes",), {"required": ["kubeconfig"]}),
    _when(("sim", *CLOUD_PROVIDERS), {"properties": {"kubeconfig": {"type": "null"}}}),
]


class ClusterSpec(Strict):
    model_config = ConfigDict(
        json_schema_extra={
            "allOf": _PROVIDER_FIELDS,
            **rules(
                **_POOLS_RULES["x-rules"],
                kubeconfig="`kubeconfig` is a YAML kubeconfig of kind Config naming at least one cluster, each "
                "with an https:// server; its users hold inline credentials only (no exec, auth-provider, "
                "tokenFile, client-certificate, client-key, username or password; no certificate-authority file)",
            ),
        }
    )

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
    pool_prices: Annotated[dict[Name, Price], KeysMatch()] = Field(
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
    model_config = ConfigDict(json_schema_extra=_POOLS_RULES)

    region: str | None = Field(default=None, max_length=63)
    pools: list[PoolSpec] | None = Field(default=None, min_length=1, max_length=100)
    # Real clusters: the fields given replace the stored ones; the others stay as they are.
    kubernetes: KubernetesSettingsSpec | None = None

    @field_validator("pools")
    @classmethod
    def _pools_fit(cls, pools: list[PoolSpec] | None) -> list[PoolSpec] | None:
        return None if pools is None else _pools_fit_one_cluster(pools)
