"""Prometheus metrics while real work happens: an API process and a worker process (scheduler,
dispatcher, ingest, relay) over one database and a real nats-server, each with its own registry.
The API's /metrics and the worker's metrics port are scraped over HTTP and parsed with
prometheus_client's own text parser; the counters, histograms and SQL gauges must have moved."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from adapters.nats.server import free_port
from controlplane.bootstrap import Wiring, run_components, utc_now
from controlplane.config import Settings
from controlplane.service.auth import issue_token
from controlplane.service.commands import TokenSpec
from tests.integration.fleet import gang, h100_cluster

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def _until(predicate: Callable[[], Awaitable[bool]], timeout: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        if await predicate():
            return
        await asyncio.sleep(0.2)
    raise AssertionError("condition not reached in time")


async def scrape(url: str, token: str) -> tuple[set[str], Samples]:
    """(family names, value of every sample by (name, labels)) of one exposition, read with `token`."""
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.get(url, headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    names: set[str] = set()
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        names.add(family.name)
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return names, samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """Sum of the samples named `name` whose labels include `labels` (0 when there are none)."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


@pytest.mark.timeout(240)
async def test_api_and_worker_metrics_move_with_the_work(settings: Settings) -> None:
    api_settings = settings.model_copy(update={"api_port": free_port(), "metrics_fleet_interval": 0.0})
    worker_settings = settings.model_copy(update={"metrics_port": free_port(), "telemetry_interval": 0.5})
    wiring = Wiring(settings)
    _, admin_token = issue_token(wiring.uow(), TokenSpec(name="metrics", role="admin"), "test", utc_now())
    wiring.close()
    stop = asyncio.Event()
    api_process = asyncio.create_task(run_components(api_settings, ("api",), stop))
    workers = asyncio.create_task(run_components(worker_settings, ("scheduler", "dispatcher", "ingest", "relay"), stop))
    base = f"http://127.0.0.1:{api_settings.api_port}"
    worker_url = f"http://127.0.0.1:{worker_settings.metrics_port}/metrics"
    admin = {"Authorization": f"Bearer {admin_token}"}
    try:
        async with httpx.AsyncClient(base_url=base, timeout=10) as api:

            async def ready() -> bool:
                try:
                    return (await api.get("/readyz")).status_code == 200
                except httpx.TransportError:
                    return False

            await _until(ready, 60)
            assert (await api.post("/v1/clusters", json=h100_cluster(nodes=4), headers=admin)).status_code == 201
            for name, priority in (("batch", 1), ("urgent", 100)):
                body = {"name": name, "value": priority, "is_default": name == "batch"}
                assert (await api.post("/v1/priority-classes", json=body, headers=admin)).status_code == 201
            team = {"name": "llm", "guaranteed": {"gpu-eq": 32}}
            assert (await api.post("/v1/teams", json=team, headers=admin)).status_code == 201
            queue = {"name": "llm-train", "team": "llm", "guaranteed": {"gpu-eq": 16}, "limit": {"gpu-eq": 64}}
            r = await api.post("/v1/queues", json=queue, headers=admin)
            assert r.status_code == 201, r.text
            token = (await api.post("/v1/tokens", json={"name": "ci", "team": "llm"}, headers=admin)).json()["token"]
            tenant = {"Authorization": f"Bearer {token}"}

            async def submit(name: str, **extra: object) -> str:
                r = await api.post("/v1/workloads", json=gang(name, "llm-train", **extra), headers=tenant)
                assert r.status_code == 201, r.text
                return str(r.json()["id"])

            async def state(workload_id: str) -> str:
                return str((await api.get(f"/v1/workloads/{workload_id}", headers=tenant)).json()["state"])

            # 1. a short gang runs to the end: admission, dispatch, running, events relayed
            short = await submit("short", duration_seconds=1)

            async def short_done() -> bool:
                return await state(short) == "succeeded"

            await _until(short_done, 90)
            # 2. a gang fills the cluster and the next waits for room (no-fit), with telemetry flowing
            big = await submit("big", replicas=4, gpus=8, duration_seconds=600)
            waiting = await submit("waiting", replicas=4, gpus=8, duration_seconds=600)

            async def big_running_and_measured() -> bool:
                if await state(big) != "running":
                    return False
                _, samples = await scrape(f"{base}/metrics", admin_token)
                return value(samples, "gpufleet_measured_gpus", cluster="sim-h100") > 0

            await _until(big_running_and_measured, 90)
            names, fleet = await scrape(f"{base}/metrics", admin_token)
            assert await state(waiting) == "queued"
            pending = {k: v for k, v in fleet.items() if k[0] == "gpufleet_pending_gangs"}
            assert value(fleet, "gpufleet_pending_gangs", queue="llm-train", reason="no-fit") == 1, pending
            assert value(fleet, "gpufleet_workloads", queue="llm-train", state="running") == 1
            assert value(fleet, "gpufleet_queue_used_gpus", queue="llm-train", team="llm", resource="gpu-eq") == 32
            assert value(fleet, "gpufleet_queue_used_gpus", queue="llm-train", resource="H100-80GB") == 32
            assert value(fleet, "gpufleet_queue_guaranteed_gpus", queue="llm-train", resource="gpu-eq") == 16
            assert value(fleet, "gpufleet_queue_limit_gpus", queue="llm-train", resource="gpu-eq") == 64
            assert value(fleet, "gpufleet_cluster_gpus", cluster="sim-h100", gpu_model="H100-80GB") == 32
            assert value(fleet, "gpufleet_cluster_allocated_gpus", cluster="sim-h100", gpu_model="H100-80GB") == 32
            assert 0 <= value(fleet, "gpufleet_gpu_activity_ratio", cluster="sim-h100") <= 1
            assert value(fleet, "gpufleet_lease_epoch", lease="scheduler") >= 1
            assert value(fleet, "gpufleet_lease_expires_in_seconds", lease="scheduler") > 0
            assert value(fleet, "gpufleet_cluster_sync_error", cluster="sim-h100") == 0
            assert {"gpufleet_outbox_backlog_events", "gpufleet_outbox_oldest_unpublished_age_seconds"} <= names
            assert {"gpufleet_idle_findings", "gpufleet_idle_gpus", "gpufleet_fleet_gauges_read_seconds"} <= names
            assert value(fleet, "gpufleet_fleet_gauges_read_failures") == 0
            posted = value(fleet, "gpufleet_api_requests_total", method="POST", route="/v1/workloads", code="201")
            assert posted == 3
            assert value(fleet, "gpufleet_api_requests_total", route="/v1/workloads/{workload_id}", code="200") > 0
            assert value(fleet, "gpufleet_api_request_duration_seconds_count", method="GET", route="/readyz") > 0

            # 3. an urgent gang of the same queue preempts the big one
            urgent = await submit("urgent", replicas=4, gpus=8, duration_seconds=600, priority_class="urgent")

            async def urgent_admitted() -> bool:
                return await state(urgent) in ("admitted", "dispatching", "running")

            await _until(urgent_admitted, 60)
            _, work = await scrape(worker_url, admin_token)

            async def relayed_and_measured() -> bool:
                nonlocal work
                _, work = await scrape(worker_url, admin_token)
                return (
                    value(work, "gpufleet_telemetry_samples_total") > 0
                    and value(work, "gpufleet_consumer_pending_messages", consumer="ingest") >= 0
                    and ("gpufleet_consumer_pending_messages", frozenset({("consumer", "telemetry")})) in work
                )

            await _until(relayed_and_measured, 60)
        # the worker process: scheduler, dispatcher, ingest, relay, leases
        for phase in ("snapshot", "park", "schedule", "check", "apply"):
            assert value(work, "gpufleet_scheduler_cycle_phase_seconds_count", phase=phase) > 0, phase
        assert value(work, "gpufleet_scheduler_cycle_seconds_count") > 0
        assert value(work, "gpufleet_scheduler_last_cycle_timestamp_seconds") > 0
        assert value(work, "gpufleet_admissions_total", queue="llm-train") >= 3
        assert value(work, "gpufleet_evictions_total", kind="preempt") >= 1
        assert value(work, "gpufleet_submit_to_admission_seconds_count", queue="llm-train") >= 3
        assert value(work, "gpufleet_submit_to_running_seconds_count", queue="llm-train") >= 2
        assert value(work, "gpufleet_dispatches_total", cluster="sim-h100") >= 2
        assert value(work, "gpufleet_dispatch_duration_seconds_count", cluster="sim-h100") >= 2
        assert value(work, "gpufleet_ingest_messages_total", consumer="ingest", outcome="applied") > 0
        assert value(work, "gpufleet_ingest_lag_seconds_count", consumer="ingest") > 0
        assert value(work, "gpufleet_ingest_messages_total", consumer="telemetry", outcome="applied") > 0
        assert value(work, "gpufleet_telemetry_windows_written_total") > 0
        assert value(work, "gpufleet_outbox_published_events_total") > 0
        for lease in ("scheduler", "dispatcher", "relay"):
            assert value(work, "gpufleet_lease_held", lease=lease) == 1
            assert value(work, "gpufleet_lease_held_epoch", lease=lease) >= 1
            assert 0 <= value(work, "gpufleet_lease_renewal_age_seconds", lease=lease) < settings.lease_ttl
        # each process has its own registry: the SQL gauges only on the API, the loops' only on the worker
        assert value(work, "gpufleet_queue_used_gpus") == 0
        assert not any(n == "gpufleet_queue_used_gpus" for n, _ in work)
        assert value(fleet, "gpufleet_scheduler_cycle_seconds_count") == 0
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(api_process, workers), 60)
