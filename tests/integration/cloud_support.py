"""Shared helpers for the cloud-cluster integration tests: cloud fakes from tests/clouds wired as providers."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import requests
from google.auth.credentials import AnonymousCredentials
from google.oauth2 import service_account

from adapters.clouds import build_provider
from adapters.clouds.eks import EksProvider
from controlplane.bootstrap import Wiring, utc_now
from controlplane.core.snapshot import Policy
from controlplane.service.cloud_ports import CloudProvider
from controlplane.service.fleet_sync import SyncResult, sync_due
from controlplane.service.scheduling import acquire_leadership, run_cycle
from tests.clouds import test_aks, test_eks, test_gke, test_oke
from tests.clouds.keys import KeyPair


def gke_provider(fake: test_gke.FakeGoogle, key: KeyPair) -> CloudProvider:
    credentials = service_account.Credentials.from_service_account_info(  # type: ignore[no-untyped-call]
        {
            "type": "service_account",
            "project_id": test_gke.PROJECT,
            "private_key_id": "3f1e0c9a7b",
            "private_key": key.private_pem,
            "client_email": test_gke.SA_EMAIL,
            "client_id": "108263544179310577265",
            "token_uri": f"{fake.server.url}/token",
        }
    )
    return build_provider(
        "gke",
        api_endpoint=fake.server.url,
        transport="rest",
        credentials=credentials,
        client_credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
    )


def aks_provider(fake: test_aks.FakeArm) -> CloudProvider:
    credential = test_aks.RecordingCredential()
    return build_provider(
        "aks",
        base_url=fake.server.url,
        credential=credential,
        client_kwargs={"authentication_policy": test_aks.PlainBearer(credential), "polling_interval": 0},
    )


def oke_provider(fake: test_oke.FakeOci, key: KeyPair, tmp_path: Path) -> CloudProvider:
    key_file = tmp_path / "oci_api_key.pem"
    key_file.write_text(key.private_pem)
    config = {
        "user": test_oke.USER,
        "fingerprint": key.fingerprint,
        "key_file": str(key_file),
        "tenancy": test_oke.TENANCY,
        "region": test_oke.REGION,
    }
    return build_provider("oke", config=config, service_endpoint=fake.server.url)


def eks_session() -> boto3.session.Session:
    return boto3.session.Session(aws_access_key_id=test_eks.ACCESS_KEY, aws_secret_access_key=test_eks.SECRET_KEY)


def eks_provider(moto_url: str) -> tuple[CloudProvider, test_eks.CountingClients]:
    """The EKS adapter against moto, and the record of the EKS operations it sends."""
    clients = test_eks.CountingClients(eks_session(), moto_url)
    return EksProvider(clients), clients


# Two H100 node groups a gang may use: `p5-reserved` is the cheaper one (prices come from the
# registration), `p5-flex` sorts first by name; and a CPU group fleet sync leaves out.
EKS_GROUPS: dict[str, dict[str, Any]] = {
    "p5-reserved": {"scalingConfig": {"minSize": 0, "maxSize": 4, "desiredSize": 1}, "instanceTypes": ["p5.48xlarge"]},
    "p5-flex": {"scalingConfig": {"minSize": 0, "maxSize": 4, "desiredSize": 0}, "instanceTypes": ["p5.48xlarge"]},
    "system": {"scalingConfig": {"minSize": 2, "maxSize": 3, "desiredSize": 2}, "instanceTypes": ["m6i.xlarge"]},
}

EKS_CLUSTER = {
    "name": "eks-train",
    "provider": "eks",
    "account": test_eks.ACCOUNT,
    "region": test_eks.REGION,
    "cluster": test_eks.CLUSTER,
    "kubernetes": {"namespace": "gpufleet", "gang": "none"},
    "pool_prices": {"p5-reserved": 4.5, "p5-flex": 9.8},
}


def eks_client(moto_url: str) -> Any:
    return eks_session().client("eks", region_name=test_eks.REGION, endpoint_url=moto_url)


def seed_eks(moto_url: str) -> Any:
    """moto emptied, then one EKS cluster with the `EKS_GROUPS` node groups; returns a boto3 EKS client."""
    requests.post(f"{moto_url}/moto-api/reset", timeout=10).raise_for_status()
    client = eks_client(moto_url)
    client.create_cluster(
        name=test_eks.CLUSTER,
        version="1.31",
        roleArn=f"arn:aws:iam::{test_eks.ACCOUNT}:role/eks-cluster",
        resourcesVpcConfig={"subnetIds": ["subnet-0a1b2c3d"]},
    )
    for name, config in EKS_GROUPS.items():
        client.create_nodegroup(
            clusterName=test_eks.CLUSTER,
            nodegroupName=name,
            nodeRole=f"arn:aws:iam::{test_eks.ACCOUNT}:role/eks-node",
            subnets=["subnet-0a1b2c3d"],
            amiType="AL2023_x86_64_NVIDIA" if name != "system" else "AL2023_x86_64_STANDARD",
            **config,
        )
    return client


def reset_eks(client: Any) -> None:
    """Every seeded node group back at its initial scaling config."""
    for name, config in EKS_GROUPS.items():
        client.update_nodegroup_config(
            clusterName=test_eks.CLUSTER, nodegroupName=name, scalingConfig=config["scalingConfig"]
        )


def eks_scaling(client: Any, group: str) -> dict[str, int]:
    scaling: dict[str, int] = client.describe_nodegroup(clusterName=test_eks.CLUSTER, nodegroupName=group)["nodegroup"][
        "scalingConfig"
    ]
    return scaling


GKE_CLUSTER = {
    "name": "gke-train",
    "provider": "gke",
    "account": test_gke.PROJECT,
    "region": test_gke.LOCATION,
    "cluster": test_gke.CLUSTER,
    "kubernetes": {"namespace": "gpufleet", "gang": "none"},
    "pool_prices": {"h100-mig": 9.5},
}


def sync(wiring: Wiring, providers: dict[str, CloudProvider], lister: Any = None) -> list[SyncResult]:
    return asyncio.run(
        sync_due(wiring.uow, providers.__getitem__, wiring.settings.subject_prefix, utc_now, 60.0, lister)
    )


def schedule(wiring: Wiring, now: datetime | None = None) -> int:
    holder = "test-scheduler"
    when = now or datetime.now(UTC)
    epoch = acquire_leadership(wiring.uow, holder, when, 30.0)
    assert epoch is not None
    return run_cycle(wiring.uow, holder, epoch, Policy(), wiring.settings.subject_prefix, when, 30.0).admitted
