"""Google GKE through `google.cloud.container_v1.ClusterManagerClient`.

Bearer tokens are Google OAuth access tokens from the injected credentials, which is all
`gke-gcloud-auth-plugin` does; node counts come from the pool's managed instance groups (Compute Engine),
because GKE's node pool only remembers its initial size.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC
from typing import Any

import google.auth
import google.auth.credentials
import google.auth.transport.requests
import requests
from google.api_core import exceptions as api_exceptions
from google.auth import exceptions as auth_exceptions
from google.cloud import container_v1

from adapters.clouds.gke.machines import ACCELERATORS, machine_shape
from adapters.clouds.shapes import mig_sharing
from controlplane.domain.model import Taint
from controlplane.service.cloud_ports import (
    CloudError,
    ClusterLocator,
    ClusterNotFound,
    DiscoveredCluster,
    DiscoveredPool,
    KubeAccess,
    PoolNotFound,
    ScaleRefused,
    ScaleResult,
    plan_scale,
    validate_autoscaling_bounds,
    with_operation,
)

# `userinfo.email` makes the token carry the caller's identity, which GKE's authenticator requires.
SCOPES = (
    "https://www.googleapis.com/auth/cloud-platform",
    "https://www.googleapis.com/auth/userinfo.email",
)
NODEPOOL_LABEL = "cloud.google.com/gke-nodepool"  # GKE puts it on every node of the pool
ZONE_LABEL = "topology.kubernetes.io/zone"
EFFECTS = {
    container_v1.NodeTaint.Effect.NO_SCHEDULE: "NoSchedule",
    container_v1.NodeTaint.Effect.PREFER_NO_SCHEDULE: "PreferNoSchedule",
    container_v1.NodeTaint.Effect.NO_EXECUTE: "NoExecute",
}
_SHARING = {
    container_v1.GPUSharingConfig.GPUSharingStrategy.TIME_SHARING: "timeslice",
    container_v1.GPUSharingConfig.GPUSharingStrategy.MPS: "mps",
}

# instance group URLs -> the number of nodes they hold; injected so tests need no Compute Engine.
GroupSizes = Callable[[Sequence[str]], int]


class ComputeGroupSizes:
    """Sums `targetSize` of the node pool's managed instance groups through the Compute Engine REST API."""

    def __init__(self, credentials: Any) -> None:
        # google-auth ships partial annotations; this constructor is among the unannotated ones.
        self._session = google.auth.transport.requests.AuthorizedSession(credentials)  # type: ignore[no-untyped-call]

    def __call__(self, urls: Sequence[str]) -> int:
        total = 0
        for url in urls:
            try:
                response = self._session.get(url, timeout=30)
                response.raise_for_status()
                total += int(response.json().get("targetSize", 0))
            except (requests.RequestException, ValueError) as exc:  # JSON decode errors are ValueErrors
                raise CloudError(f"read instance group size: {exc}") from exc
        return total


class GkeProvider:
    provider = "gke"

    def __init__(
        self,
        client: Any,
        credentials: Any,
        *,
        group_sizes: GroupSizes | None = None,
        auth_request: Any = None,
    ) -> None:
        self._client = client
        self._credentials = google.auth.credentials.with_scopes_if_required(  # type: ignore[no-untyped-call]
            credentials, SCOPES
        )
        self._group_sizes = group_sizes or ComputeGroupSizes(self._credentials)
        self._auth_request = auth_request or google.auth.transport.requests.Request()
        # Refreshing mutates the credentials object; two threads refreshing at once would race on it.
        self._refresh_lock = threading.Lock()

    def list_clusters(self, account: str, region: str) -> list[ClusterLocator]:
        """Clusters of project `account`; every location when `region` is empty."""
        with _cloud_errors("list GKE clusters"):
            response = self._client.list_clusters(parent=f"projects/{account}/locations/{region or '-'}")
        return sorted(
            (ClusterLocator("gke", account, c.location, c.name) for c in response.clusters),
            key=lambda loc: (loc.region, loc.cluster),
        )

    def discover(self, locator: ClusterLocator) -> DiscoveredCluster:
        cluster = self._get_cluster(locator)
        with _cloud_errors(f"list node pools of {locator.cluster}"):
            response = self._client.list_node_pools(parent=_cluster_path(locator))
        return DiscoveredCluster(
            name=cluster.name,
            endpoint=f"https://{cluster.endpoint}" if cluster.endpoint else "",
            ca_data=cluster.master_auth.cluster_ca_certificate,
            version=cluster.current_master_version,
            status=container_v1.Cluster.Status(cluster.status).name,
            pools=tuple(sorted((self._pool(p) for p in response.node_pools), key=lambda p: p.name)),
        )

    def credentials(self, locator: ClusterLocator) -> KubeAccess:
        cluster = self._get_cluster(locator)
        with self._refresh_lock, _cloud_errors("refresh the Google access token"):
            if not self._credentials.valid:
                self._credentials.refresh(self._auth_request)
            token, expiry = self._credentials.token, self._credentials.expiry
        if expiry is None:
            raise CloudError("Google credentials gave a token without an expiry")
        return KubeAccess(
            host=f"https://{cluster.endpoint}",
            token=token,
            ca_data=cluster.master_auth.cluster_ca_certificate,
            # google-auth keeps expiry as naive UTC.
            expires_at=expiry.replace(tzinfo=UTC),
        )

    def scale_pool(self, locator: ClusterLocator, pool: str, desired: int) -> ScaleResult:
        node_pool = self._get_pool(locator, pool)
        current = self._pool(node_pool)
        plan = plan_scale(current, desired)
        if not plan.changed:
            return plan
        # setSize counts nodes per zone of the pool (as `gcloud container clusters resize --num-nodes`);
        # gpufleet speaks in whole-pool sizes, so only multiples of the zone count are reachable.
        zones = _zone_count(node_pool)
        if plan.desired % zones:
            raise ScaleRefused(
                f"pool {pool} spans {zones} zones; its size must be a multiple of {zones}, not {plan.desired}"
            )
        with _cloud_errors(f"set the size of node pool {pool}"):
            operation = self._client.set_node_pool_size(
                request={"name": _pool_path(locator, pool), "node_count": plan.desired // zones}
            )
        return with_operation(plan, operation.name)

    def set_autoscaling_bounds(self, locator: ClusterLocator, pool: str, min_size: int, max_size: int) -> None:
        validate_autoscaling_bounds(pool, min_size, max_size)
        node_pool = self._get_pool(locator, pool)
        current = node_pool.autoscaling
        if current.enabled and (current.total_min_node_count, current.total_max_node_count) == (min_size, max_size):
            return
        # Pool-wide totals, not per-zone bounds, because gpufleet's sizes are per pool; GKE takes one or the
        # other. The location policy is kept as the pool has it.
        autoscaling: dict[str, Any] = {
            "enabled": True,
            "total_min_node_count": min_size,
            "total_max_node_count": max_size,
        }
        if current.location_policy:
            autoscaling["location_policy"] = current.location_policy
        with _cloud_errors(f"set autoscaling of node pool {pool}"):
            self._client.set_node_pool_autoscaling(
                request={"name": _pool_path(locator, pool), "autoscaling": autoscaling}
            )

    def _pool(self, node_pool: Any) -> DiscoveredPool:
        urls = list(node_pool.instance_group_urls)
        zones = _zone_count(node_pool)
        count = self._group_sizes(urls) if urls else node_pool.initial_node_count * zones
        return node_pool_to_pool(node_pool, count)

    def _get_cluster(self, locator: ClusterLocator) -> Any:
        try:
            with _cloud_errors(f"get GKE cluster {locator.cluster}"):
                return self._client.get_cluster(name=_cluster_path(locator))
        except _NotFound as exc:
            raise ClusterNotFound(f"GKE cluster {locator.cluster} not found in {locator.region}") from exc

    def _get_pool(self, locator: ClusterLocator, pool: str) -> Any:
        try:
            with _cloud_errors(f"get node pool {pool}"):
                return self._client.get_node_pool(name=_pool_path(locator, pool))
        except _NotFound as exc:
            raise PoolNotFound(f"node pool {pool} not found in GKE cluster {locator.cluster}") from exc


def node_pool_to_pool(node_pool: Any, node_count: int) -> DiscoveredPool:
    """A GKE `NodePool` in gpufleet's terms, with the node count read from its instance groups."""
    config = node_pool.config
    name: str = node_pool.name
    issues: list[str] = []
    model, gpus, sharing = "", 0, "exclusive"
    accelerators = list(config.accelerators)
    if len(accelerators) > 1:
        issues.append("node pool has more than one accelerator type")
    if accelerators:
        accelerator = accelerators[0]
        gpus = accelerator.accelerator_count
        model = ACCELERATORS.get(accelerator.accelerator_type, "")
        if not model:
            issues.append(f"accelerator {accelerator.accelerator_type} is not in gpufleet's table")
        strategy = accelerator.gpu_sharing_config.gpu_sharing_strategy
        clients = accelerator.gpu_sharing_config.max_shared_clients_per_gpu
        if accelerator.gpu_partition_size:
            sharing, issue = mig_sharing(model, accelerator.gpu_partition_size)
            if issue:
                issues.append(issue)
            if strategy in _SHARING:
                issues.append("time-sharing on MIG partitions has no gpufleet sharing mode")
        elif strategy in _SHARING:
            sharing = f"{_SHARING[strategy]}:{clients}"
    shape = machine_shape(config.machine_type)
    if accelerators and shape is None:
        issues.append(f"machine type {config.machine_type} is not in gpufleet's table")
    autoscaling = node_pool.autoscaling
    zones = _zone_count(node_pool)
    min_size, max_size = 0, None
    if autoscaling.enabled:
        # GKE takes either per-zone or whole-pool bounds; gpufleet reports whole-pool ones.
        if autoscaling.total_max_node_count:
            min_size, max_size = autoscaling.total_min_node_count, autoscaling.total_max_node_count
        else:
            min_size, max_size = autoscaling.min_node_count * zones, autoscaling.max_node_count * zones
    labels = dict(config.labels)
    labels[NODEPOOL_LABEL] = name
    if len(node_pool.locations) == 1:
        labels[ZONE_LABEL] = node_pool.locations[0]
    return DiscoveredPool(
        name=name,
        gpu_model=model,
        gpus_per_node=gpus,
        instance_type=config.machine_type,
        sharing=sharing,
        cpu_millis=shape.vcpus * 1000 if shape else 0,
        memory_mib=shape.memory_mib if shape else 0,
        taints=tuple(
            Taint(t.key, t.value, EFFECTS.get(t.effect, "NoSchedule")) for t in config.taints if t.effect in EFFECTS
        ),
        labels=labels,
        node_count=node_count,
        min_size=min_size,
        max_size=max_size,
        spot=bool(config.spot or config.preemptible),
        autoscaling=bool(autoscaling.enabled),
        status=container_v1.NodePool.Status(node_pool.status).name,
        issues=tuple(issues),
    )


def _zone_count(node_pool: Any) -> int:
    return max(1, len(node_pool.locations))


def _cluster_path(locator: ClusterLocator) -> str:
    return f"projects/{locator.account}/locations/{locator.region}/clusters/{locator.cluster}"


def _pool_path(locator: ClusterLocator, pool: str) -> str:
    return f"{_cluster_path(locator)}/nodePools/{pool}"


def default_credentials() -> Any:
    """Application Default Credentials with the scopes GKE needs."""
    credentials, _project = google.auth.default(scopes=list(SCOPES))
    return credentials


class _NotFound(CloudError):
    pass


@contextmanager
def _cloud_errors(action: str) -> Iterator[None]:
    """google-api-core and google-auth exceptions as gpufleet's; their messages carry no tokens."""
    try:
        yield
    except api_exceptions.NotFound as exc:
        raise _NotFound(f"{action}: {exc.message}") from exc
    except api_exceptions.GoogleAPIError as exc:
        raise CloudError(f"{action}: {exc}") from exc
    except auth_exceptions.GoogleAuthError as exc:
        raise CloudError(f"{action}: {exc}") from exc


def build(
    *,
    api_endpoint: str | None = None,
    transport: str | None = None,
    credentials: Any = None,
    client_credentials: Any = None,
) -> GkeProvider:
    """The adapter on `credentials` (Application Default Credentials when None). `client_credentials`
    authenticate the API client when they differ from the ones whose token goes to the clusters."""
    token_credentials = credentials or default_credentials()
    client = container_v1.ClusterManagerClient(
        credentials=client_credentials or token_credentials,
        transport=transport,
        client_options={"api_endpoint": api_endpoint} if api_endpoint else None,
    )
    return GkeProvider(client, token_credentials)
