"""Shared helpers for the cloud-cluster integration tests: cloud fakes from tests/clouds wired as providers."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from google.auth.credentials import AnonymousCredentials
from google.oauth2 import service_account

from adapters.clouds import build_provider
from controlplane.bootstrap import Wiring, utc_now
from controlplane.core.snapshot import Policy
from controlplane.service.cloud_ports import CloudProvider
from controlplane.service.fleet_sync import SyncResult, sync_due
from controlplane.service.scheduling import acquire_leadership, run_cycle
from tests.clouds import test_aks, test_gke, test_oke
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
