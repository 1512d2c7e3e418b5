"""GKE adapter against a local fake of the GKE REST API, Compute Engine instance groups and the OAuth token
endpoint, through the real google-cloud-container (REST transport) and google-auth."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qs

import pytest
from google.auth.credentials import AnonymousCredentials
from google.oauth2 import service_account

from adapters.clouds import build_provider
from controlplane.domain.model import Taint
from controlplane.service.cloud_ports import (
    ClusterLocator,
    ClusterNotFound,
    PoolNotFound,
    ScaleRefused,
    UnmappablePool,
    to_pool_spec,
)
from tests.clouds.fakes import FakeServer, Recorded, Reply
from tests.clouds.keys import KeyPair

PROJECT = "ml-platform-prod"
LOCATION = "us-central1"
CLUSTER = "gke-train"
LOCATOR = ClusterLocator("gke", PROJECT, LOCATION, CLUSTER)
CLUSTER_PATH = f"/v1/projects/{PROJECT}/locations/{LOCATION}/clusters/{CLUSTER}"
CA = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIELTCCApWgAwIBAgIRAJ\n-----END CERTIFICATE-----\n").decode()
ACCESS_TOKEN = "ya29.c.b0AXv0zTExampleAccessToken"
SA_EMAIL = "gpufleet@ml-platform-prod.iam.gserviceaccount.com"
ZONES = ("us-central1-a", "us-central1-b", "us-central1-c")


def _node_pool(
    name: str, config: dict[str, Any], locations: list[str], sizes: list[int], **extra: Any
) -> dict[str, Any]:
    return {
        "name": name,
        "config": {
            "diskSizeGb": 200,
            "diskType": "pd-balanced",
            "imageType": "COS_CONTAINERD",
            "oauthScopes": ["https://www.googleapis.com/auth/cloud-platform"],
            "serviceAccount": "default",
            "metadata": {"disable-legacy-endpoints": "true"},
            "shieldedInstanceConfig": {"enableIntegrityMonitoring": True},
            **config,
        },
        "initialNodeCount": 1,
        "locations": locations,
        "selfLink": f"https://container.googleapis.com{CLUSTER_PATH}/nodePools/{name}",
        "version": "1.31.5-gke.1023000",
        "status": "RUNNING",
        "management": {"autoUpgrade": True, "autoRepair": True},
        "maxPodsConstraint": {"maxPodsPerNode": "110"},
        "podIpv4CidrSize": 24,
        "etag": f"etag-{name}",
        "_sizes": dict(zip(locations, sizes, strict=True)),
        **extra,
    }


def _initial_pools() -> dict[str, dict[str, Any]]:
    return {
        "h100-mig": _node_pool(
            "h100-mig",
            {
                "machineType": "a3-highgpu-8g",
                "accelerators": [
                    {
                        "acceleratorCount": "8",
                        "acceleratorType": "nvidia-h100-80gb",
                        "gpuPartitionSize": "1g.10gb",
                        "gpuDriverInstallationConfig": {"gpuDriverVersion": "LATEST"},
                    }
                ],
                "labels": {"team": "inference"},
                "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NO_SCHEDULE"}],
                "spot": True,
            },
            ["us-central1-a"],
            [2],
        ),
        "l4-shared": _node_pool(
            "l4-shared",
            {
                "machineType": "g2-standard-24",
                "accelerators": [
                    {
                        "acceleratorCount": "2",
                        "acceleratorType": "nvidia-l4",
                        "gpuSharingConfig": {"maxSharedClientsPerGpu": "4", "gpuSharingStrategy": "TIME_SHARING"},
                    }
                ],
                "taints": [
                    {"key": "nvidia.com/gpu", "value": "present", "effect": "NO_SCHEDULE"},
                    {"key": "workload", "value": "batch", "effect": "PREFER_NO_SCHEDULE"},
                ],
            },
            list(ZONES),
            [1, 1, 1],
            autoscaling={"enabled": True, "minNodeCount": 1, "maxNodeCount": 4, "locationPolicy": "BALANCED"},
        ),
        "default-pool": _node_pool("default-pool", {"machineType": "e2-standard-8"}, ["us-central1-a"], [3]),
    }


class FakeGoogle:
    """GKE v1 REST, Compute Engine instance group managers and the OAuth2 token endpoint on one port."""

    def __init__(self, key: KeyPair) -> None:
        self.key = key
        self.pools = _initial_pools()
        self.server = FakeServer(self.route)
        self.token_requests: list[dict[str, Any]] = []

    def pool_json(self, name: str) -> dict[str, Any]:
        pool = {k: v for k, v in self.pools[name].items() if k != "_sizes"}
        pool["instanceGroupUrls"] = [
            f"{self.server.url}/compute/v1/projects/{PROJECT}/zones/{zone}/instanceGroupManagers/gke-{CLUSTER}-{name}-grp"
            for zone in pool["locations"]
        ]
        return pool

    def cluster_json(self) -> dict[str, Any]:
        return {
            "name": CLUSTER,
            "location": LOCATION,
            "zone": LOCATION,
            "endpoint": "34.118.42.7",
            "initialClusterVersion": "1.31.5-gke.1023000",
            "currentMasterVersion": "1.31.5-gke.1023000",
            "currentNodeVersion": "1.31.5-gke.1023000",
            "status": "RUNNING",
            "selfLink": f"https://container.googleapis.com{CLUSTER_PATH}",
            "masterAuth": {"clusterCaCertificate": CA},
            "network": "default",
            "locations": list(ZONES),
            "nodePools": [self.pool_json(n) for n in self.pools],
            "createTime": "2025-11-03T09:12:44+00:00",
        }

    def route(self, request: Recorded) -> Reply:
        path = request.path
        if path == "/token":
            return self._token(request)
        assert request.headers.get("authorization", "").startswith("Bearer ") is (path.startswith("/compute/")), (
            "the API client is anonymous here; Compute calls carry the minted token"
        )
        if path.startswith("/compute/"):
            assert request.headers["authorization"] == f"Bearer {ACCESS_TOKEN}"
            zone, group = re.fullmatch(r".*/zones/([^/]+)/instanceGroupManagers/([^/]+)", path).groups()  # type: ignore[union-attr]
            pool = group.removeprefix(f"gke-{CLUSTER}-").removesuffix("-grp")
            size = self.pools[pool]["_sizes"][zone]
            return Reply(body={"kind": "compute#instanceGroupManager", "name": group, "zone": zone, "targetSize": size})
        if path == f"/v1/projects/{PROJECT}/locations/-/clusters":
            return Reply(body={"clusters": [self.cluster_json()]})
        if path == CLUSTER_PATH:
            return Reply(body=self.cluster_json())
        if path == f"{CLUSTER_PATH}/nodePools":
            return Reply(body={"nodePools": [self.pool_json(n) for n in self.pools]})
        match = re.fullmatch(rf"{CLUSTER_PATH}/nodePools/([a-z0-9-]+)(:\w+)?", path)
        if match and match.group(1) in self.pools:
            name, verb = match.groups()
            if verb == ":setSize":
                for zone in self.pools[name]["_sizes"]:
                    self.pools[name]["_sizes"][zone] = int(request.json()["nodeCount"])
                return Reply(body=self._operation("SET_NODE_POOL_SIZE", name))
            if verb == ":setAutoscaling":
                self.pools[name]["autoscaling"] = request.json()["autoscaling"]
                return Reply(body=self._operation("SET_NODE_POOL_MANAGEMENT", name))
            return Reply(body=self.pool_json(name))
        return Reply(404, {"error": {"code": 404, "message": f"Not found: {path}.", "status": "NOT_FOUND"}})

    def _operation(self, kind: str, pool: str) -> dict[str, Any]:
        return {
            "name": "operation-1767225600000-6a1b2c3d",
            "zone": LOCATION,
            "operationType": kind,
            "status": "RUNNING",
            "selfLink": f"https://container.googleapis.com/v1/projects/{PROJECT}/locations/{LOCATION}/operations/x",
            "targetLink": f"https://container.googleapis.com{CLUSTER_PATH}/nodePools/{pool}",
            "startTime": "2026-01-01T00:00:00.000000Z",
        }

    def _token(self, request: Recorded) -> Reply:
        form = {k: v[0] for k, v in parse_qs(request.body.decode()).items()}
        assert form["grant_type"] == "urn:ietf:params:oauth:grant-type:jwt-bearer"
        header_b64, claims_b64, signature = form["assertion"].split(".")
        assert self.key.verify_urlsafe(signature, f"{header_b64}.{claims_b64}".encode()), "assertion not signed"
        claims = json.loads(base64.urlsafe_b64decode(claims_b64 + "=" * (-len(claims_b64) % 4)))
        self.token_requests.append(claims)
        return Reply(body={"access_token": ACCESS_TOKEN, "expires_in": 3599, "token_type": "Bearer"})


@pytest.fixture
def google(rsa_key: KeyPair) -> Iterator[FakeGoogle]:
    fake = FakeGoogle(rsa_key)
    fake.server.start()
    yield fake
    fake.server.stop()


@pytest.fixture
def provider(google: FakeGoogle, rsa_key: KeyPair) -> Any:
    credentials = service_account.Credentials.from_service_account_info(  # type: ignore[no-untyped-call]
        {
            "type": "service_account",
            "project_id": PROJECT,
            "private_key_id": "3f1e0c9a7b",
            "private_key": rsa_key.private_pem,
            "client_email": SA_EMAIL,
            "client_id": "108263544179310577265",
            "token_uri": f"{google.server.url}/token",
        }
    )
    return build_provider(
        "gke",
        api_endpoint=google.server.url,
        transport="rest",
        credentials=credentials,
        client_credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
    )


def test_lists_clusters_across_locations(provider: Any, google: FakeGoogle) -> None:
    assert provider.list_clusters(PROJECT, "") == [LOCATOR]
    (call,) = google.server.calls("GET", "/clusters")
    assert call.path == f"/v1/projects/{PROJECT}/locations/-/clusters"


def test_discovers_cluster_and_node_pools(provider: Any, google: FakeGoogle) -> None:
    cluster = provider.discover(LOCATOR)

    assert cluster.name == CLUSTER
    assert cluster.endpoint == "https://34.118.42.7"
    assert cluster.ca_data == CA
    assert (cluster.version, cluster.status) == ("1.31.5-gke.1023000", "RUNNING")
    assert [p.name for p in cluster.pools] == ["default-pool", "h100-mig", "l4-shared"]
    default, h100, l4 = cluster.pools

    assert (h100.gpu_model, h100.gpus_per_node, h100.instance_type) == ("H100-80GB", 8, "a3-highgpu-8g")
    assert h100.sharing == "mig:all-1g.10gb"
    assert (h100.cpu_millis, h100.memory_mib) == (208_000, 1872 * 1024)
    assert h100.taints == (Taint("nvidia.com/gpu", "present", "NoSchedule"),)
    assert h100.labels == {
        "team": "inference",
        "cloud.google.com/gke-nodepool": "h100-mig",
        "topology.kubernetes.io/zone": "us-central1-a",
    }
    assert (h100.node_count, h100.min_size, h100.max_size, h100.autoscaling) == (2, 0, None, False)
    assert (h100.spot, h100.status, h100.issues) == (True, "RUNNING", ())

    assert (l4.gpu_model, l4.gpus_per_node, l4.sharing) == ("L4", 2, "timeslice:4")
    assert (l4.cpu_millis, l4.memory_mib) == (24_000, 96 * 1024)
    assert l4.taints == (
        Taint("nvidia.com/gpu", "present", "NoSchedule"),
        Taint("workload", "batch", "PreferNoSchedule"),
    )
    assert l4.labels == {"cloud.google.com/gke-nodepool": "l4-shared"}  # three zones: no zone label
    # Sizes are whole-pool: 1 node in each of 3 zones; per-zone bounds 1..4 become 3..12.
    assert (l4.node_count, l4.min_size, l4.max_size, l4.autoscaling) == (3, 3, 12, True)
    assert l4.spot is False

    assert (default.gpu_model, default.gpus_per_node, default.node_count) == ("", 0, 3)
    with pytest.raises(UnmappablePool):
        to_pool_spec(default)
    assert to_pool_spec(l4).sharing == "timeslice:4"

    # Node counts were read from each pool's instance groups, with the minted token.
    assert len(google.server.calls("GET", "/compute/")) == 5


def test_access_token_is_minted_with_the_gke_scopes_and_reused(provider: Any, google: FakeGoogle) -> None:
    before = datetime.now(UTC)
    access = provider.credentials(LOCATOR)

    assert access.host == "https://34.118.42.7"
    assert access.token == ACCESS_TOKEN
    assert access.ca_data == CA
    assert before + timedelta(seconds=3500) < access.expires_at <= datetime.now(UTC) + timedelta(seconds=3600)
    (claims,) = google.token_requests
    assert claims["iss"] == SA_EMAIL
    assert claims["aud"] == "https://oauth2.googleapis.com/token"  # google-auth's fixed audience
    assert claims["scope"].split() == [
        "https://www.googleapis.com/auth/cloud-platform",
        "https://www.googleapis.com/auth/userinfo.email",
    ]

    provider.credentials(LOCATOR)
    assert len(google.token_requests) == 1  # still valid: not refreshed again


def test_scale_sends_the_per_zone_count(provider: Any, google: FakeGoogle) -> None:
    result = provider.scale_pool(LOCATOR, "l4-shared", 6)

    assert (result.previous, result.desired, result.changed, result.clamped) == (3, 6, True, False)
    assert result.operation == "operation-1767225600000-6a1b2c3d"
    (call,) = google.server.calls("POST", ":set")
    assert call.path == f"{CLUSTER_PATH}/nodePools/l4-shared:setSize"
    assert call.json() == {"nodeCount": 2}  # 2 in each of the pool's 3 zones; the name travels in the path
    assert call.query["$alt"] == ["json;enum-encoding=int"]


def test_scale_idempotence_clamp_and_refusals(provider: Any, google: FakeGoogle) -> None:
    assert provider.scale_pool(LOCATOR, "l4-shared", 3).changed is False
    assert google.server.calls("POST", ":set") == []

    clamped = provider.scale_pool(LOCATOR, "l4-shared", 20)
    assert (clamped.desired, clamped.clamped) == (12, True)
    assert google.server.calls("POST", ":set")[0].json()["nodeCount"] == 4

    with pytest.raises(ScaleRefused, match="multiple of 3"):
        provider.scale_pool(LOCATOR, "l4-shared", 7)
    with pytest.raises(ScaleRefused, match="below its minimum of 3"):
        provider.scale_pool(LOCATOR, "l4-shared", 2)
    assert len(google.server.calls("POST", ":set")) == 1


def test_autoscaling_bounds_are_pool_totals(provider: Any, google: FakeGoogle) -> None:
    provider.set_autoscaling_bounds(LOCATOR, "h100-mig", 1, 6)

    (call,) = google.server.calls("POST", ":set")
    assert call.path == f"{CLUSTER_PATH}/nodePools/h100-mig:setAutoscaling"
    assert call.json()["autoscaling"] == {"enabled": True, "totalMinNodeCount": 1, "totalMaxNodeCount": 6}

    provider.set_autoscaling_bounds(LOCATOR, "h100-mig", 1, 6)
    assert len(google.server.calls("POST", ":set")) == 1  # already so


def test_unknown_cluster_and_pool(provider: Any) -> None:
    with pytest.raises(ClusterNotFound):
        provider.discover(ClusterLocator("gke", PROJECT, LOCATION, "missing"))
    with pytest.raises(PoolNotFound):
        provider.scale_pool(LOCATOR, "ghost", 1)
