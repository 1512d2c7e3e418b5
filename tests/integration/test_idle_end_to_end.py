"""The hoarding story end to end, on SQLite and PostgreSQL: simulated clusters publish DCGM
telemetry for their pods, the ingest folds it into (short) windows, the idle pass warns an idle
gang and marks it reclaimable, and the scheduler gives its GPUs to another team's waiting gang,
all through the real components and nats-server. Nothing is reclaimed without a waiting gang,
nor when a cluster's telemetry stops."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import nats
import pytest

from adapters.nats.server import NatsServerProcess, free_port
from controlplane.bootstrap import COMPONENTS, Wiring, run_components, utc_now
from controlplane.config import Settings
from controlplane.service.auth import issue_token
from controlplane.service.commands import TokenSpec
from tests.integration.fleet import FAST_IDLE_POLICY, FAST_WINDOW, HOARDER_CONTAINER, gang, h100_cluster

WINDOW = FAST_WINDOW
IDLE_INTERVAL = 0.3
# Generous on purpose: two shared cores run the whole control plane, nats-server and the test.
MARGIN = 15.0
IDLE_POLICY = FAST_IDLE_POLICY
HOARDER = HOARDER_CONTAINER


@dataclass
class Plane:
    api: httpx.AsyncClient
    settings: Settings
    admin: dict[str, str]
    idle_events: list[dict[str, Any]] = field(default_factory=list)

    def events(self, kind: str, run_id: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.idle_events if e["type"] == f"idle.{kind}" and run_id in (None, e["data"]["run_id"])]

    async def tenant(self, team: str, queue: str) -> dict[str, str]:
        assert (await self.api.post("/v1/teams", json={"name": team}, headers=self.admin)).status_code == 201
        r = await self.api.post("/v1/queues", json={"name": queue, "team": team}, headers=self.admin)
        assert r.status_code == 201, r.text
        r = await self.api.post("/v1/tokens", json={"name": f"{team}-ci", "team": team}, headers=self.admin)
        return {"Authorization": f"Bearer {r.json()['token']}"}

    async def submit(self, headers: dict[str, str], body: dict[str, Any]) -> str:
        r = await self.api.post("/v1/workloads", json=body, headers=headers)
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    async def view(self, headers: dict[str, str], workload_id: str) -> dict[str, Any]:
        r = await self.api.get(f"/v1/workloads/{workload_id}", headers=headers)
        assert r.status_code == 200, r.text
        return dict(r.json())

    async def state(self, headers: dict[str, str], workload_id: str) -> str:
        return str((await self.view(headers, workload_id))["state"])


async def _until(predicate: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if await predicate():
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"not reached within {timeout:.0f} s: {what}")


@asynccontextmanager
async def _plane(settings: Settings, running_nats: NatsServerProcess, **policy: Any) -> AsyncIterator[Plane]:
    idle = {**IDLE_POLICY, "default": {**IDLE_POLICY["default"], **policy}}
    settings = settings.model_copy(
        update={
            "api_port": free_port(),
            "telemetry_window_seconds": WINDOW,
            "telemetry_interval": 0.2,
            "idle": idle,
            "idle_interval": IDLE_INTERVAL,
        }
    )
    wiring = Wiring(settings)
    _, admin_token = issue_token(wiring.uow(), TokenSpec(name="e2e", role="admin"), "test", utc_now())
    wiring.close()
    stop = asyncio.Event()
    plane = asyncio.create_task(run_components(settings, COMPONENTS, stop))
    nc = await nats.connect(running_nats.url)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{settings.api_port}", timeout=10) as api:
            p = Plane(api, settings, {"Authorization": f"Bearer {admin_token}"})

            async def on_event(msg: Any) -> None:
                p.idle_events.append(json.loads(msg.data))

            await nc.subscribe(f"{settings.subject_prefix}.events.idle.>", cb=on_event)

            async def ready() -> bool:
                try:
                    return (await api.get("/readyz")).status_code == 200
                except httpx.TransportError:
                    return False

            await _until(ready, 30, "API ready")
            r = await api.post("/v1/clusters", json=h100_cluster(nodes=2), headers=p.admin)
            assert r.status_code == 201, r.text
            r = await api.post(
                "/v1/priority-classes", json={"name": "batch", "value": 1, "is_default": True}, headers=p.admin
            )
            assert r.status_code == 201, r.text
            yield p
    finally:
        stop.set()
        await asyncio.wait_for(plane, 30)
        await nc.close()


async def _running(p: Plane, headers: dict[str, str], workload_id: str) -> dict[str, Any]:
    async def running() -> bool:
        return await p.state(headers, workload_id) == "running"

    await _until(running, 60, f"workload {workload_id} running")
    return await p.view(headers, workload_id)


def _utc(when: datetime) -> datetime:
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _evidence_complete(event: dict[str, Any]) -> datetime:
    """When the newest window the verdict rests on ended."""
    newest = max(_utc(datetime.fromisoformat(e["window_start"])) for e in event["data"]["evidence"])
    return newest + timedelta(seconds=WINDOW)


@pytest.mark.timeout(240)
async def test_hoarder_is_warned_then_reclaimed_for_another_teams_waiting_gang(
    settings: Settings, running_nats: NatsServerProcess
) -> None:
    async with _plane(settings, running_nats) as p:
        llm = await p.tenant("llm", "llm-train")
        vision = await p.tenant("vision", "vision-train")
        hoarder = await p.submit(llm, gang("hoarder", "llm-train", replicas=2, container=HOARDER))
        view = await _running(p, llm, hoarder)
        hoarder_run = view["runs"][-1]["id"]
        hoarder_nodes = sorted(view["nodes"])
        # The whole cluster is taken: another team's gang waits for exactly these GPUs.
        waiting = await p.submit(vision, gang("waiting", "vision-train", replicas=2))
        await asyncio.sleep(1.0)
        assert await p.state(vision, waiting) == "queued"

        async def warned() -> bool:
            return bool(p.events("notify", hoarder_run))

        await _until(warned, 90, "idle.notify event for the hoarder")
        [notify] = p.events("notify", hoarder_run)
        assert notify["data"]["team"] == "llm"
        assert notify["data"]["status"] == "idle"
        assert notify["data"]["evidence"]
        assert all(e["status"] == "idle" for e in notify["data"]["evidence"])

        async def reclaimed() -> bool:
            return await p.state(llm, hoarder) != "running"

        await _until(reclaimed, 90, "the hoarder reclaimed")
        observed = utc_now()
        view = await p.view(llm, hoarder)
        assert view["state"] in ("queued", "admitted"), view["state"]
        first_run = view["runs"][0]
        assert first_run["id"] == hoarder_run
        assert first_run["state"] == "preempted"
        assert first_run["message"].startswith("reclaimed-idle:"), first_run["message"]

        async def announced() -> bool:
            return bool(p.events("reclaim", hoarder_run))

        await _until(announced, 30, "idle.reclaim event for the hoarder")
        [reclaim] = p.events("reclaim", hoarder_run)
        assert reclaim["data"]["idle_windows"] >= 3
        assert len(reclaim["data"]["evidence"]) >= 3
        # Reclaimed after its idle evidence completed, and within one window plus one scheduling
        # cycle of it (the idle pass needs the last window ingested; then the next cycle evicts).
        ended = first_run["finished_at"]
        evicted_at = _utc(datetime.fromisoformat(ended)) if ended else observed
        evidence_done = _evidence_complete(reclaim)
        budget = WINDOW + p.settings.scheduler_interval + IDLE_INTERVAL + MARGIN
        assert evidence_done <= evicted_at + timedelta(seconds=1), (evidence_done, evicted_at)
        assert (evicted_at - evidence_done).total_seconds() <= budget, (evidence_done, evicted_at)
        # Warned before reclaimed.
        assert p.idle_events.index(notify) < p.idle_events.index(reclaim)

        winner = await _running(p, vision, waiting)
        assert sorted(winner["nodes"]) == hoarder_nodes
        assert await p.state(llm, hoarder) == "queued"


@pytest.mark.timeout(180)
async def test_idle_gang_keeps_its_gpus_when_nobody_waits(settings: Settings, running_nats: NatsServerProcess) -> None:
    async with _plane(settings, running_nats) as p:
        llm = await p.tenant("llm", "llm-train")
        hoarder = await p.submit(llm, gang("hoarder", "llm-train", replicas=2, container=HOARDER))
        run_id = (await _running(p, llm, hoarder))["runs"][-1]["id"]

        async def marked() -> bool:
            return bool(p.events("reclaim", run_id))

        await _until(marked, 90, "the hoarder reaches the reclaim stage")
        # Several scheduling cycles and idle windows later it still runs: nobody needs its GPUs.
        await asyncio.sleep(2 * WINDOW + 10 * p.settings.scheduler_interval)
        view = await p.view(llm, hoarder)
        assert view["state"] == "running"
        assert [r["id"] for r in view["runs"]] == [run_id]


@pytest.mark.timeout(180)
async def test_cluster_whose_telemetry_stops_is_never_reclaimed(
    settings: Settings, running_nats: NatsServerProcess
) -> None:
    # Reclaim only after six idle windows: the stop below comes well before that, even under load.
    async with _plane(settings, running_nats, deprioritize_after=3, reclaim_after=6) as p:
        llm = await p.tenant("llm", "llm-train")
        vision = await p.tenant("vision", "vision-train")
        hoarder = await p.submit(llm, gang("hoarder", "llm-train", replicas=2, container=HOARDER))
        run_id = (await _running(p, llm, hoarder))["runs"][-1]["id"]
        waiting = await p.submit(vision, gang("waiting", "vision-train", replicas=2))

        async def warned() -> bool:
            return bool(p.events("notify", run_id))

        await _until(warned, 90, "idle.notify event for the hoarder")
        # The cluster's agent goes down one idle window into the count (reclaim needs six).
        switch = p.settings.state_dir / "sim" / "sim-h100.telemetry-off"
        switch.parent.mkdir(parents=True, exist_ok=True)
        switch.touch()

        async def cleared() -> bool:
            return bool(p.events("cleared", run_id))

        await _until(cleared, 60, "the idle mark withdrawn once telemetry is stale")
        [event] = p.events("cleared", run_id)
        # Missing data is unknown, never idle: first the newest windows lack samples, then stale.
        assert event["data"]["status"] == "unknown"
        assert event["data"]["stage"] == "none"
        # Well past the time the reclaim would have come with telemetry flowing.
        await asyncio.sleep(6 * WINDOW + 10 * p.settings.scheduler_interval)
        assert not p.events("reclaim", run_id)
        assert await p.state(llm, hoarder) == "running"
        assert await p.state(vision, waiting) == "queued"
