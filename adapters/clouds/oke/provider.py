"""Oracle OKE through `oci.container_engine.ContainerEngineClient`.

OKE's node pools have no taints and no autoscaling bounds (bounds live in the Cluster Autoscaler
add-on's configuration), so this adapter offers no `set_autoscaling_bounds`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import oci
import yaml

from adapters.clouds.oke.shapes import gpu_shape, is_gpu_shape
from adapters.clouds.oke.token import TOKEN_LIFETIME, oke_token
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
    with_operation,
)

# region -> ContainerEngineClient; injected so tests can point it at a local endpoint.
ClientFactory = Callable[[str], Any]

_GONE = frozenset({"DELETING", "DELETED"})


class OkeProvider:
    provider = "oke"

    def __init__(self, clients: ClientFactory, *, now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self._factory = clients
        self._clients: dict[str, Any] = {}
        self._now = now

    def _client(self, region: str) -> Any:
        if region not in self._clients:
            self._clients[region] = self._factory(region)
        return self._clients[region]

    def list_clusters(self, account: str, region: str) -> list[ClusterLocator]:
        """Clusters of compartment `account` in `region` (OCI endpoints are regional)."""
        return sorted(
            (
                ClusterLocator("oke", account, region, c.name, cluster_id=c.id)
                for c in self._cluster_summaries(account, region)
            ),
            key=lambda loc: loc.cluster,
        )

    def discover(self, locator: ClusterLocator) -> DiscoveredCluster:
        cluster = self._cluster(locator)
        client = self._client(locator.region)
        with _cloud_errors(f"list node pools of {locator.cluster}"):
            pools = oci.pagination.list_call_get_all_results(
                client.list_node_pools, locator.account, cluster_id=cluster.id
            ).data
        return DiscoveredCluster(
            name=cluster.name,
            endpoint=_endpoint(cluster),
            ca_data="",  # OKE hands the CA out only inside a kubeconfig; see credentials()
            version=cluster.kubernetes_version or "",
            status=cluster.lifecycle_state or "",
            pools=tuple(sorted((node_pool_to_pool(p) for p in pools if p.lifecycle_state not in _GONE), key=_name)),
        )

    def credentials(self, locator: ClusterLocator) -> KubeAccess:
        cluster = self._cluster(locator)
        client = self._client(locator.region)
        endpoint = "PUBLIC_ENDPOINT" if cluster.endpoints and cluster.endpoints.public_endpoint else "PRIVATE_ENDPOINT"
        details = oci.container_engine.models.CreateClusterKubeconfigContentDetails(
            token_version="2.0.0",  # noqa: S106 - the kubeconfig format version, not a secret
            endpoint=endpoint,
        )
        with _cloud_errors(f"create a kubeconfig for {locator.cluster}"):
            kubeconfig = client.create_kubeconfig(cluster.id, create_cluster_kubeconfig_content_details=details)
        # Only the cluster entry is read. Its user runs `oci ce cluster generate-token`, which gpufleet
        # replaces with the same signature computed here.
        server, ca_data = _kubeconfig_cluster(kubeconfig.data.text)
        issued = self._now()
        token = oke_token(client.base_client.signer, locator.region, cluster.id)
        return KubeAccess(host=server, token=token, ca_data=ca_data, expires_at=issued + TOKEN_LIFETIME)

    def scale_pool(self, locator: ClusterLocator, pool: str, desired: int) -> ScaleResult:
        cluster = self._cluster(locator)
        current = self._pool(locator, cluster.id, pool)
        plan = plan_scale(current, desired)
        if not plan.changed:
            return plan
        details = oci.container_engine.models.UpdateNodePoolDetails(
            node_config_details=oci.container_engine.models.UpdateNodePoolNodeConfigDetails(size=plan.desired)
        )
        with _cloud_errors(f"resize node pool {pool}"):
            response = self._client(locator.region).update_node_pool(current.pool_id, details)
        return with_operation(plan, response.headers.get("opc-work-request-id", ""))

    def _cluster_summaries(self, compartment: str, region: str, **filters: Any) -> list[Any]:
        with _cloud_errors("list OKE clusters"):
            clusters = oci.pagination.list_call_get_all_results(
                self._client(region).list_clusters, compartment, **filters
            ).data
        return [c for c in clusters if c.lifecycle_state not in _GONE]

    def _cluster(self, locator: ClusterLocator) -> Any:
        """The cluster summary; by OCID when the locator has it, else by name (OKE names are not unique,
        so more than one live match is an error rather than a guess)."""
        found = [
            c
            for c in self._cluster_summaries(locator.account, locator.region, name=locator.cluster)
            if not locator.cluster_id or c.id == locator.cluster_id
        ]
        if not found:
            raise ClusterNotFound(f"OKE cluster {locator.cluster} not found in {locator.account} ({locator.region})")
        if len(found) > 1:
            raise CloudError(f"{len(found)} OKE clusters are named {locator.cluster}; give the cluster OCID")
        return found[0]

    def _pool(self, locator: ClusterLocator, cluster_id: str, name: str) -> DiscoveredPool:
        client = self._client(locator.region)
        with _cloud_errors(f"find node pool {name}"):
            pools = oci.pagination.list_call_get_all_results(
                client.list_node_pools, locator.account, cluster_id=cluster_id, name=name
            ).data
        live = [node_pool_to_pool(p) for p in pools if p.lifecycle_state not in _GONE and p.name == name]
        if len(live) != 1:
            raise PoolNotFound(f"node pool {name} not found in OKE cluster {locator.cluster}")
        return live[0]


def node_pool_to_pool(summary: Any) -> DiscoveredPool:
    """A `NodePoolSummary` in gpufleet's terms."""
    shape_name: str = summary.node_shape or ""
    shape = gpu_shape(shape_name)
    issues = (
        [f"GPU shape {shape_name} is not in gpufleet's table"] if shape is None and is_gpu_shape(shape_name) else []
    )
    cpu_millis = shape.cpu_millis if shape else 0
    memory_mib = shape.memory_mib if shape else 0
    if shape is None and summary.node_shape_config is not None:
        # Flexible shapes carry their size on the pool.
        cpu_millis = int((summary.node_shape_config.ocpus or 0) * 2000)
        memory_mib = int((summary.node_shape_config.memory_in_gbs or 0) * 1024)
    config = summary.node_config_details
    placements = (config.placement_configs or []) if config else []
    return DiscoveredPool(
        name=summary.name,
        gpu_model=shape.gpu_model if shape else "",
        gpus_per_node=shape.gpus if shape else 0,
        instance_type=shape_name,
        sharing="exclusive",  # OKE has no sharing setting; MPS/time-slicing live in the device plugin config
        cpu_millis=cpu_millis,
        memory_mib=memory_mib,
        taints=(),  # the OKE API has no node-pool taints; they are set through kubelet flags in cloud-init
        labels={kv.key: kv.value for kv in summary.initial_node_labels or []},
        node_count=int(config.size or 0) if config else 0,
        min_size=0,
        max_size=None,
        spot=any(p.preemptible_node_config is not None for p in placements),
        status=summary.lifecycle_state or "",
        pool_id=summary.id,
        issues=tuple(issues),
    )


def _name(pool: DiscoveredPool) -> str:
    return pool.name


def _endpoint(cluster: Any) -> str:
    endpoints = cluster.endpoints
    host = endpoints and (endpoints.public_endpoint or endpoints.private_endpoint)
    return f"https://{host}" if host else ""


def _kubeconfig_cluster(text: str) -> tuple[str, str]:
    try:
        entry = yaml.safe_load(text)["clusters"][0]["cluster"]
        return str(entry["server"]), str(entry["certificate-authority-data"])
    except (yaml.YAMLError, KeyError, IndexError, TypeError) as exc:
        raise CloudError("OKE kubeconfig carries no cluster server and CA") from exc


@contextmanager
def _cloud_errors(action: str) -> Iterator[None]:
    """oci's exceptions as gpufleet's. `ServiceError` messages carry the service's code and message and the
    request id, not the signed request."""
    try:
        yield
    except oci.exceptions.ServiceError as exc:
        raise CloudError(f"{action}: HTTP {exc.status} {exc.code}: {exc.message}") from exc
    except (oci.exceptions.ClientError, oci.exceptions.RequestException) as exc:
        raise CloudError(f"{action}: {exc}") from exc


def build(*, config: dict[str, Any] | None = None, service_endpoint: str | None = None) -> OkeProvider:
    """The adapter on an OCI config (`~/.oci/config` when None), optionally at another endpoint."""
    base = config or oci.config.from_file()

    def clients(region: str) -> Any:
        # One client per region: OCI endpoints are regional and the client takes its region from the config.
        regional = {**base, "region": region}
        kwargs = {"service_endpoint": service_endpoint} if service_endpoint else {}
        return oci.container_engine.ContainerEngineClient(regional, **kwargs)

    return OkeProvider(clients)
