"""OKE adapter against a local fake of the OCI Container Engine REST API, through the real oci SDK.
The fake checks every request's OCI signature with the test key, as OCI would."""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
import yaml

from adapters.clouds import build_provider
from controlplane.service.cloud_ports import (
    ClusterLocator,
    ClusterNotFound,
    PoolNotFound,
    ScaleRefused,
    autoscaling_bounds,
    to_pool_spec,
)
from tests.clouds.fakes import FakeServer, Recorded, Reply
from tests.clouds.keys import KeyPair

REGION = "us-ashburn-1"
TENANCY = "ocid1.tenancy.oc1..aaaaaaaa3vi3ft3yi3sq4nhiql4nvbzjz6gipbn5fmy6ozm6mwgzahrzngxa"
USER = "ocid1.user.oc1..aaaaaaaaq4yo7ogcz3hqvbyxzcl3wbcfqvsejbkbh5gmxu6jcgzhkprfmtta"
COMPARTMENT = "ocid1.compartment.oc1..aaaaaaaakmkt3lsbnqgyejupwyvw2ylwdscw3yccwbq2abvcbkfqrxqcxrva"
CLUSTER_ID = "ocid1.cluster.oc1.iad.aaaaaaaa2ffb5slbxz3ftwzc6jn5qg4y7mwbzdcsvtfoh5r3mbqlxtbx4nfa"
CLUSTER = "oke-gpu"
LOCATOR = ClusterLocator("oke", COMPARTMENT, REGION, CLUSTER)
CA = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIDiDCCAnCgAwIBAgIUPt\n-----END CERTIFICATE-----\n").decode()
API = "/20180222"


def _pool_id(name: str) -> str:
    return f"ocid1.nodepool.oc1.iad.aaaaaaaa{hashlib.sha256(name.encode()).hexdigest()[:40]}"


def _node_pool(name: str, shape: str, size: int, **extra: Any) -> dict[str, Any]:
    placement: dict[str, Any] = {
        "availabilityDomain": "Uocm:US-ASHBURN-AD-1",
        "subnetId": "ocid1.subnet.oc1.iad.aaaaaaaawork",
        "faultDomains": ["FAULT-DOMAIN-1", "FAULT-DOMAIN-2"],
    }
    if extra.pop("preemptible", False):
        placement["preemptibleNodeConfig"] = {"preemptionAction": {"type": "TERMINATE", "isPreserveBootVolume": False}}
    return {
        "id": _pool_id(name),
        "compartmentId": COMPARTMENT,
        "clusterId": CLUSTER_ID,
        "name": name,
        "kubernetesVersion": "v1.31.1",
        "nodeShape": shape,
        "nodeSourceDetails": {
            "sourceType": "IMAGE",
            "imageId": "ocid1.image.oc1.iad.aaaaaaaagpu",
            "bootVolumeSizeInGBs": 500,
        },
        "nodeConfigDetails": {"size": size, "placementConfigs": [placement], "isPvEncryptionInTransitEnabled": False},
        "lifecycleState": "ACTIVE",
        "freeformTags": {},
        "definedTags": {},
        **extra,
    }


def _initial_pools() -> list[dict[str, Any]]:
    return [
        _node_pool(
            "h100",
            "BM.GPU.H100.8",
            2,
            initialNodeLabels=[
                {"key": "team", "value": "llm"},
                {"key": "topology.kubernetes.io/zone", "value": "AD-1"},
            ],
        ),
        _node_pool("a10-spot", "VM.GPU.A10.2", 1, preemptible=True),
        _node_pool("system", "VM.Standard.E4.Flex", 3, nodeShapeConfig={"ocpus": 4.0, "memoryInGBs": 64.0}),
        _node_pool("retired", "BM.GPU4.8", 0, lifecycleState="DELETED"),
    ]


def _kubeconfig() -> str:
    # OKE's kubeconfig: the user runs `oci ce cluster generate-token`, which gpufleet never executes.
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "",
            "clusters": [
                {
                    "name": "cluster-c2ffb5slbxz",
                    "cluster": {"server": "https://129.213.10.5:6443", "certificate-authority-data": CA},
                }
            ],
            "users": [
                {
                    "name": "user-c2ffb5slbxz",
                    "user": {
                        "exec": {
                            "apiVersion": "client.authentication.k8s.io/v1beta1",
                            "command": "oci",
                            "args": ["ce", "cluster", "generate-token", "--cluster-id", CLUSTER_ID, "--region", REGION],
                            "env": [],
                        }
                    },
                }
            ],
            "contexts": [
                {
                    "name": "context-c2ffb5slbxz",
                    "context": {"cluster": "cluster-c2ffb5slbxz", "user": "user-c2ffb5slbxz"},
                }
            ],
            "current-context": "context-c2ffb5slbxz",
        }
    )


def _signature_fields(authorization: str) -> dict[str, str]:
    assert authorization.startswith("Signature ")
    return dict(re.findall(r'(\w+)="([^"]*)"', authorization))


class FakeOci:
    """Container Engine's REST API for clusters, node pools and kubeconfigs; node pools are paginated two
    to a page, as `limit`/`opc-next-page` work in OCI."""

    def __init__(self, key: KeyPair) -> None:
        self.key = key
        self.pools = _initial_pools()
        self.server = FakeServer(self.route)

    def key_id(self) -> str:
        return f"{TENANCY}/{USER}/{self.key.fingerprint}"

    def verify(self, request: Recorded) -> None:
        fields = _signature_fields(request.headers["authorization"])
        assert fields["keyId"] == self.key_id()
        assert fields["algorithm"] == "rsa-sha256"
        lines = []
        for name in fields["headers"].split():
            value = (
                f"{request.method.lower()} {request.target}" if name == "(request-target)" else request.headers[name]
            )
            lines.append(f"{name}: {value}")
        assert self.key.verify(fields["signature"], "\n".join(lines).encode()), "bad OCI signature"
        if request.method in ("PUT", "POST"):
            assert fields["headers"].split()[3:] == ["content-length", "content-type", "x-content-sha256"]
            assert (
                request.headers["x-content-sha256"] == base64.b64encode(hashlib.sha256(request.body).digest()).decode()
            )

    def cluster_json(self) -> dict[str, Any]:
        return {
            "id": CLUSTER_ID,
            "name": CLUSTER,
            "compartmentId": COMPARTMENT,
            "vcnId": "ocid1.vcn.oc1.iad.aaaaaaaavcn",
            "kubernetesVersion": "v1.31.1",
            "lifecycleState": "ACTIVE",
            "type": "ENHANCED_CLUSTER",
            "endpoints": {"publicEndpoint": "129.213.10.5:6443", "privateEndpoint": "10.0.0.12:6443"},
            "endpointConfig": {"subnetId": "ocid1.subnet.oc1.iad.aaaaaaaaapi", "isPublicIpEnabled": True},
            "availableKubernetesUpgrades": ["v1.32.1"],
        }

    def route(self, request: Recorded) -> Reply:
        self.verify(request)
        query = {k: v[0] for k, v in request.query.items()}
        if request.path == f"{API}/clusters" and request.method == "GET":
            assert query["compartmentId"] == COMPARTMENT
            found = [self.cluster_json()] if query.get("name", CLUSTER) == CLUSTER else []
            return Reply(body=found, headers=(("opc-request-id", "fake/req/1"),))
        if request.path == f"{API}/nodePools" and request.method == "GET":
            assert (query["compartmentId"], query["clusterId"]) == (COMPARTMENT, CLUSTER_ID)
            pools = [p for p in self.pools if query.get("name", p["name"]) == p["name"]]
            start = int(query.get("page", "0"))
            headers: tuple[tuple[str, str], ...] = (("opc-request-id", "fake/req/2"),)
            if start + 2 < len(pools):
                headers += (("opc-next-page", str(start + 2)),)
            return Reply(body=pools[start : start + 2], headers=headers)
        if request.path == f"{API}/clusters/{CLUSTER_ID}/kubeconfig/content" and request.method == "POST":
            return Reply(body=_kubeconfig(), content_type="application/x-yaml")
        match = re.fullmatch(rf"{API}/nodePools/([\w.]+)", request.path)
        if match and request.method == "PUT":
            pool = next(p for p in self.pools if p["id"] == match.group(1))
            pool["nodeConfigDetails"]["size"] = request.json()["nodeConfigDetails"]["size"]
            return Reply(202, "", headers=(("opc-work-request-id", "ocid1.clustersworkrequest.oc1.iad.aaaawr1"),))
        return Reply(
            404, {"code": "NotAuthorizedOrNotFound", "message": "Authorization failed or requested resource not found."}
        )


@pytest.fixture
def oci_fake(rsa_key: KeyPair) -> Iterator[FakeOci]:
    fake = FakeOci(rsa_key)
    fake.server.start()
    yield fake
    fake.server.stop()


@pytest.fixture
def provider(oci_fake: FakeOci, rsa_key: KeyPair, tmp_path: Path) -> Any:
    key_file = tmp_path / "oci_api_key.pem"
    key_file.write_text(rsa_key.private_pem)
    config = {
        "user": USER,
        "fingerprint": rsa_key.fingerprint,
        "key_file": str(key_file),
        "tenancy": TENANCY,
        "region": REGION,
    }
    return build_provider("oke", config=config, service_endpoint=oci_fake.server.url)


def test_lists_clusters_of_the_compartment(provider: Any, oci_fake: FakeOci) -> None:
    assert provider.list_clusters(COMPARTMENT, REGION) == [
        ClusterLocator("oke", COMPARTMENT, REGION, CLUSTER, cluster_id=CLUSTER_ID)
    ]
    (call,) = oci_fake.server.calls("GET", "/clusters")
    assert call.path == f"{API}/clusters"
    assert call.query["compartmentId"] == [COMPARTMENT]


def test_discovers_cluster_and_node_pools(provider: Any, oci_fake: FakeOci) -> None:
    cluster = provider.discover(LOCATOR)

    assert cluster.name == CLUSTER
    assert cluster.endpoint == "https://129.213.10.5:6443"
    assert (cluster.ca_data, cluster.version, cluster.status) == ("", "v1.31.1", "ACTIVE")
    assert [p.name for p in cluster.pools] == ["a10-spot", "h100", "system"]  # the deleted pool is gone
    a10, h100, system = cluster.pools

    assert (h100.gpu_model, h100.gpus_per_node, h100.instance_type) == ("H100-80GB", 8, "BM.GPU.H100.8")
    assert (h100.cpu_millis, h100.memory_mib) == (224_000, 2048 * 1024)
    assert h100.labels == {"team": "llm", "topology.kubernetes.io/zone": "AD-1"}
    assert (h100.taints, h100.sharing) == ((), "exclusive")
    assert (h100.node_count, h100.min_size, h100.max_size, h100.spot) == (2, 0, None, False)
    assert h100.pool_id == _pool_id("h100")

    assert (a10.gpu_model, a10.gpus_per_node, a10.spot) == ("A10", 2, True)
    assert (a10.cpu_millis, a10.memory_mib) == (60_000, 480 * 1024)

    assert (system.gpu_model, system.cpu_millis, system.memory_mib) == ("", 8000, 64 * 1024)

    assert to_pool_spec(h100).gpus_per_node == 8
    # Four pools, two a page: the SDK followed opc-next-page.
    pages = oci_fake.server.calls("GET", "/nodePools")
    assert [c.query.get("page") for c in pages] == [None, ["2"]]


def test_token_is_a_signed_cluster_request_and_no_exec_runs(provider: Any, oci_fake: FakeOci, rsa_key: KeyPair) -> None:
    before = datetime.now(UTC)
    access = provider.credentials(LOCATOR)

    assert access.host == "https://129.213.10.5:6443"
    assert access.ca_data == CA
    assert before + timedelta(minutes=4) <= access.expires_at <= datetime.now(UTC) + timedelta(minutes=4)
    (kubeconfig_call,) = oci_fake.server.calls("POST", "/kubeconfig/content")
    assert kubeconfig_call.json() == {"tokenVersion": "2.0.0", "endpoint": "PUBLIC_ENDPOINT"}

    url = base64.urlsafe_b64decode(access.token).decode()
    parts = urlsplit(url)
    assert (parts.scheme, parts.netloc, parts.path) == (
        "https",
        f"containerengine.{REGION}.oraclecloud.com",
        f"/cluster_request/{CLUSTER_ID}",
    )
    query = dict(parse_qsl(parts.query))
    assert set(query) == {"authorization", "date"}
    fields = _signature_fields(query["authorization"])
    assert fields["keyId"] == f"{TENANCY}/{USER}/{rsa_key.fingerprint}"
    assert fields["headers"] == "date (request-target) host"
    signed = (
        f"date: {query['date']}\n(request-target): get /cluster_request/{CLUSTER_ID}\n"
        f"host: containerengine.{REGION}.oraclecloud.com"
    )
    assert rsa_key.verify(fields["signature"], signed.encode())
    assert not rsa_key.verify(fields["signature"], signed.replace(CLUSTER_ID, "ocid1.cluster.other").encode())


def test_scale_updates_the_node_config_size(provider: Any, oci_fake: FakeOci) -> None:
    result = provider.scale_pool(LOCATOR, "h100", 4)

    assert (result.previous, result.desired, result.changed) == (2, 4, True)
    assert result.operation == "ocid1.clustersworkrequest.oc1.iad.aaaawr1"
    (put,) = oci_fake.server.calls("PUT")
    assert put.path == f"{API}/nodePools/{_pool_id('h100')}"
    assert put.json() == {"nodeConfigDetails": {"size": 4}}
    lookup = oci_fake.server.calls("GET", "/nodePools")[-1]
    assert lookup.query["name"] == ["h100"]


def test_scale_to_the_current_size_sends_nothing(provider: Any, oci_fake: FakeOci) -> None:
    assert provider.scale_pool(LOCATOR, "h100", 2).changed is False
    with pytest.raises(ScaleRefused):
        provider.scale_pool(LOCATOR, "h100", -1)
    assert oci_fake.server.calls("PUT") == []


def test_oke_offers_no_autoscaling_bounds(provider: Any) -> None:
    assert autoscaling_bounds(provider) is None


def test_unknown_cluster_and_pool(provider: Any) -> None:
    with pytest.raises(ClusterNotFound):
        provider.discover(ClusterLocator("oke", COMPARTMENT, REGION, "missing"))
    with pytest.raises(PoolNotFound):
        provider.scale_pool(LOCATOR, "retired", 1)
