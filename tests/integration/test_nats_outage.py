"""NATS is a delivery mechanism, not the record: when the server goes away mid-run and comes
back, the plane reconnects, the consumer rebinds, the outbox catches up, the simulated clusters
report again, and every gang still finishes."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import httpx
import nats
import pytest

from adapters.nats import secrets as nats_secrets
from adapters.nats.server import NatsServerProcess, free_port
from controlplane.bootstrap import COMPONENTS, Wiring, run_components, utc_now
from controlplane.config import Settings
from controlplane.service.auth import issue_token
from controlplane.service.commands import TokenSpec
from tests.integration.fleet import gang, h100_cluster


@pytest.mark.timeout(180)
async def test_plane_survives_a_nats_restart(secure_settings: Settings, secure_nats: NatsServerProcess) -> None:
    """With authentication on: after the restart the callout reconnects and the simulated clusters'
    connections are authorized again."""
    settings = secure_settings.model_copy(update={"api_port": free_port()})
    running_nats = secure_nats
    wiring = Wiring(settings)
    _, admin_token = issue_token(wiring.uow(), TokenSpec(name="a", role="admin"), "test", utc_now())
    wiring.close()
    stop = asyncio.Event()
    plane = asyncio.create_task(run_components(settings, COMPONENTS, stop))
    admin = {"Authorization": f"Bearer {admin_token}"}
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{settings.api_port}", timeout=10) as api:
            for _ in range(150):
                try:
                    if (await api.get("/healthz")).status_code == 200:
                        break
                except httpx.TransportError:
                    await asyncio.sleep(0.2)
            await api.post("/v1/clusters", json=h100_cluster(nodes=4), headers=admin)
            await api.post("/v1/priority-classes", json={"name": "b", "value": 1, "is_default": True}, headers=admin)
            await api.post("/v1/teams", json={"name": "llm"}, headers=admin)
            await api.post("/v1/queues", json={"name": "train", "team": "llm"}, headers=admin)
            token = (await api.post("/v1/tokens", json={"name": "t", "team": "llm"}, headers=admin)).json()["token"]
            team = {"Authorization": f"Bearer {token}"}
            ids = []
            for i in range(4):
                r = await api.post(
                    "/v1/workloads", json=gang(f"g{i}", "train", replicas=1, duration_seconds=4), headers=team
                )
                ids.append(r.json()["id"])

            async def states() -> Counter[str]:
                return Counter([(await api.get(f"/v1/workloads/{i}", headers=team)).json()["state"] for i in ids])

            for _ in range(100):
                if (await states())["running"] >= 1:
                    break
                await asyncio.sleep(0.1)
            running_nats.stop(kill=True)
            # While NATS is down the API keeps accepting work: SQL is the record.
            late = await api.post(
                "/v1/workloads", json=gang("late", "train", replicas=1, duration_seconds=1), headers=team
            )
            assert late.status_code == 201
            ids.append(late.json()["id"])
            assert (await api.get("/readyz")).status_code == 503
            await asyncio.sleep(2)
            running_nats.start()
            for _ in range(400):
                if (await states())["succeeded"] == len(ids):
                    break
                await asyncio.sleep(0.2)
            assert await states() == Counter({"succeeded": len(ids)})

        secrets = nats_secrets.load(settings.nats_secrets_file)  # type: ignore[arg-type]
        nc = await nats.connect(running_nats.url, user=secrets.control_user, password=secrets.control_password)
        js = nc.jetstream()
        sub = await js.pull_subscribe(
            f"{settings.subject_prefix}.events.workload.>",  # <team>.<queue>.<event>
            durable=f"audit-{settings.subject_prefix}",
            stream="GPUFLEET_EVENTS",
        )
        seen: list[tuple[str, str]] = []
        while True:
            try:
                batch = await sub.fetch(100, timeout=1)
            except (TimeoutError, nats.errors.TimeoutError):
                # nats-py raises either, depending on where in the pull the wait ran out.
                break
            seen += [(json.loads(m.data)["data"]["workload_id"], m.subject.rsplit(".", 1)[1]) for m in batch]
        await nc.close()
        for workload_id in ids:
            assert [e for w, e in seen if w == workload_id] == [
                "queued",
                "admitted",
                "dispatching",
                "running",
                "succeeded",
            ]
    finally:
        stop.set()
        await asyncio.wait_for(plane, 30)
