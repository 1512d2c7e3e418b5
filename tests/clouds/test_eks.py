"""EKS adapter against moto in server mode: real boto3 calls over HTTP to a local endpoint."""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit

import boto3
import pytest
import requests
from moto.server import ThreadedMotoServer

from adapters.clouds import build_provider
from adapters.clouds.eks import EksProvider
from controlplane.domain.model import Taint
from controlplane.service.cloud_ports import (
    ClusterLocator,
    ClusterNotFound,
    PoolNotFound,
    ScaleRefused,
    UnmappablePool,
    to_pool_spec,
)

REGION = "us-west-2"
ACCOUNT = "123456789012"
ACCESS_KEY = "AKIAIOSFODNN7EXAMPLE"
SECRET_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
CLUSTER = "train-west"
LOCATOR = ClusterLocator("eks", ACCOUNT, REGION, CLUSTER)
OTHER_CLUSTER = "infer-west"


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture(scope="module")
def session() -> boto3.session.Session:
    return boto3.session.Session(aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)


@pytest.fixture(scope="module")
def seeded(moto_url: str, session: boto3.session.Session) -> Any:
    """One cluster: an H100 spot node group with taints, a mixed g5 group and a CPU group. Built once per
    module because moto takes seconds to create them on a busy machine."""
    requests.post(f"{moto_url}/moto-api/reset", timeout=10).raise_for_status()
    client = session.client("eks", region_name=REGION, endpoint_url=moto_url)
    client.create_cluster(
        name=CLUSTER,
        version="1.31",
        roleArn=f"arn:aws:iam::{ACCOUNT}:role/eks-cluster",
        resourcesVpcConfig={"subnetIds": ["subnet-0a1b2c3d", "subnet-4e5f6a7b"]},
    )
    client.create_cluster(
        name=OTHER_CLUSTER,
        version="1.32",
        roleArn=f"arn:aws:iam::{ACCOUNT}:role/eks-cluster",
        resourcesVpcConfig={"subnetIds": ["subnet-0a1b2c3d"]},
    )
    common = {
        "clusterName": CLUSTER,
        "nodeRole": f"arn:aws:iam::{ACCOUNT}:role/eks-node",
        "subnets": ["subnet-0a1b2c3d"],
    }
    client.create_nodegroup(
        nodegroupName="h100",
        scalingConfig={"minSize": 1, "maxSize": 4, "desiredSize": 2},
        instanceTypes=["p5.48xlarge"],
        amiType="AL2023_x86_64_NVIDIA",
        capacityType="SPOT",
        labels={"team": "research", "topology.kubernetes.io/zone": "us-west-2a"},
        taints=[
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NO_SCHEDULE"},
            {"key": "dedicated", "value": "training", "effect": "PREFER_NO_SCHEDULE"},
        ],
        **common,
    )
    client.create_nodegroup(
        nodegroupName="a10g-mixed",
        scalingConfig={"minSize": 0, "maxSize": 10, "desiredSize": 0},
        instanceTypes=["g5.2xlarge", "g5.xlarge"],
        amiType="BOTTLEROCKET_x86_64_NVIDIA",
        **common,
    )
    client.create_nodegroup(
        nodegroupName="system",
        scalingConfig={"minSize": 2, "maxSize": 3, "desiredSize": 2},
        instanceTypes=["m6i.xlarge"],
        amiType="AL2023_x86_64_STANDARD",
        **common,
    )
    return client


@pytest.fixture
def eks(seeded: Any) -> Any:
    """The seeded cluster with the H100 group back at its initial size, whatever the previous test did."""
    seeded.update_nodegroup_config(
        clusterName=CLUSTER, nodegroupName="h100", scalingConfig={"minSize": 1, "maxSize": 4, "desiredSize": 2}
    )
    return seeded


class CountingClients:
    """Real boto3 clients against moto that count the EKS operations they send."""

    def __init__(self, session: boto3.session.Session, url: str) -> None:
        self.session, self.url = session, url
        self.operations: list[str] = []

    def __call__(self, service: str, region: str) -> Any:
        client = self.session.client(service, region_name=region, endpoint_url=self.url)
        client.meta.events.register("before-call.eks.*", self._count)
        return client

    def _count(self, model: Any, **_: Any) -> None:
        self.operations.append(model.name)


@pytest.fixture
def counted(session: boto3.session.Session, moto_url: str, eks: Any) -> tuple[EksProvider, CountingClients]:
    clients = CountingClients(session, moto_url)
    return EksProvider(clients), clients


def provider_for(session: boto3.session.Session, moto_url: str) -> Any:
    return build_provider("eks", endpoint_url=moto_url, sts_endpoint_url=moto_url, session=session)


def test_lists_the_clusters_of_the_region(eks: Any, session: boto3.session.Session, moto_url: str) -> None:
    assert provider_for(session, moto_url).list_clusters(ACCOUNT, REGION) == [
        ClusterLocator("eks", ACCOUNT, REGION, OTHER_CLUSTER),
        LOCATOR,
    ]
    assert provider_for(session, moto_url).list_clusters(ACCOUNT, "eu-west-1") == []


def test_discovers_cluster_and_node_groups(eks: Any, session: boto3.session.Session, moto_url: str) -> None:
    described = eks.describe_cluster(name=CLUSTER)["cluster"]
    cluster = provider_for(session, moto_url).discover(LOCATOR)

    assert cluster.name == CLUSTER
    assert cluster.endpoint == described["endpoint"]
    assert cluster.ca_data == described["certificateAuthority"]["data"]
    assert cluster.version == "1.31"
    assert cluster.status == "ACTIVE"
    assert [p.name for p in cluster.pools] == ["a10g-mixed", "h100", "system"]

    mixed, h100, system = cluster.pools
    assert h100.gpu_model == "H100-80GB"
    assert h100.gpus_per_node == 8
    assert h100.instance_type == "p5.48xlarge"
    assert h100.sharing == "exclusive"
    assert h100.cpu_millis == 192_000
    assert h100.memory_mib == 2048 * 1024
    assert h100.taints == (
        Taint("nvidia.com/gpu", "present", "NoSchedule"),
        Taint("dedicated", "training", "PreferNoSchedule"),
    )
    assert h100.labels == {
        "team": "research",
        "topology.kubernetes.io/zone": "us-west-2a",
        "eks.amazonaws.com/nodegroup": "h100",
    }
    assert (h100.node_count, h100.min_size, h100.max_size) == (2, 1, 4)
    assert h100.spot is True
    assert h100.status == "ACTIVE"
    assert h100.issues == ()

    # Two sizes of one GPU shape: planned with the smaller one's CPU and memory.
    assert (mixed.gpu_model, mixed.gpus_per_node) == ("A10G", 1)
    assert (mixed.cpu_millis, mixed.memory_mib) == (4000, 16 * 1024)
    assert mixed.spot is False
    assert mixed.taints == ()

    assert (system.gpu_model, system.gpus_per_node, system.issues) == ("", 0, ())


def test_discovered_gpu_pool_becomes_a_pool_spec(eks: Any, session: boto3.session.Session, moto_url: str) -> None:
    pools = {p.name: p for p in provider_for(session, moto_url).discover(LOCATOR).pools}

    spec = to_pool_spec(pools["h100"])
    assert spec.model_dump() == {
        "name": "h100",
        "gpu_model": "H100-80GB",
        "gpus_per_node": 8,
        "cpu_millis": 192_000,
        "memory_mib": 2_097_152,
        "sharing": "exclusive",
        "taints": [
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
            {"key": "dedicated", "value": "training", "effect": "PreferNoSchedule"},
        ],
        "labels": pools["h100"].labels,
        "price_per_gpu_hour": 0.0,
        "spot": True,
        "node_count": 2,
    }
    with pytest.raises(UnmappablePool, match="no GPUs"):
        to_pool_spec(pools["system"])


def _canonical_query(query: str) -> str:
    pairs = sorted((k, v) for k, v in parse_qsl(query, keep_blank_values=True) if k != "X-Amz-Signature")
    return "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in pairs)


def _sigv4_signature(url: str, cluster_header: str, secret: str) -> str:
    """Recompute the SigV4 query signature, as STS does, for the URL sent with `x-k8s-aws-id`."""
    parts = urlsplit(url)
    params = dict(parse_qsl(parts.query))
    date_stamp, region, service, _ = params["X-Amz-Credential"].split("/")[1:]
    canonical = "\n".join(
        [
            "GET",
            parts.path or "/",
            _canonical_query(parts.query),
            f"host:{parts.netloc}\nx-k8s-aws-id:{cluster_header}\n",
            params["X-Amz-SignedHeaders"],
            hashlib.sha256(b"").hexdigest(),
        ]
    )
    scope = f"{date_stamp}/{region}/{service}/aws4_request"
    to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", params["X-Amz-Date"], scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key = f"AWS4{secret}".encode()
    for part in (date_stamp, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()


def test_token_is_a_presigned_get_caller_identity_bound_to_the_cluster(
    eks: Any, session: boto3.session.Session, moto_url: str
) -> None:
    before = datetime.now(UTC)
    access = provider_for(session, moto_url).credentials(LOCATOR)
    described = eks.describe_cluster(name=CLUSTER)["cluster"]

    assert access.host == described["endpoint"]
    assert access.ca_data == described["certificateAuthority"]["data"]
    assert before + timedelta(minutes=14) <= access.expires_at <= datetime.now(UTC) + timedelta(minutes=14)
    assert access.token not in repr(access)

    prefix, _, encoded = access.token.partition(".")
    assert prefix == "k8s-aws-v1"
    assert "=" not in encoded  # base64url without padding, as aws-cli emits
    url = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
    parts = urlsplit(url)
    params = dict(parse_qsl(parts.query))
    assert f"{parts.scheme}://{parts.netloc}" == moto_url
    assert params["Action"] == "GetCallerIdentity"
    assert params["Version"] == "2011-06-15"
    assert params["X-Amz-Algorithm"] == "AWS4-HMAC-SHA256"
    assert params["X-Amz-Expires"] == "60"
    assert params["X-Amz-SignedHeaders"] == "host;x-k8s-aws-id"
    assert params["X-Amz-Credential"].startswith(f"{ACCESS_KEY}/")
    assert params["X-Amz-Credential"].endswith(f"/{REGION}/sts/aws4_request")
    assert "x-k8s-aws-id" not in params  # moved to the signed header, not left in the query
    # The signature covers the cluster name: it verifies for this cluster and for no other.
    assert params["X-Amz-Signature"] == _sigv4_signature(url, CLUSTER, SECRET_KEY)
    assert params["X-Amz-Signature"] != _sigv4_signature(url, "another-cluster", SECRET_KEY)


def test_one_cached_sts_client_binds_each_token_to_its_own_cluster(
    eks: Any, session: boto3.session.Session, moto_url: str
) -> None:
    provider = provider_for(session, moto_url)
    for name in (CLUSTER, OTHER_CLUSTER, CLUSTER):
        token = provider.credentials(ClusterLocator("eks", ACCOUNT, REGION, name)).token
        encoded = token.removeprefix("k8s-aws-v1.")
        url = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
        assert dict(parse_qsl(urlsplit(url).query))["X-Amz-Signature"] == _sigv4_signature(url, name, SECRET_KEY)


def test_scales_a_node_group_and_skips_the_call_when_already_there(
    counted: tuple[EksProvider, CountingClients], eks: Any
) -> None:
    provider, clients = counted

    result = provider.scale_pool(LOCATOR, "h100", 3)
    assert (result.previous, result.requested, result.desired) == (2, 3, 3)
    assert result.changed
    assert not result.clamped
    assert result.operation  # the update id to poll
    scaling = eks.describe_nodegroup(clusterName=CLUSTER, nodegroupName="h100")["nodegroup"]["scalingConfig"]
    assert scaling == {"minSize": 1, "maxSize": 4, "desiredSize": 3}
    assert clients.operations.count("UpdateNodegroupConfig") == 1

    again = provider.scale_pool(LOCATOR, "h100", 3)
    assert (again.changed, again.operation) == (False, "")
    assert clients.operations.count("UpdateNodegroupConfig") == 1  # nothing sent the second time


def test_scale_clamps_to_max_and_refuses_below_min(counted: tuple[EksProvider, CountingClients], eks: Any) -> None:
    provider, clients = counted

    result = provider.scale_pool(LOCATOR, "h100", 10)
    assert (result.requested, result.desired, result.clamped) == (10, 4, True)
    assert (
        eks.describe_nodegroup(clusterName=CLUSTER, nodegroupName="h100")["nodegroup"]["scalingConfig"]["desiredSize"]
        == 4
    )

    with pytest.raises(ScaleRefused, match="below its minimum of 1"):
        provider.scale_pool(LOCATOR, "h100", 0)
    with pytest.raises(ScaleRefused, match="negative"):
        provider.scale_pool(LOCATOR, "a10g-mixed", -1)
    assert clients.operations.count("UpdateNodegroupConfig") == 1


def test_autoscaling_bounds_move_the_size_inside_them(counted: tuple[EksProvider, CountingClients], eks: Any) -> None:
    provider, clients = counted

    provider.set_autoscaling_bounds(LOCATOR, "h100", 3, 6)
    scaling = eks.describe_nodegroup(clusterName=CLUSTER, nodegroupName="h100")["nodegroup"]["scalingConfig"]
    assert scaling == {"minSize": 3, "maxSize": 6, "desiredSize": 3}

    provider.set_autoscaling_bounds(LOCATOR, "h100", 3, 6)
    assert clients.operations.count("UpdateNodegroupConfig") == 1
    with pytest.raises(ScaleRefused):
        provider.set_autoscaling_bounds(LOCATOR, "h100", 5, 2)


def test_unknown_cluster_and_pool(counted: tuple[EksProvider, CountingClients]) -> None:
    provider, _ = counted
    with pytest.raises(ClusterNotFound, match="nope"):
        provider.discover(ClusterLocator("eks", ACCOUNT, REGION, "nope"))
    with pytest.raises(PoolNotFound, match="ghost"):
        provider.scale_pool(LOCATOR, "ghost", 1)
