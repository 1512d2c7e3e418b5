"""Azure AKS through `azure.mgmt.containerservice.ContainerServiceClient`.

Bearer tokens come from Entra ID for the AKS AAD server application, which is what `kubelogin` does for
an Entra-enabled cluster; gpufleet never runs the kubeconfig's exec plugin.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import yaml
from azure.core import MatchConditions
from azure.core.exceptions import AzureError, HttpResponseError, ResourceNotFoundError
from azure.identity import DefaultAzureCredential
from azure.mgmt.containerservice import ContainerServiceClient

from adapters.clouds.aks.vm_sizes import FRACTIONAL_GPU_SIZES, gpu_shape, is_gpu_size
from adapters.clouds.shapes import mig_profile_for_slices, mig_sharing
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
)

# The fixed application id of "Azure Kubernetes Service AAD Server"; every Entra-enabled AKS API server
# accepts tokens issued for it.
AKS_AAD_SCOPE = "6dae42f8-4368-4678-94ff-3960e28e3630/.default"
AGENTPOOL_LABEL = "kubernetes.azure.com/agentpool"  # AKS puts it on every node of the pool
ZONE_LABEL = "topology.kubernetes.io/zone"

# subscription id -> ContainerServiceClient; injected so tests can point it at a local endpoint.
ClientFactory = Callable[[str], Any]

_RESOURCE_GROUP = re.compile(r"/resourceGroups/([^/]+)/", re.IGNORECASE)
_TAINT = re.compile(r"^(?P<key>[^=:]+)(=(?P<value>[^:]*))?:(?P<effect>NoSchedule|PreferNoSchedule|NoExecute)$")
_MIG = re.compile(r"^MIG([1-7])g$")


class AksProvider:
    provider = "aks"

    def __init__(
        self,
        clients: ClientFactory,
        token_credential: Any,
        *,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._factory = clients
        self._clients: dict[str, Any] = {}
        self._credential = token_credential
        self._now = now

    def _client(self, subscription: str) -> Any:
        if subscription not in self._clients:
            self._clients[subscription] = self._factory(subscription)
        return self._clients[subscription]

    def list_clusters(self, account: str, region: str) -> list[ClusterLocator]:
        """Clusters of subscription `account`; all locations when `region` is empty."""
        with _cloud_errors("list AKS clusters"):
            clusters = list(self._client(account).managed_clusters.list())
        return sorted(
            (
                ClusterLocator("aks", account, mc.location, mc.name, resource_group=resource_group_of(mc.id))
                for mc in clusters
                if not region or mc.location == region
            ),
            key=lambda loc: (loc.resource_group, loc.cluster),
        )

    def discover(self, locator: ClusterLocator) -> DiscoveredCluster:
        group = self._resource_group(locator)
        client = self._client(locator.account)
        mc = self._get_cluster(locator, group)
        with _cloud_errors(f"list agent pools of {locator.cluster}"):
            pools = list(client.agent_pools.list(group, locator.cluster))
        power = (mc.power_state or {}).get("code", "")
        return DiscoveredCluster(
            name=mc.name,
            endpoint=_endpoint(mc),
            ca_data="",  # AKS hands the CA out only with user credentials; see credentials()
            version=mc.current_kubernetes_version or mc.kubernetes_version or "",
            status="Stopped" if power == "Stopped" else (mc.provisioning_state or ""),
            pools=tuple(sorted((agent_pool_to_pool(p, mc.location) for p in pools), key=lambda p: p.name)),
        )

    def credentials(self, locator: ClusterLocator) -> KubeAccess:
        group = self._resource_group(locator)
        mc = self._get_cluster(locator, group)
        with _cloud_errors(f"list user credentials of {locator.cluster}"):
            results = self._client(locator.account).managed_clusters.list_cluster_user_credentials(
                group, locator.cluster
            )
        # Only the cluster entry (CA) is read; the kubeconfig's user (an exec plugin on Entra clusters) is not.
        ca_data = _kubeconfig_ca(results.kubeconfigs[0].value if results.kubeconfigs else b"")
        with _cloud_errors("get an Entra token for AKS"):
            token = self._credential.get_token(AKS_AAD_SCOPE)
        return KubeAccess(
            host=_endpoint(mc),
            token=token.token,
            ca_data=ca_data,
            expires_at=datetime.fromtimestamp(token.expires_on, UTC),
        )

    def scale_pool(self, locator: ClusterLocator, pool: str, desired: int) -> ScaleResult:
        group = self._resource_group(locator)
        agent_pool = self._get_pool(locator, group, pool)
        current = agent_pool_to_pool(agent_pool, "")
        if current.autoscaling:
            # AKS rejects a count change on an autoscaled pool; its size is the autoscaler's to set.
            raise ScaleRefused(f"pool {pool} is autoscaled ({current.min_size}..{current.max_size}); set its bounds")
        plan = plan_scale(current, desired)
        if not plan.changed:
            return plan
        agent_pool.count = plan.desired
        self._put_pool(locator, group, agent_pool)
        return plan

    def set_autoscaling_bounds(self, locator: ClusterLocator, pool: str, min_size: int, max_size: int) -> None:
        validate_autoscaling_bounds(pool, min_size, max_size)
        group = self._resource_group(locator)
        agent_pool = self._get_pool(locator, group, pool)
        count = min(max(agent_pool.count or 0, min_size), max_size)
        wanted = (True, min_size, max_size, count)
        if (agent_pool.enable_auto_scaling, agent_pool.min_count, agent_pool.max_count, agent_pool.count) == wanted:
            return
        agent_pool.enable_auto_scaling = True
        agent_pool.min_count = min_size
        agent_pool.max_count = max_size
        agent_pool.count = count
        self._put_pool(locator, group, agent_pool)

    def _put_pool(self, locator: ClusterLocator, group: str, agent_pool: Any) -> None:
        """PUT the whole pool as read, changed fields only: the PUT replaces the pool, so anything left
        out would be reset. The eTag makes a concurrent change fail instead of being overwritten."""
        conditions: dict[str, Any] = {}
        if agent_pool.e_tag:
            conditions = {"etag": agent_pool.e_tag, "match_condition": MatchConditions.IfNotModified}
        with _cloud_errors(f"update agent pool {agent_pool.name}"):
            poller = self._client(locator.account).agent_pools.begin_create_or_update(
                group, locator.cluster, agent_pool.name, agent_pool, **conditions
            )
            poller.result()

    def _resource_group(self, locator: ClusterLocator) -> str:
        if locator.resource_group:
            return locator.resource_group
        for found in self.list_clusters(locator.account, ""):
            if found.cluster == locator.cluster:
                return found.resource_group
        raise ClusterNotFound(f"AKS cluster {locator.cluster} not found in subscription {locator.account}")

    def _get_cluster(self, locator: ClusterLocator, group: str) -> Any:
        try:
            with _cloud_errors(f"get AKS cluster {locator.cluster}"):
                return self._client(locator.account).managed_clusters.get(group, locator.cluster)
        except _NotFound as exc:
            raise ClusterNotFound(f"AKS cluster {locator.cluster} not found in resource group {group}") from exc

    def _get_pool(self, locator: ClusterLocator, group: str, pool: str) -> Any:
        try:
            with _cloud_errors(f"get agent pool {pool}"):
                return self._client(locator.account).agent_pools.get(group, locator.cluster, pool)
        except _NotFound as exc:
            raise PoolNotFound(f"agent pool {pool} not found in AKS cluster {locator.cluster}") from exc


def resource_group_of(resource_id: str) -> str:
    match = _RESOURCE_GROUP.search(resource_id or "")
    if match is None:
        raise CloudError(f"no resource group in ARM id {resource_id!r}")
    return match.group(1)


def parse_taint(text: str) -> Taint:
    """`key=value:Effect` or `key:Effect`, the form `node_taints` uses."""
    match = _TAINT.match(text.strip())
    if match is None:
        raise CloudError(f"AKS taint {text!r} is not key=value:Effect")
    return Taint(match["key"], match["value"] or "", match["effect"])


def agent_pool_to_pool(agent_pool: Any, location: str) -> DiscoveredPool:
    """An `AgentPool` in gpufleet's terms. `location` gives zone labels their `<location>-<n>` form."""
    name: str = agent_pool.name
    vm_size: str = agent_pool.vm_size or ""
    shape = gpu_shape(vm_size)
    issues: list[str] = []
    if shape is None and vm_size.lower() in FRACTIONAL_GPU_SIZES:
        issues.append(f"{vm_size} carries a fraction of a GPU through vGPU")
    elif shape is None and is_gpu_size(vm_size):
        issues.append(f"GPU VM size {vm_size} is not in gpufleet's table")
    sharing = "exclusive"
    mig = _MIG.match(agent_pool.gpu_instance_profile or "")
    if mig and shape is not None:
        profile = mig_profile_for_slices(shape.gpu_model, int(mig.group(1)))
        sharing, issue = mig_sharing(shape.gpu_model, profile or agent_pool.gpu_instance_profile)
        if issue:
            issues.append(issue)
    taints = []
    for text in agent_pool.node_taints or []:
        try:
            taints.append(parse_taint(text))
        except CloudError as exc:
            issues.append(str(exc))
    labels = dict(agent_pool.node_labels or {})
    labels[AGENTPOOL_LABEL] = name
    zones = agent_pool.availability_zones or []
    if location and len(zones) == 1:
        labels[ZONE_LABEL] = f"{location}-{zones[0]}"
    autoscaling = bool(agent_pool.enable_auto_scaling)
    # Without the autoscaler AKS lets a user pool go to 0 and a system pool to 1 node.
    floor = 1 if agent_pool.mode == "System" else 0
    return DiscoveredPool(
        name=name,
        gpu_model=shape.gpu_model if shape else "",
        gpus_per_node=shape.gpus if shape else 0,
        instance_type=vm_size,
        sharing=sharing,
        cpu_millis=shape.cpu_millis if shape else 0,
        memory_mib=shape.memory_mib if shape else 0,
        taints=tuple(taints),
        labels=labels,
        node_count=int(agent_pool.count or 0),
        min_size=int(agent_pool.min_count or 0) if autoscaling else floor,
        max_size=int(agent_pool.max_count) if autoscaling and agent_pool.max_count is not None else None,
        spot=agent_pool.scale_set_priority == "Spot",
        autoscaling=autoscaling,
        status=agent_pool.provisioning_state or "",
        issues=tuple(issues),
    )


def _endpoint(mc: Any) -> str:
    fqdn = mc.fqdn or mc.private_fqdn
    if not fqdn:
        raise CloudError(f"AKS cluster {mc.name} has no API server FQDN yet")
    return f"https://{fqdn}:443"


def _kubeconfig_ca(kubeconfig: bytes) -> str:
    try:
        document = yaml.safe_load(kubeconfig.decode() or "{}")
        ca: str = document["clusters"][0]["cluster"]["certificate-authority-data"]
    except (yaml.YAMLError, UnicodeDecodeError, KeyError, IndexError, TypeError) as exc:
        raise CloudError("AKS user kubeconfig carries no certificate-authority-data") from exc
    return ca


class _NotFound(CloudError):
    pass


@contextmanager
def _cloud_errors(action: str) -> Iterator[None]:
    """azure-core's exceptions as gpufleet's. The ARM error message names the failing resource and
    carries no credentials; the request (with its Authorization header) is not kept."""
    try:
        yield
    except ResourceNotFoundError as exc:
        raise _NotFound(f"{action}: {exc.message}") from exc
    except HttpResponseError as exc:
        raise CloudError(f"{action}: HTTP {exc.status_code}: {exc.message}") from exc
    except AzureError as exc:
        raise CloudError(f"{action}: {exc.message}") from exc


def build(
    *, base_url: str | None = None, credential: Any = None, client_kwargs: dict[str, Any] | None = None
) -> AksProvider:
    """The adapter on `credential` (DefaultAzureCredential when None), optionally at another ARM endpoint."""
    token_credential = credential or DefaultAzureCredential()

    def clients(subscription: str) -> Any:
        return ContainerServiceClient(token_credential, subscription, base_url=base_url, **(client_kwargs or {}))

    return AksProvider(clients, token_credential)
