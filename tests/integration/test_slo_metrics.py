"""The SLO families on GET /metrics for a seeded fleet, on PostgreSQL and SQLite, read back with
prometheus_client's text parser: per-run and per-team effective utilization, idle-notified and
unmeasured GPUs, queue waits, and serving latency against its objective."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import update

from adapters.prometheus import FleetCollector, exposition, new_registry
from adapters.sql.gauges_repo import SqlFleetGauges
from adapters.sql.tables import WorkloadRow
from controlplane.api.app import create_app
from controlplane.api.context import ApiContext
from controlplane.bootstrap import Wiring, utc_now
from controlplane.core.idle import IdlePolicy, IdleRules
from controlplane.core.snapshot import Policy
from controlplane.service.auth import issue_token
from controlplane.service.commands import TokenSpec
from controlplane.service.idle import idle_pass
from controlplane.service.nats_identity import grant_for
from controlplane.service.scheduling import acquire_leadership, run_cycle
from controlplane.service.serving import ServingReading
from controlplane.service.telemetry import fold
from controlplane.service.telemetry_wire import GpuSample, Metric
from tests.integration.fleet import add_tenant, gang, setup_fleet

TTL = 15.0
RULES = IdleRules(default=IdlePolicy(grace_seconds=600), working_hours=None)
Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _samples(run_id: str, node: str, activity: float, start: datetime, end: datetime) -> list[GpuSample]:
    out = []
    t = start
    while t < end:
        for gpu in range(8):
            metrics: dict[str, float] = {Metric.SM_ACTIVE: activity}
            out.append(GpuSample("sim-h100", node, f"GPU-{node}-{gpu}", gpu, t.timestamp(), metrics, run_id))
        t += timedelta(seconds=30)
    return out


def _metrics_app(wiring: Wiring, now: datetime, max_runs: int = 2_000) -> FastAPI:
    """The REST app whose registry holds the fleet collector, as an API process has it."""
    registry = new_registry()
    reader = SqlFleetGauges(wiring.engine, max_run_series=max_runs)
    registry.register(FleetCollector(reader, lambda: now, min_interval=0.0))
    return create_app(
        ApiContext(
            uow_factory=wiring.uow,
            subject_prefix=wiring.settings.subject_prefix,
            exposition=lambda: exposition(registry),
        )
    )


def _bearer(wiring: Wiring, role: str, team: str | None = None) -> dict[str, str]:
    spec = TokenSpec.model_validate({"name": f"t-{role}", "role": role, "team": team})
    _, raw = issue_token(wiring.uow(), spec, "test", utc_now())
    return {"Authorization": f"Bearer {raw}"}


def _scrape(wiring: Wiring, now: datetime, max_runs: int = 2_000) -> Series:
    """GET /metrics, parsed, read with a token of role metrics (it may read /metrics and nothing else)."""
    with TestClient(_metrics_app(wiring, now, max_runs)) as c:
        r = c.get("/metrics", headers=_bearer(wiring, "metrics"))
    assert r.status_code == 200
    series: Series = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            series[(s.name, frozenset(s.labels.items()))] = s.value
    return series


def _get(series: Series, name: str, **labels: str) -> float:
    return series[(name, frozenset(labels.items()))]


def _names(series: Series, name: str) -> list[dict[str, str]]:
    return [dict(labels) for n, labels in series if n == name]


@pytest.fixture
def seeded(wiring: Wiring, client: TestClient, admin: dict[str, str]) -> tuple[datetime, dict[str, str]]:
    """On 4 nodes x 8 H100: vision runs `busy` (80 % active) and `hoarder` (idle for 100 minutes,
    reclaim stage); serve runs `chat` (inference, 3.2 requests/s at 250 ms against a 100 ms objective,
    no GPU telemetry). Four more vision gangs wait, submitted 50, 100, 200 and 1000 s before `now`."""
    setup_fleet(client, admin)
    vision = add_tenant(client, admin, "vision", "vision-train")
    serve = add_tenant(client, admin, "serve", "serve-prod")
    prefix = wiring.settings.subject_prefix
    start = datetime.fromtimestamp(utc_now().timestamp() // 300 * 300, UTC) - timedelta(hours=2)
    now = start + timedelta(minutes=100)
    epoch = acquire_leadership(wiring.uow, "s", start, TTL)
    assert epoch is not None
    bodies = {
        "busy": (vision, gang("busy", vision.queue, replicas=1)),
        "hoarder": (vision, gang("hoarder", vision.queue, replicas=1)),
        "chat": (
            serve,
            gang(
                "chat",
                serve.queue,
                replicas=1,
                kind="inference",
                serving={"traffic_metric": "vllm:request_success", "latency_metric": "x", "latency_objective_ms": 100},
            ),
        ),
    }
    ids = {}
    for name, (tenant, body) in bodies.items():
        r = client.post("/v1/workloads", json=body, headers=tenant.headers)
        assert r.status_code == 201, r.text
        ids[name] = r.json()["id"]
    run_cycle(wiring.uow, "s", epoch, Policy(), prefix, start, TTL * 1000, True)
    runs: dict[str, str] = {}
    nodes: dict[str, str] = {}
    for name, workload_id in ids.items():
        view = client.get(f"/v1/workloads/{workload_id}", headers=bodies[name][0].headers).json()
        runs[name], nodes[name] = view["runs"][-1]["id"], view["nodes"][0]
    with wiring.uow() as uow:
        for name, run_id in runs.items():
            assert uow.runs.set_state(run_id, ("admitted",), "running", "pods running", start)
            uow.workloads.set_state(ids[name], ("admitted",), "running", "pods running", start)
        uow.telemetry.merge_windows(
            fold(
                _samples(runs["busy"], nodes["busy"], 0.8, start, now)
                + _samples(runs["hoarder"], nodes["hoarder"], 0.0, start, now)
            ),
            now,
        )
        uow.serving.put_readings([("sim-h100", ServingReading(runs["chat"], now, 3.2, 250.0))], now)
        uow.commit()
    idle_pass(wiring.uow, RULES, prefix, now)
    for age in (50, 100, 200, 1000):
        r = client.post("/v1/workloads", json=gang(f"wait-{age}", vision.queue, replicas=2), headers=vision.headers)
        assert r.status_code == 201, r.text
        with wiring.uow() as uow:
            uow.session.execute(  # type: ignore[attr-defined]
                update(WorkloadRow)
                .where(WorkloadRow.id == r.json()["id"])
                .values(created_at=now - timedelta(seconds=age))
            )
            uow.commit()
    return now, runs


def test_slo_families_carry_the_seeded_values(wiring: Wiring, seeded: tuple[datetime, dict[str, str]]) -> None:
    now, runs = seeded
    series = _scrape(wiring, now)
    run = "gpufleet_run_effective_utilization_ratio"
    base = {"team": "vision", "queue": "vision-train", "cluster": "sim-h100"}
    assert _get(series, run, run=runs["busy"], workload="busy", **base) == pytest.approx(0.8)
    assert _get(series, run, run=runs["hoarder"], workload="hoarder", **base) == pytest.approx(0.0)
    assert len(_names(series, run)) == 2  # the inference run has no telemetry window

    # The last hour, by the report's accounting: 2 runs x 8 GPUs measured, one 80 % busy.
    assert _get(series, "gpufleet_team_allocated_gpu_hours", team="vision") == pytest.approx(16.0)
    assert _get(series, "gpufleet_team_measured_gpu_hours", team="vision") == pytest.approx(16.0)
    assert _get(series, "gpufleet_team_used_gpu_hours", team="vision") == pytest.approx(6.4)
    assert _get(series, "gpufleet_team_effective_utilization_ratio", team="vision") == pytest.approx(0.4)
    assert _get(series, "gpufleet_team_allocated_gpu_hours", team="serve") == pytest.approx(8.0)
    assert {"team": "serve"} not in _names(series, "gpufleet_team_effective_utilization_ratio")  # nothing measured
    assert _get(series, "gpufleet_team_allocated_gpus", team="vision") == 16.0
    assert _get(series, "gpufleet_team_allocated_gpus", team="serve") == 8.0

    assert _names(series, "gpufleet_idle_notified_gpus") == [{"cluster": "sim-h100", "team": "vision"}]
    assert _get(series, "gpufleet_idle_notified_gpus", cluster="sim-h100", team="vision") == 8.0
    assert _get(series, "gpufleet_unmeasured_gpus", cluster="sim-h100") == 8.0

    q = {"queue": "vision-train", "team": "vision"}
    assert _get(series, "gpufleet_queue_pending_workloads", **q) == 4
    assert _get(series, "gpufleet_queue_oldest_pending_seconds", **q) == pytest.approx(1000, abs=1)
    assert _get(series, "gpufleet_queue_pending_wait_seconds", quantile="0.5", **q) == pytest.approx(100, abs=1)
    assert _get(series, "gpufleet_queue_pending_wait_seconds", quantile="0.95", **q) == pytest.approx(1000, abs=1)
    assert _get(series, "gpufleet_queue_pending_workloads", queue="serve-prod", team="serve") == 0

    chat = {"run": runs["chat"], "workload": "chat", "team": "serve", "cluster": "sim-h100"}
    assert _get(series, "gpufleet_run_requests_per_second", **chat) == pytest.approx(3.2)
    assert _get(series, "gpufleet_run_latency_seconds", **chat) == pytest.approx(0.25)
    assert _get(series, "gpufleet_run_latency_objective_seconds", **chat) == pytest.approx(0.1)


def test_per_run_families_are_bounded_lowest_utilization_first(
    wiring: Wiring, seeded: tuple[datetime, dict[str, str]]
) -> None:
    now, runs = seeded
    series = _scrape(wiring, now, max_runs=1)
    assert [labels["run"] for labels in _names(series, "gpufleet_run_effective_utilization_ratio")] == [runs["hoarder"]]
    assert not _names(_scrape(wiring, now, max_runs=0), "gpufleet_run_latency_seconds")


def test_only_a_metrics_or_admin_token_reads_the_per_run_labels(
    wiring: Wiring, seeded: tuple[datetime, dict[str, str]]
) -> None:
    """Finding 4 of issue 21: /metrics showed every team's workload names, run ids and team labels to
    anyone. Now a team token is refused outright (the exposition is fleet-wide: a filtered copy per
    team is not what a scrape config reads), and so is no token or an unknown one."""
    now, runs = seeded
    vision_only = {runs["busy"], runs["hoarder"], "busy", "hoarder", 'team="vision"', "vision-train"}
    with TestClient(_metrics_app(wiring, now)) as c:
        for headers, status in (
            ({}, 401),
            ({"Authorization": "Bearer gpf_not-a-token"}, 401),
            (_bearer(wiring, "team", "serve"), 403),  # another team's runs are on this page: refused
        ):
            r = c.get("/metrics", headers=headers)
            assert r.status_code == status, r.text
            assert not [label for label in vision_only if label in r.text], r.text
            assert "gpufleet_" not in r.text
        assert c.get("/metrics", headers={}).headers["www-authenticate"] == "Bearer"
        for role in ("metrics", "admin"):
            shown = c.get("/metrics", headers=_bearer(wiring, role))
            assert shown.status_code == 200
            assert all(label in shown.text for label in vision_only)  # they are there to be hidden
        # A metrics token reads /metrics and nothing else: the REST API, the dashboard and NATS refuse it.
        metrics_token = _bearer(wiring, "metrics")
        assert grant_for(wiring.uow(), metrics_token["Authorization"][7:], wiring.settings.subject_prefix) is None
        assert c.get("/v1/teams", headers=metrics_token).status_code == 401
        assert c.get("/v1/workloads", headers=metrics_token).status_code == 401
        assert c.get("/ui/fleet", headers=metrics_token, follow_redirects=False).status_code == 303
        issued = c.post(
            "/v1/tokens", json={"name": "scrape", "role": "metrics", "team": "serve"}, headers=_bearer(wiring, "admin")
        )
        assert issued.status_code == 422
        assert "belongs to no team" in issued.text
