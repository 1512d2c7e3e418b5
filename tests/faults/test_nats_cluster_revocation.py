"""Revocation and the connection cap on a three-server NATS cluster: a credential's connections
spread over several servers are counted together and all closed, also after a control-plane restart
(when the control plane knows them only from every server's connection listing).

Runs the control plane's ingest in this process (it answers auth callout), on PostgreSQL.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from nats.aio.client import Client

from adapters.nats import secrets as nats_secrets
from controlplane.bootstrap import run_components
from controlplane.config import Settings
from tests.faults.nats_cluster import NatsCluster
from tests.integration.fleet import h100_cluster
from tests.integration.nats_clients import connect_as, refused, until

pytestmark = pytest.mark.timeout(180)
CAP = 2


@pytest.fixture
def database_url(empty_postgresql: str) -> str:
    return empty_postgresql


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[tuple[NatsCluster, Path]]:
    secrets_file = tmp_path / "nats-secrets.json"
    cluster = NatsCluster(tmp_path / "nats", auth=nats_secrets.load_or_create(secrets_file).server_auth())
    try:
        cluster.start()
        yield cluster, secrets_file
    finally:
        cluster.stop()


async def test_a_credential_on_several_servers_is_capped_and_revoked_as_one(
    secured: tuple[NatsCluster, Path], settings: Settings, client: TestClient, admin: dict[str, str]
) -> None:
    cluster, secrets_file = secured
    settings = settings.model_copy(
        update={
            "nats_url": cluster.url,
            "nats_secrets_file": secrets_file,
            "nats_replicas": 3,
            "nats_revocation_sweep": 60.0,  # only the start's listing and the fast path act here
            "nats_max_connections_per_cluster": CAP,
        }  # type: ignore[attr-defined]
    )
    r = client.post("/v1/clusters", json=h100_cluster("c1", nodes=1), headers=admin)
    assert r.status_code == 201, r.text
    credential = r.json()["nats_credential"]
    urls = [server.url for server in cluster.servers.values()]

    def on(url: str) -> Settings:
        return settings.model_copy(update={"nats_url": url})  # type: ignore[attr-defined]

    async def plane() -> tuple[asyncio.Event, asyncio.Task[None]]:
        stop = asyncio.Event()
        task = asyncio.create_task(run_components(settings, ("ingest",), stop))
        return stop, task

    stop, task = await plane()
    connections: list[Client] = []
    try:

        async def first_connects() -> bool:  # once the callout answers
            try:
                connections.append(await connect_as(on(urls[1]), credential, "_INBOX.cluster-c1"))
                return True
            except Exception:
                return False

        await until(first_connects, 60)
        connections.append(await connect_as(on(urls[2]), credential, "_INBOX.cluster-c1"))
        assert "authorization violation" in (await refused(on(urls[0]), token=credential)).lower()

        # A new control plane knows these connections only from the servers' listings.
        stop.set()
        await asyncio.wait_for(task, 30)
        stop, task = await plane()
        await asyncio.sleep(3.0)  # its start: connected, listed every server
        assert all(nc.is_connected for nc in connections)
        assert "authorization violation" in (await refused(on(urls[0]), token=credential)).lower()

        assert client.delete("/v1/clusters/c1/credentials", headers=admin).status_code == 204

        async def all_closed() -> bool:
            return all(nc.is_closed for nc in connections)

        await until(all_closed, 10)
    finally:
        for nc in connections:
            await nc.close()
        stop.set()
        await asyncio.wait_for(task, 30)
