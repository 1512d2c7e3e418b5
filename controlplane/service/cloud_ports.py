"""What the service layer needs from a managed-Kubernetes cloud, as plain values and one small protocol.

The adapters under `adapters/clouds` implement `CloudProvider` with the real SDKs; nothing here may import
one, so the service layer stays testable without any cloud library installed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn, Protocol, runtime_checkable

import yaml

from controlplane.domain.model import Taint
from controlplane.service.cluster_specs import PoolSpec

PROVIDERS = ("eks", "aks", "gke", "oke")

# A kubeconfig is a few KiB; anything far larger is either a mistake or an attempt to make the YAML parser
# (aliases expand in memory) do a lot of work on our behalf.
MAX_KUBECONFIG_BYTES = 256 * 1024


class CloudError(Exception):
    """A cloud call failed or returned something gpufleet cannot use."""


class ClusterNotFound(CloudError):
    pass


class PoolNotFound(CloudError):
    pass


class ScaleRefused(CloudError):
    """The requested size is outside what the pool allows; nothing was sent to the cloud."""


class UnmappablePool(ValueError):
    """A discovered pool that cannot become a gpufleet `PoolSpec` (no GPUs, unknown shape, ...)."""


class UnsafeKubeconfig(ValueError):
    """A kubeconfig gpufleet refuses: it would run programs or read files on the control plane's host."""


@dataclass(frozen=True)
class ClusterLocator:
    """Where one managed cluster lives.

    `account` is the AWS account id, Azure subscription id, GCP project id or OCI compartment OCID;
    `region` the AWS region, Azure location, GCP location (region or zone) or OCI region.
    """

    provider: str
    account: str
    region: str
    cluster: str
    resource_group: str = ""  # AKS only; looked up from the cluster's ARM id when empty
    cluster_id: str = ""  # OKE only (the cluster OCID); looked up by name when empty

    def __post_init__(self) -> None:
        if self.provider not in PROVIDERS:
            raise ValueError(f"provider '{self.provider}' is not one of {', '.join(PROVIDERS)}")
        if not self.cluster:
            raise ValueError("a cluster locator needs the cluster name")


@dataclass(frozen=True)
class DiscoveredPool:
    """One node pool as the cloud describes it, in gpufleet's units.

    `gpu_model` is gpufleet's model name (`H100-80GB`, `L4`, ...) and empty for pools without GPUs or
    whose instance type is not in the adapter's table; `issues` says why a pool should not be trusted
    as-is. `cpu_millis` and `memory_mib` are the instance's capacity, not the node's allocatable.
    `min_size`/`max_size` are whole-pool bounds; `max_size` is None when the cloud states none.
    """

    name: str
    gpu_model: str
    gpus_per_node: int
    instance_type: str
    sharing: str
    cpu_millis: int
    memory_mib: int
    taints: tuple[Taint, ...]
    labels: Mapping[str, str]
    node_count: int
    min_size: int
    max_size: int | None
    spot: bool
    autoscaling: bool = False
    status: str = ""
    pool_id: str = ""  # the cloud's own id when it differs from the name (OKE node pool OCID)
    issues: tuple[str, ...] = ()


@dataclass(frozen=True)
class DiscoveredCluster:
    """A cluster and its pools. `ca_data` is base64 PEM as in a kubeconfig; AKS and OKE hand it out only
    with credentials, so discovery leaves it empty there."""

    name: str
    endpoint: str
    ca_data: str
    version: str
    status: str
    pools: tuple[DiscoveredPool, ...]


@dataclass(frozen=True)
class KubeAccess:
    """Short-lived access to a cluster's API server. Held in memory only: it refuses to be pickled,
    and the token stays out of `repr` so it cannot leak into logs."""

    host: str
    token: str = field(repr=False)
    ca_data: str
    expires_at: datetime

    def expires_within(self, margin: timedelta, now: datetime | None = None) -> bool:
        return (now or datetime.now(UTC)) + margin >= self.expires_at

    def __reduce__(self) -> NoReturn:
        raise TypeError("KubeAccess holds a bearer token and is never serialised")


@dataclass(frozen=True)
class ScaleResult:
    """What `scale_pool` did. `changed` is False when the pool already had `desired` nodes and no cloud
    call was made; `clamped` when `requested` was above the pool's maximum. `operation` is the cloud's
    handle to poll (EKS update id, GKE operation name, OKE work request id); empty when none."""

    pool: str
    previous: int
    requested: int
    desired: int
    changed: bool
    clamped: bool
    operation: str = ""


@runtime_checkable
class CloudProvider(Protocol):
    """One managed-Kubernetes cloud. Calls block; run them off the event loop."""

    provider: str

    def list_clusters(self, account: str, region: str) -> list[ClusterLocator]: ...

    def discover(self, locator: ClusterLocator) -> DiscoveredCluster: ...

    def credentials(self, locator: ClusterLocator) -> KubeAccess: ...

    def scale_pool(self, locator: ClusterLocator, pool: str, desired: int) -> ScaleResult: ...


@runtime_checkable
class SupportsAutoscalingBounds(Protocol):
    """Optional: the cloud keeps min/max bounds on a pool that gpufleet may change (not OKE, whose
    bounds live in the Cluster Autoscaler add-on's configuration)."""

    def set_autoscaling_bounds(self, locator: ClusterLocator, pool: str, min_size: int, max_size: int) -> None: ...


def autoscaling_bounds(provider: CloudProvider) -> SupportsAutoscalingBounds | None:
    """The provider's autoscaling-bounds capability, or None when its cloud has none."""
    return provider if isinstance(provider, SupportsAutoscalingBounds) else None


def plan_scale(pool: DiscoveredPool, requested: int) -> ScaleResult:
    """The size to ask the cloud for: above the maximum is clamped to it; below the minimum is refused,
    because the cloud would reject it (EKS) or its autoscaler would undo it, and silently scaling to the
    minimum instead would buy nodes nobody asked for."""
    if requested < 0:
        raise ScaleRefused(f"pool {pool.name}: a size cannot be negative ({requested})")
    if requested < pool.min_size:
        raise ScaleRefused(f"pool {pool.name}: {requested} nodes is below its minimum of {pool.min_size}")
    desired = requested
    if pool.max_size is not None and requested > pool.max_size:
        desired = pool.max_size
    return ScaleResult(
        pool=pool.name,
        previous=pool.node_count,
        requested=requested,
        desired=desired,
        changed=desired != pool.node_count,
        clamped=desired != requested,
    )


def with_operation(result: ScaleResult, operation: str) -> ScaleResult:
    return replace(result, operation=operation)


def validate_autoscaling_bounds(pool: str, min_size: int, max_size: int) -> None:
    if min_size < 0 or max_size < 1 or min_size > max_size:
        raise ScaleRefused(f"pool {pool}: bounds need 0 <= min <= max and max >= 1, got {min_size}..{max_size}")


def to_pool_spec(pool: DiscoveredPool) -> PoolSpec:
    """The gpufleet pool a discovered cloud pool becomes; raises `UnmappablePool` with the reason.

    Prices are not discovered (cloud price lists are not part of these APIs), so `price_per_gpu_hour`
    stays 0 for the operator to set.
    """
    if pool.issues:
        raise UnmappablePool(f"pool {pool.name}: {'; '.join(pool.issues)}")
    if not pool.gpu_model or pool.gpus_per_node < 1:
        raise UnmappablePool(f"pool {pool.name} has no GPUs gpufleet knows of ({pool.instance_type})")
    try:
        return PoolSpec.model_validate(
            {
                "name": pool.name,
                "gpu_model": pool.gpu_model,
                "gpus_per_node": pool.gpus_per_node,
                "cpu_millis": pool.cpu_millis,
                "memory_mib": pool.memory_mib,
                "sharing": pool.sharing,
                "taints": [{"key": t.key, "value": t.value, "effect": t.effect} for t in pool.taints],
                "labels": dict(pool.labels),
                "spot": pool.spot,
                "node_count": pool.node_count,
            }
        )
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise UnmappablePool(f"pool {pool.name}: {exc}") from exc


# Kubeconfig fields that make a client run a program or read a local file. From API input these would let
# a caller execute commands on, or read files from, the control plane's host.
_USER_FORBIDDEN = ("exec", "auth-provider", "tokenFile", "client-certificate", "client-key", "username", "password")
_CLUSTER_FORBIDDEN = ("certificate-authority",)


def validate_user_kubeconfig(text: str) -> dict[str, Any]:
    """Parse a kubeconfig received through the API and refuse anything but inline credentials.

    Users with `exec` or `auth-provider` are rejected (they run plugins on our host), and so are file
    references (`tokenFile`, `client-certificate`, `client-key`, cluster `certificate-authority`), which
    would read files from our host, and basic auth, which Kubernetes removed in 1.19.
    Returns the parsed document.
    """
    if len(text.encode()) > MAX_KUBECONFIG_BYTES:
        raise UnsafeKubeconfig(f"kubeconfig larger than {MAX_KUBECONFIG_BYTES} bytes")
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UnsafeKubeconfig(f"kubeconfig is not valid YAML: {exc}") from exc
    if not isinstance(document, dict) or document.get("kind", "Config") != "Config":
        raise UnsafeKubeconfig("kubeconfig must be a mapping of kind Config")
    # `users:` with no value parses as None; anything else that is not a list is malformed.
    users = document.get("users") if document.get("users") is not None else []
    clusters = document.get("clusters") if document.get("clusters") is not None else []
    if not isinstance(users, list) or not isinstance(clusters, list):
        raise UnsafeKubeconfig("kubeconfig users and clusters must be lists")
    if not clusters:
        raise UnsafeKubeconfig("kubeconfig names no cluster")
    for entry in users:
        name, user = _named(entry, "user")
        for key in _USER_FORBIDDEN:
            if key in user:
                raise UnsafeKubeconfig(f"kubeconfig user '{name}' uses '{key}', which gpufleet does not accept")
    for entry in clusters:
        name, cluster = _named(entry, "cluster")
        if not isinstance(cluster.get("server"), str) or not cluster["server"].startswith("https://"):
            raise UnsafeKubeconfig(f"kubeconfig cluster '{name}' needs an https:// server")
        for key in _CLUSTER_FORBIDDEN:
            if key in cluster:
                raise UnsafeKubeconfig(f"kubeconfig cluster '{name}' reads '{key}' from a file; inline it as -data")
    return document


def _named(entry: object, kind: str) -> tuple[str, dict[str, Any]]:
    if not isinstance(entry, dict):
        raise UnsafeKubeconfig(f"kubeconfig {kind}s must be mappings")
    body = entry.get(kind) or {}
    if not isinstance(body, dict):
        raise UnsafeKubeconfig(f"kubeconfig {kind} '{entry.get('name', '')}' must be a mapping")
    return str(entry.get("name", "")), body
