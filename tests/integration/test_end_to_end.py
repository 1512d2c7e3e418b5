"""The whole loop, in one process as `gpufleet up` runs it, on SQLite and on PostgreSQL:
REST and NATS submissions go queued -> admitted -> dispatching -> running -> succeeded through
the real API, scheduler, dispatcher, simulated cluster, nats-server, ingest and outbox relay."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict

import httpx
import nats
import pytest

from adapters.nats.server import free_port
from controlplane.bootstrap import COMPONENTS, Wiring, run_components, utc_now
from controlplane.config import Settings
from controlplane.service.auth import issue_token
from controlplane.service.commands import TokenSpec
from tests.integration.fleet import gang, h100_cluster

LIFECYCLE = ["queued", "admitted", "dispatching", "running", "succeeded"]


async def _until(predicate: object, timeout: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        if await predicate():  # type: ignore[operator]
            return
        await asyncio.sleep(0.2)
    raise AssertionError("condition not reached in time")


@pytest.mark.timeout(180)
async def test_gangs_flow_end_to_end_by_rest_and_by_nats(secure_settings: Settings) -> None:
    """Over an authenticated NATS: the team connects with its API token, submits on its own subject
    and reads its own events; the simulated cluster reports with its own cluster credential."""
    settings = secure_settings.model_copy(update={"api_port": free_port()})
    prefix = settings.subject_prefix
    wiring = Wiring(settings)
    _, admin_token = issue_token(wiring.uow(), TokenSpec(name="e2e", role="admin"), "test", utc_now())
    wiring.close()
    stop = asyncio.Event()
    plane = asyncio.create_task(run_components(settings, COMPONENTS, stop))
    nc: nats.aio.client.Client | None = None
    events: dict[str, list[str]] = defaultdict(list)

    async def on_event(msg: nats.aio.msg.Msg) -> None:
        envelope = json.loads(msg.data)
        events[envelope["data"].get("workload_id", "-")].append(msg.subject.rsplit(".", 1)[1])

    base = f"http://127.0.0.1:{settings.api_port}"
    admin = {"Authorization": f"Bearer {admin_token}"}
    try:
        async with httpx.AsyncClient(base_url=base, timeout=10) as api:

            async def ready() -> bool:
                try:
                    return (await api.get("/readyz")).status_code == 200
                except httpx.TransportError:
                    return False

            await _until(ready, 30)
            assert (await api.post("/v1/clusters", json=h100_cluster(nodes=8), headers=admin)).status_code == 201
            await api.post(
                "/v1/priority-classes", json={"name": "batch", "value": 1, "is_default": True}, headers=admin
            )
            assert (await api.post("/v1/teams", json={"name": "llm"}, headers=admin)).status_code == 201
            r = await api.post("/v1/queues", json={"name": "llm-train", "team": "llm"}, headers=admin)
            assert r.status_code == 201
            token = (await api.post("/v1/tokens", json={"name": "ci", "team": "llm"}, headers=admin)).json()["token"]
            team = {"Authorization": f"Bearer {token}"}
            nc = await nats.connect(settings.nats_url, token=token, inbox_prefix="_INBOX.team-llm")
            await nc.subscribe(f"{prefix}.events.workload.llm.>", cb=on_event)

            by_rest = await api.post(
                "/v1/workloads", json=gang("by-rest", "llm-train", duration_seconds=1), headers=team
            )
            assert by_rest.status_code == 201, by_rest.text
            body = json.dumps(gang("by-nats", "llm-train", duration_seconds=1)).encode()
            js = nc.jetstream()
            await js.publish(f"{prefix}.submit.llm.llm-train", body, headers={"Gpufleet-Msg-Id": f"e2e-{prefix}"})

            async def both_succeeded() -> bool:
                listed = (await api.get("/v1/workloads", headers=team)).json()["items"]
                return len(listed) == 2 and all(w["state"] == "succeeded" for w in listed)

            await _until(both_succeeded, 90)
            listed = {w["name"]: w for w in (await api.get("/v1/workloads", headers=team)).json()["items"]}
            for name in ("by-rest", "by-nats"):
                assert (listed[name]["cluster"], listed[name]["node_count"], listed[name]["attempts"]) == (
                    "sim-h100",
                    4,
                    1,
                )
                workload = (await api.get(f"/v1/workloads/{listed[name]['id']}", headers=team)).json()
                assert len(workload["nodes"]) == 4
                [run] = workload["runs"]
                assert run["state"] == "succeeded"
                assert run["placement"] == [{"pod_set": "workers", "pool": "h100", "pods": 4, "nodes": 4}]

            async def all_events_seen() -> bool:
                return all(events[listed[n]["id"]] == LIFECYCLE for n in ("by-rest", "by-nats"))

            await _until(all_events_seen, 30)
    finally:
        stop.set()
        await asyncio.wait_for(plane, 30)
        if nc is not None:
            await nc.close()
