"""AKS adapter against a local fake of the Azure Resource Manager REST API, through the real SDK."""

from __future__ import annotations

import base64
import copy
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml
from azure.core.credentials import AccessToken
from azure.core.pipeline import PipelineRequest
from azure.core.pipeline.policies import SansIOHTTPPolicy

from adapters.clouds import build_provider
from controlplane.domain.model import Taint
from controlplane.service.cloud_ports import ClusterLocator, ClusterNotFound, PoolNotFound, ScaleRefused, to_pool_spec
from tests.clouds.fakes import FakeServer, Recorded, Reply

SUB = "0b1f6471-1bf0-4dda-aec3-cb9272f09590"
RG = "rg-ml-eastus"
CLUSTER = "aks-ml"
LOCATOR = ClusterLocator("aks", SUB, "eastus", CLUSTER, resource_group=RG)
ARM_SCOPE = "https://management.azure.com/.default"
AKS_SCOPE = "6dae42f8-4368-4678-94ff-3960e28e3630/.default"
CLUSTER_ID = f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.ContainerService/managedClusters/{CLUSTER}"
CA_DATA = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIE6DCCAtCgAwIBAgIQ\n-----END CERTIFICATE-----\n").decode()
EXPIRES_ON = 1_900_000_000


class RecordingCredential:
    """A TokenCredential that hands out fixed tokens and remembers which scopes were asked for."""

    def __init__(self) -> None:
        self.scopes: list[tuple[str, ...]] = []

    def get_token(self, *scopes: str, **_: Any) -> AccessToken:
        self.scopes.append(scopes)
        return AccessToken("aks-entra-token" if AKS_SCOPE in scopes else "arm-token", EXPIRES_ON)


class PlainBearer(SansIOHTTPPolicy[Any, Any]):
    """azure-core's bearer policy refuses http:// URLs; the fake speaks http, so add the header directly."""

    def __init__(self, credential: RecordingCredential) -> None:
        self._credential = credential

    def on_request(self, request: PipelineRequest[Any]) -> None:
        request.http_request.headers["Authorization"] = f"Bearer {self._credential.get_token(ARM_SCOPE).token}"


def _pool(name: str, **properties: Any) -> dict[str, Any]:
    return {
        "id": f"{CLUSTER_ID}/agentPools/{name}",
        "name": name,
        "type": "Microsoft.ContainerService/managedClusters/agentPools",
        "properties": {
            "eTag": f"etag-{name}-1",
            "osDiskSizeGB": 256,
            "osDiskType": "Managed",
            "kubeletDiskType": "OS",
            "maxPods": 110,
            "type": "VirtualMachineScaleSets",
            "orchestratorVersion": "1.31.5",
            "currentOrchestratorVersion": "1.31.5",
            "nodeImageVersion": "AKSUbuntu-2204gen2containerd-202502.09.0",
            "provisioningState": "Succeeded",
            "powerState": {"code": "Running"},
            "osType": "Linux",
            "osSKU": "Ubuntu",
            "enableFIPS": False,
            "upgradeSettings": {"maxSurge": "10%"},
            **properties,
        },
    }


def _initial_pools() -> dict[str, dict[str, Any]]:
    return {
        "gpuh100": _pool(
            "gpuh100",
            count=2,
            vmSize="Standard_ND96isr_H100_v5",
            mode="User",
            enableAutoScaling=False,
            availabilityZones=["2"],
            scaleSetPriority="Spot",
            scaleSetEvictionPolicy="Delete",
            spotMaxPrice=-1,
            nodeLabels={"team": "research"},
            nodeTaints=["sku=gpu:NoSchedule", "kubernetes.azure.com/scalesetpriority=spot:NoSchedule"],
            gpuInstanceProfile="MIG3g",
        ),
        "gpua100": _pool(
            "gpua100",
            count=1,
            vmSize="Standard_NC24ads_A100_v4",
            mode="User",
            enableAutoScaling=True,
            minCount=1,
            maxCount=5,
            nodeTaints=["sku=gpu:NoSchedule"],
        ),
        "system": _pool("system", count=3, vmSize="Standard_D4ds_v5", mode="System", enableAutoScaling=False),
    }


def _kubeconfig() -> str:
    # What AKS returns for an Entra ID cluster: the user runs kubelogin, which gpufleet never does.
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": CLUSTER,
                    "cluster": {
                        "certificate-authority-data": CA_DATA,
                        "server": "https://aks-ml-dns-4f2b9c1d.hcp.eastus.azmk8s.io:443",
                    },
                }
            ],
            "contexts": [{"name": CLUSTER, "context": {"cluster": CLUSTER, "user": f"clusterUser_{RG}_{CLUSTER}"}}],
            "current-context": CLUSTER,
            "users": [
                {
                    "name": f"clusterUser_{RG}_{CLUSTER}",
                    "user": {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": "kubelogin"}},
                }
            ],
        }
    )


class FakeArm:
    """The ARM endpoints of Microsoft.ContainerService the adapter uses, with agent pools kept in memory.
    A PUT answers like ARM does for a long-running update: `Updating` plus an Azure-AsyncOperation URL."""

    def __init__(self) -> None:
        self.pools = _initial_pools()
        self.server = FakeServer(self.route)
        self._pending: dict[str, str] = {}

    def cluster(self) -> dict[str, Any]:
        return {
            "id": CLUSTER_ID,
            "location": "eastus",
            "name": CLUSTER,
            "type": "Microsoft.ContainerService/ManagedClusters",
            "sku": {"name": "Base", "tier": "Standard"},
            "identity": {"type": "SystemAssigned"},
            "properties": {
                "provisioningState": "Succeeded",
                "powerState": {"code": "Running"},
                "kubernetesVersion": "1.31",
                "currentKubernetesVersion": "1.31.5",
                "dnsPrefix": "aks-ml-dns",
                "fqdn": "aks-ml-dns-4f2b9c1d.hcp.eastus.azmk8s.io",
                "azurePortalFQDN": "aks-ml-dns-4f2b9c1d.portal.hcp.eastus.azmk8s.io",
                "agentPoolProfiles": [{"name": n, **p["properties"]} for n, p in self.pools.items()],
                "enableRBAC": True,
                "aadProfile": {"managed": True, "enableAzureRBAC": True, "tenantID": "72f988bf-0000-0000"},
                "nodeResourceGroup": f"MC_{RG}_{CLUSTER}_eastus",
            },
        }

    def route(self, request: Recorded) -> Reply:
        assert request.query.get("api-version"), "every ARM call names its api-version"
        assert request.headers["authorization"] == "Bearer arm-token"
        path = request.path
        base = f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.ContainerService/managedClusters"
        if path == f"/subscriptions/{SUB}/providers/Microsoft.ContainerService/managedClusters":
            return Reply(body={"value": [self.cluster()]})
        if path.startswith("/operations/"):
            pool = self._pending.pop(path.rsplit("/", 1)[1])
            self.pools[pool]["properties"]["provisioningState"] = "Succeeded"
            return Reply(body={"name": path, "status": "Succeeded", "startTime": "2026-01-01T00:00:00Z"})
        if path == f"{base}/{CLUSTER}":
            return Reply(body=self.cluster())
        if path == f"{base}/{CLUSTER}/agentPools":
            return Reply(body={"value": list(self.pools.values())})
        if path == f"{base}/{CLUSTER}/listClusterUserCredential" and request.method == "POST":
            value = base64.b64encode(_kubeconfig().encode()).decode()
            return Reply(body={"kubeconfigs": [{"name": "clusterUser", "value": value}]})
        match = re.fullmatch(f"{base}/{CLUSTER}/agentPools/([a-z0-9]+)", path)
        if match and match.group(1) in self.pools:
            name = match.group(1)
            if request.method == "PUT":
                return self._put(name, request)
            return Reply(body=self.pools[name])
        return Reply(404, {"error": {"code": "ResourceNotFound", "message": f"The resource {path} was not found."}})

    def _put(self, name: str, request: Recorded) -> Reply:
        current = self.pools[name]
        # azure-core sends the eTag quoted, as HTTP entity tags are.
        if request.headers.get("if-match") != f'"{current["properties"]["eTag"]}"':
            return Reply(412, {"error": {"code": "PreconditionFailed", "message": "eTag mismatch"}})
        body = request.json()
        stored = copy.deepcopy(body)
        version = int(current["properties"]["eTag"].rsplit("-", 1)[1]) + 1
        stored["properties"].update(provisioningState="Updating", eTag=f"etag-{name}-{version}")
        self.pools[name] = {**current, "properties": stored["properties"]}
        operation = f"op-{name}-{version}"
        self._pending[operation] = name
        headers = (
            ("Azure-AsyncOperation", f"{self.server.url}/operations/{operation}?api-version=2026-08-01"),
            ("Retry-After", "0"),
        )
        return Reply(200, self.pools[name], headers=headers)


READ_ONLY = ("eTag", "provisioningState", "currentOrchestratorVersion")


def _writable(properties: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in properties.items() if k not in READ_ONLY}


@pytest.fixture
def arm() -> Iterator[FakeArm]:
    fake = FakeArm()
    fake.server.start()
    yield fake
    fake.server.stop()


@pytest.fixture
def credential() -> RecordingCredential:
    return RecordingCredential()


@pytest.fixture
def provider(arm: FakeArm, credential: RecordingCredential) -> Any:
    return build_provider(
        "aks",
        base_url=arm.server.url,
        credential=credential,
        client_kwargs={"authentication_policy": PlainBearer(credential), "polling_interval": 0},
    )


def test_lists_clusters_with_their_resource_group(provider: Any, arm: FakeArm) -> None:
    assert provider.list_clusters(SUB, "") == [LOCATOR]
    assert provider.list_clusters(SUB, "westeurope") == []
    assert arm.server.calls("GET", "/managedClusters")[0].path == (
        f"/subscriptions/{SUB}/providers/Microsoft.ContainerService/managedClusters"
    )


def test_discovers_cluster_and_agent_pools(provider: Any, arm: FakeArm) -> None:
    cluster = provider.discover(LOCATOR)

    assert cluster.name == CLUSTER
    assert cluster.endpoint == "https://aks-ml-dns-4f2b9c1d.hcp.eastus.azmk8s.io:443"
    assert cluster.ca_data == ""
    assert (cluster.version, cluster.status) == ("1.31.5", "Succeeded")
    assert [p.name for p in cluster.pools] == ["gpua100", "gpuh100", "system"]

    a100, h100, system = cluster.pools
    assert (h100.gpu_model, h100.gpus_per_node, h100.instance_type) == ("H100-80GB", 8, "Standard_ND96isr_H100_v5")
    assert h100.sharing == "mig:all-3g.40gb"  # MIG3g on an 80 GB GPU
    assert (h100.cpu_millis, h100.memory_mib) == (96_000, 1900 * 1024)
    assert h100.taints == (
        Taint("sku", "gpu", "NoSchedule"),
        Taint("kubernetes.azure.com/scalesetpriority", "spot", "NoSchedule"),
    )
    assert h100.labels == {
        "team": "research",
        "kubernetes.azure.com/agentpool": "gpuh100",
        "topology.kubernetes.io/zone": "eastus-2",
    }
    assert (h100.node_count, h100.min_size, h100.max_size, h100.autoscaling) == (2, 0, None, False)
    assert h100.spot is True
    assert h100.issues == ()

    assert (a100.gpu_model, a100.gpus_per_node, a100.sharing) == ("A100-80GB", 1, "exclusive")
    assert (a100.node_count, a100.min_size, a100.max_size, a100.autoscaling) == (1, 1, 5, True)
    assert a100.spot is False

    assert (system.gpu_model, system.min_size, system.issues) == ("", 1, ())

    assert to_pool_spec(h100).sharing == "mig:all-3g.40gb"
    assert to_pool_spec(h100).node_count == 2


def test_resource_group_is_found_from_the_cluster_id(provider: Any, arm: FakeArm) -> None:
    cluster = provider.discover(ClusterLocator("aks", SUB, "eastus", CLUSTER))
    assert cluster.name == CLUSTER
    assert f"/resourceGroups/{RG}/" in arm.server.calls("GET", "/agentPools")[0].path


def test_credentials_use_an_entra_token_for_the_aks_server_app(
    provider: Any, arm: FakeArm, credential: RecordingCredential
) -> None:
    access = provider.credentials(LOCATOR)

    assert access.host == "https://aks-ml-dns-4f2b9c1d.hcp.eastus.azmk8s.io:443"
    assert access.token == "aks-entra-token"
    assert access.ca_data == CA_DATA
    assert access.expires_at == datetime.fromtimestamp(EXPIRES_ON, UTC)
    assert (AKS_SCOPE,) in credential.scopes
    assert "aks-entra-token" not in repr(access)
    (listing,) = arm.server.calls("POST", "/listClusterUserCredential")
    assert listing.path.endswith(f"/managedClusters/{CLUSTER}/listClusterUserCredential")


def test_scale_puts_the_whole_pool_back_with_the_new_count(provider: Any, arm: FakeArm) -> None:
    before = copy.deepcopy(arm.pools["gpuh100"]["properties"])

    started = time.monotonic()
    result = provider.scale_pool(LOCATOR, "gpuh100", 4)

    assert time.monotonic() - started < 10  # the poller followed Retry-After: 0
    assert (result.previous, result.desired, result.changed, result.clamped) == (2, 4, True, False)
    (put,) = arm.server.calls("PUT")
    assert put.path == f"{CLUSTER_ID}/agentPools/gpuh100"
    assert put.headers["if-match"] == '"etag-gpuh100-1"'  # a concurrent change fails instead of being lost
    sent = put.json()["properties"]
    # Every writable field the pool had goes back unchanged; only the count differs. The SDK leaves out
    # the read-only ones, which ARM would ignore anyway.
    assert sent == {**_writable(before), "count": 4}
    assert arm.server.calls("GET", "/operations/")  # the long-running update was polled to the end
    assert arm.pools["gpuh100"]["properties"]["provisioningState"] == "Succeeded"


def test_scale_to_the_current_size_sends_nothing(provider: Any, arm: FakeArm) -> None:
    result = provider.scale_pool(LOCATOR, "gpuh100", 2)
    assert (result.changed, result.previous, result.desired) == (False, 2, 2)
    assert arm.server.calls("PUT") == []


def test_autoscaled_pool_is_not_resized_by_count(provider: Any, arm: FakeArm) -> None:
    with pytest.raises(ScaleRefused, match="autoscaled"):
        provider.scale_pool(LOCATOR, "gpua100", 3)
    assert arm.server.calls("PUT") == []


def test_autoscaling_bounds_turn_the_autoscaler_on(provider: Any, arm: FakeArm) -> None:
    before = copy.deepcopy(arm.pools["gpuh100"]["properties"])
    provider.set_autoscaling_bounds(LOCATOR, "gpuh100", 3, 8)

    (put,) = arm.server.calls("PUT")
    assert put.json()["properties"] == {
        **_writable(before),
        "enableAutoScaling": True,
        "minCount": 3,
        "maxCount": 8,
        "count": 3,
    }

    provider.set_autoscaling_bounds(LOCATOR, "gpuh100", 3, 8)
    assert len(arm.server.calls("PUT")) == 1  # already so: no second PUT


def test_unknown_cluster_and_pool(provider: Any, arm: FakeArm) -> None:
    with pytest.raises(ClusterNotFound):
        provider.discover(ClusterLocator("aks", SUB, "eastus", "missing", resource_group=RG))
    with pytest.raises(ClusterNotFound):
        provider.discover(ClusterLocator("aks", SUB, "eastus", "missing"))
    with pytest.raises(PoolNotFound):
        provider.scale_pool(LOCATOR, "ghost", 1)
