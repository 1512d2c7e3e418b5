"""AWS EKS through boto3 (`eks` for clusters and managed node groups, `sts` for the bearer token)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from adapters.clouds.eks.instances import CUSTOM_AMI, GPU_AMI_TYPES, gpu_shape, is_gpu_family
from adapters.clouds.eks.token import TOKEN_LIFETIME, eks_token
from controlplane.domain.model import Taint
from controlplane.service.cloud_ports import (
    CloudError,
    ClusterLocator,
    ClusterNotFound,
    DiscoveredCluster,
    DiscoveredPool,
    KubeAccess,
    PoolNotFound,
    ScaleResult,
    plan_scale,
    validate_autoscaling_bounds,
    with_operation,
)

# (service, region) -> a boto3 client; injected so tests can point the clients at moto.
ClientFactory = Callable[[str, str], Any]

# The EKS API spells taint effects in upper snake case; Kubernetes (and gpufleet) in camel case.
EFFECTS = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}
NODEGROUP_LABEL = "eks.amazonaws.com/nodegroup"  # EKS puts it on every node of a managed node group


class EksProvider:
    provider = "eks"

    def __init__(self, clients: ClientFactory, *, now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self._factory = clients
        self._clients: dict[tuple[str, str], Any] = {}
        self._now = now

    def _client(self, service: str, region: str) -> Any:
        # boto3 clients are thread-safe and costly to build (they load the service model), so keep one each.
        key = (service, region)
        if key not in self._clients:
            self._clients[key] = self._factory(service, region)
        return self._clients[key]

    def list_clusters(self, account: str, region: str) -> list[ClusterLocator]:
        eks = self._client("eks", region)
        with _cloud_errors("list EKS clusters"):
            names = [n for page in eks.get_paginator("list_clusters").paginate() for n in page["clusters"]]
        return [ClusterLocator("eks", account, region, name) for name in sorted(names)]

    def discover(self, locator: ClusterLocator) -> DiscoveredCluster:
        eks = self._client("eks", locator.region)
        cluster = self._describe_cluster(locator)
        with _cloud_errors(f"list node groups of {locator.cluster}"):
            names = [
                n
                for page in eks.get_paginator("list_nodegroups").paginate(clusterName=locator.cluster)
                for n in page["nodegroups"]
            ]
        pools = tuple(self._describe_pool(locator, name) for name in sorted(names))
        return DiscoveredCluster(
            name=cluster["name"],
            endpoint=cluster.get("endpoint", ""),
            ca_data=cluster.get("certificateAuthority", {}).get("data", ""),
            version=cluster.get("version", ""),
            status=cluster.get("status", ""),
            pools=pools,
        )

    def credentials(self, locator: ClusterLocator) -> KubeAccess:
        cluster = self._describe_cluster(locator)
        if not cluster.get("endpoint"):
            raise CloudError(f"EKS cluster {locator.cluster} has no API endpoint yet ({cluster.get('status', '')})")
        issued = self._now()
        with _cloud_errors("presign the EKS token"):
            token = eks_token(self._client("sts", locator.region), locator.cluster)
        return KubeAccess(
            host=cluster["endpoint"],
            token=token,
            ca_data=cluster.get("certificateAuthority", {}).get("data", ""),
            expires_at=issued + TOKEN_LIFETIME,
        )

    def scale_pool(self, locator: ClusterLocator, pool: str, desired: int) -> ScaleResult:
        current = self._describe_pool(locator, pool)
        plan = plan_scale(current, desired)
        if not plan.changed:
            return plan
        # EKS validates min <= desired <= max on the whole scalingConfig, so send the bounds it already has.
        update = self._update_scaling(locator, pool, current.min_size, current.max_size or desired, plan.desired)
        return with_operation(plan, update)

    def set_autoscaling_bounds(self, locator: ClusterLocator, pool: str, min_size: int, max_size: int) -> None:
        validate_autoscaling_bounds(pool, min_size, max_size)
        current = self._describe_pool(locator, pool)
        # New bounds that exclude the current size would be rejected; move the size inside them, which is
        # what the cluster autoscaler would do next anyway.
        desired = min(max(current.node_count, min_size), max_size)
        if (current.min_size, current.max_size, current.node_count) == (min_size, max_size, desired):
            return
        self._update_scaling(locator, pool, min_size, max_size, desired)

    def _update_scaling(self, locator: ClusterLocator, pool: str, min_size: int, max_size: int, desired: int) -> str:
        eks = self._client("eks", locator.region)
        with _cloud_errors(f"scale node group {pool}"):
            response = eks.update_nodegroup_config(
                clusterName=locator.cluster,
                nodegroupName=pool,
                scalingConfig={"minSize": min_size, "maxSize": max_size, "desiredSize": desired},
            )
        return str(response["update"]["id"])

    def _describe_cluster(self, locator: ClusterLocator) -> dict[str, Any]:
        eks = self._client("eks", locator.region)
        try:
            with _cloud_errors(f"describe EKS cluster {locator.cluster}"):
                cluster: dict[str, Any] = eks.describe_cluster(name=locator.cluster)["cluster"]
        except _NotFound as exc:
            raise ClusterNotFound(f"EKS cluster {locator.cluster} not found in {locator.region}") from exc
        return cluster

    def _describe_pool(self, locator: ClusterLocator, name: str) -> DiscoveredPool:
        eks = self._client("eks", locator.region)
        try:
            with _cloud_errors(f"describe node group {name}"):
                nodegroup = eks.describe_nodegroup(clusterName=locator.cluster, nodegroupName=name)["nodegroup"]
        except _NotFound as exc:
            raise PoolNotFound(f"node group {name} not found in EKS cluster {locator.cluster}") from exc
        return nodegroup_to_pool(nodegroup)


def nodegroup_to_pool(nodegroup: dict[str, Any]) -> DiscoveredPool:
    """A `describe_nodegroup` answer in gpufleet's terms."""
    name = nodegroup["nodegroupName"]
    instance_types: list[str] = nodegroup.get("instanceTypes") or []
    ami_type = nodegroup.get("amiType", "")
    issues: list[str] = []
    shapes = [s for s in (gpu_shape(t) for t in instance_types) if s is not None]
    unknown = [t for t in instance_types if gpu_shape(t) is None and is_gpu_family(t)]
    if unknown:
        issues.append(f"GPU instance types not in gpufleet's table: {', '.join(unknown)}")
    elif not shapes and ami_type in GPU_AMI_TYPES:
        # An NVIDIA AMI on a family gpufleet does not know yet: a GPU pool, not a CPU pool to skip.
        issues.append(f"instance types {', '.join(instance_types)} (AMI {ami_type}) are not in gpufleet's table")
    if shapes and len(shapes) != len(instance_types):
        issues.append("node group mixes GPU and non-GPU instance types")
    if len({(s.gpu_model, s.gpus) for s in shapes}) > 1:
        issues.append(f"node group mixes GPU shapes ({', '.join(instance_types)}); gpufleet needs one per pool")
    if shapes and ami_type not in GPU_AMI_TYPES and ami_type != CUSTOM_AMI:
        issues.append(f"AMI type {ami_type} has no NVIDIA driver")
    scaling = nodegroup.get("scalingConfig", {})
    labels = dict(nodegroup.get("labels") or {})
    labels[NODEGROUP_LABEL] = name
    return DiscoveredPool(
        name=name,
        gpu_model=shapes[0].gpu_model if shapes else "",
        gpus_per_node=shapes[0].gpus if shapes else 0,
        instance_type=",".join(instance_types),
        sharing="exclusive",  # EKS has no sharing setting; MPS/time-slicing live in the device plugin config
        # Several sizes in one group (common for spot) may differ in CPU and memory; plan with the smallest.
        cpu_millis=min((s.cpu_millis for s in shapes), default=0),
        memory_mib=min((s.memory_mib for s in shapes), default=0),
        taints=tuple(
            Taint(t["key"], t.get("value", ""), EFFECTS.get(t["effect"], t["effect"]))
            for t in nodegroup.get("taints") or []
        ),
        labels=labels,
        node_count=int(scaling.get("desiredSize", 0)),
        min_size=int(scaling.get("minSize", 0)),
        max_size=int(scaling["maxSize"]) if "maxSize" in scaling else None,
        spot=nodegroup.get("capacityType") == "SPOT",
        autoscaling=False,  # EKS keeps bounds for the cluster autoscaler but does not say whether one runs
        status=nodegroup.get("status", ""),
        issues=tuple(issues),
    )


class _NotFound(CloudError):
    pass


@contextmanager
def _cloud_errors(action: str) -> Iterator[None]:
    """botocore's exceptions as gpufleet's, keeping AWS's error code and message (they carry no
    credentials) and dropping the request itself."""
    try:
        yield
    except ClientError as exc:
        error = exc.response.get("Error", {})
        code = error.get("Code", "")
        message = f"{action}: {code}: {error.get('Message', '')}"
        raise (_NotFound if code == "ResourceNotFoundException" else CloudError)(message) from exc
    except BotoCoreError as exc:
        raise CloudError(f"{action}: {exc}") from exc


def build(*, endpoint_url: str | None = None, sts_endpoint_url: str | None = None, session: Any = None) -> EksProvider:
    """The adapter on boto3's default credential chain (or `session`), optionally at other endpoints."""
    boto_session = session or boto3.session.Session()
    endpoints = {"eks": endpoint_url, "sts": sts_endpoint_url}

    def clients(service: str, region: str) -> Any:
        return boto_session.client(service, region_name=region, endpoint_url=endpoints.get(service))

    return EksProvider(clients)
