"""Utilization reports through the real database and the REST API: hand-checked GPU-hours, groupings,
team isolation, input validation and the hourly report event."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from controlplane.bootstrap import Wiring, utc_now
from controlplane.core.decision import EndCause
from controlplane.core.snapshot import Policy
from controlplane.service.reports import publish_hourly_report, report_subject
from controlplane.service.scheduling import acquire_leadership, run_cycle
from controlplane.service.telemetry import fold
from controlplane.service.telemetry_wire import GpuSample, Metric
from controlplane.workers.report_loop import report_loop
from tests.integration.fleet import Tenant, add_tenant, gang

TTL = 1e6
ROUTE = "/v1/reports/utilization"


def _hour(when: datetime) -> datetime:
    return when.replace(minute=0, second=0, microsecond=0)


def _samples(run_id: str, node: str, activity: float | None, start: datetime, end: datetime) -> list[GpuSample]:
    out = []
    t = start
    while t < end:
        for gpu in range(8):
            metrics: dict[str, float] = {Metric.FB_USED: 1000.0}
            if activity is not None:
                metrics[Metric.SM_ACTIVE] = activity
            out.append(
                GpuSample(
                    cluster="sim-h100",
                    node=node,
                    gpu_uuid=f"GPU-{node}-{gpu}",
                    gpu_index=gpu,
                    timestamp=t.timestamp(),
                    metrics=metrics,
                    run_id=run_id,
                )
            )
        t += timedelta(seconds=30)
    return out


@dataclass
class Case:
    start: datetime  # the report range is [start, start + 2h)
    vision: Tenant
    nlp: Tenant
    alpha_run: str
    beta_run: str

    @property
    def params(self) -> dict[str, str]:
        return {"from": self.start.isoformat(), "to": (self.start + timedelta(hours=2)).isoformat()}


def _run_and_node(client: TestClient, tenant: Tenant, workload_id: str) -> tuple[str, str]:
    view = client.get(f"/v1/workloads/{workload_id}", headers=tenant.headers).json()
    return str(view["runs"][-1]["id"]), str(view["nodes"][0])


@pytest.fixture
def case(wiring: Wiring, client: TestClient, tenant: Tenant, admin: dict[str, str]) -> Case:
    """Two runs of 8 H100 each, over the range R = [start, start + 2h):

    - alpha (team vision): admitted 30 min before R, still running. SM activity 1.0 before R
      (outside the range), 0.5 in R's first hour, no activity reading in its second hour.
    - beta (team nlp): admitted at R's start, activity 0.0 for an hour, then reclaimed for idleness.
    """
    nlp = add_tenant(client, admin, "nlp", "nlp-train")
    prefix = wiring.settings.subject_prefix
    start = _hour(utc_now()) - timedelta(hours=4)
    epoch = acquire_leadership(wiring.uow, "s", start - timedelta(hours=1), TTL)
    assert epoch is not None
    r = client.post("/v1/workloads", json=gang("alpha", tenant.queue, replicas=1), headers=tenant.headers)
    assert r.status_code == 201, r.text
    alpha = str(r.json()["id"])
    run_cycle(wiring.uow, "s", epoch, Policy(), prefix, start - timedelta(minutes=30), TTL, True)
    r = client.post("/v1/workloads", json=gang("beta", nlp.queue, replicas=1), headers=nlp.headers)
    assert r.status_code == 201, r.text
    beta = str(r.json()["id"])
    run_cycle(wiring.uow, "s", epoch, Policy(), prefix, start, TTL, True)
    alpha_run, alpha_node = _run_and_node(client, tenant, alpha)
    beta_run, beta_node = _run_and_node(client, nlp, beta)
    assert alpha_node != beta_node
    hour = timedelta(hours=1)
    windows = fold(
        _samples(alpha_run, alpha_node, 1.0, start - timedelta(minutes=30), start)
        + _samples(alpha_run, alpha_node, 0.5, start, start + hour)
        + _samples(alpha_run, alpha_node, None, start + hour, start + 2 * hour)
        + _samples(beta_run, beta_node, 0.0, start, start + hour)
    )
    with wiring.uow() as uow:
        assert uow.runs.set_state(alpha_run, ("admitted",), "running", "pods running", start - timedelta(minutes=29))
        assert uow.runs.set_state(beta_run, ("admitted",), "running", "pods running", start + timedelta(minutes=1))
        assert uow.runs.set_state(
            beta_run,
            ("running",),
            "preempted",
            "reclaimed-idle: GPUs idle for 12 windows",
            start + hour,
            cause=EndCause.RECLAIMED_IDLE,
        )
        uow.telemetry.merge_windows(windows, start + 2 * hour)
        uow.commit()
    return Case(start, tenant, nlp, alpha_run, beta_run)


FIGURES = (
    "runs",
    "allocated_gpu_hours",
    "measured_gpu_hours",
    "used_gpu_hours",
    "idle_gpu_hours",
    "unmeasured_gpu_hours",
    "reclaimed_gpu_hours",
    "efficiency",
)
# By hand: alpha holds 8 GPUs for both hours (16), measured in the first (8, used 8 x 0.5 = 4),
# unknown in the second (8). Beta holds 8 GPUs for the first hour (8), all idle, then hands them
# back for the rest of the range (8 reclaimed).
ALPHA = (1, 16.0, 8.0, 4.0, 0.0, 8.0, 0.0, 0.5)
BETA = (1, 8.0, 8.0, 0.0, 8.0, 0.0, 8.0, 0.0)
TOTAL = (2, 24.0, 16.0, 4.0, 8.0, 8.0, 8.0, 0.25)


def _figures(row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(row[f] for f in FIGURES)


def test_hand_checked_figures_by_team(client: TestClient, admin: dict[str, str], case: Case) -> None:
    r = client.get(ROUTE, params={**case.params, "group_by": "team"}, headers=admin)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["group_by"] == "team"
    assert {row["group"]: _figures(row) for row in body["groups"]} == {"nlp": BETA, "vision": ALPHA}
    assert _figures(body["total"]) == TOTAL
    [top] = body["top_idle_runs"]
    assert (top["run_id"], top["workload"], top["team"], top["queue"], top["cluster"]) == (
        case.beta_run,
        "beta",
        "nlp",
        "nlp-train",
        "sim-h100",
    )
    assert top["idle_gpu_hours"] == 8.0


@pytest.mark.parametrize(
    ("group_by", "expected"),
    [
        ("queue", {"nlp-train": BETA, "vision-train": ALPHA}),
        ("cluster", {"sim-h100": TOTAL}),
        ("gpu_model", {"H100-80GB": TOTAL}),
    ],
)
def test_group_by_variants(
    client: TestClient, admin: dict[str, str], case: Case, group_by: str, expected: dict[str, tuple[Any, ...]]
) -> None:
    r = client.get(ROUTE, params={**case.params, "group_by": group_by}, headers=admin)
    assert r.status_code == 200, r.text
    assert {row["group"]: _figures(row) for row in r.json()["groups"]} == expected


def test_a_team_sees_only_its_own_rows(client: TestClient, case: Case) -> None:
    for tenant, group, figures in ((case.vision, "vision", ALPHA), (case.nlp, "nlp", BETA)):
        for group_by in ("team", "cluster"):
            r = client.get(ROUTE, params={**case.params, "group_by": group_by}, headers=tenant.headers)
            assert r.status_code == 200, r.text
            body = r.json()
            assert [_figures(row) for row in body["groups"]] == [figures]
            assert _figures(body["total"]) == figures
        assert body["groups"][0]["group"] == "sim-h100"
        r = client.get(ROUTE, params=case.params, headers=tenant.headers)
        assert [row["group"] for row in r.json()["groups"]] == [group]
    # vision's run was never idle: no idle runs of another team leak into its list.
    r = client.get(ROUTE, params=case.params, headers=case.vision.headers)
    assert r.json()["top_idle_runs"] == []
    assert case.beta_run not in r.text


def test_a_range_before_the_runs_is_empty(client: TestClient, admin: dict[str, str], case: Case) -> None:
    params = {"from": (case.start - timedelta(days=3)).isoformat(), "to": (case.start - timedelta(days=2)).isoformat()}
    body = client.get(ROUTE, params=params, headers=admin).json()
    assert body["groups"] == []
    assert body["total"]["allocated_gpu_hours"] == 0.0
    assert body["total"]["efficiency"] is None


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"from": "2026-01-02T00:00:00Z", "to": "2026-01-01T00:00:00Z"}, "`to` must be after `from`"),
        ({"from": "2026-01-01T00:00:00Z", "to": "2026-01-01T00:00:00Z"}, "`to` must be after `from`"),
        ({"from": "2026-01-01T00:00:00Z", "to": "2026-04-03T00:00:01Z"}, "at most 92 days"),
        (
            {"from": "2026-01-01T00:00:00Z", "to": "2026-01-02T00:00:00Z", "group_by": "pool"},
            "group_by: Input should be 'team'",
        ),
        (
            {"from": "2026-01-01T00:00:00Z", "to": "2026-01-02T00:00:00Z", "top": "500"},
            "top: Input should be less than or equal to 100",
        ),
        ({"to": "2026-01-02T00:00:00Z"}, "from"),
        ({"from": "yesterday", "to": "2026-01-02T00:00:00Z"}, "from"),
    ],
)
def test_invalid_input_is_a_422_with_a_message(
    client: TestClient, admin: dict[str, str], params: dict[str, str], message: str
) -> None:
    r = client.get(ROUTE, params=params, headers=admin)
    assert r.status_code == 422, r.text
    assert message in r.json()["detail"]


def test_a_92_day_range_is_accepted_and_a_token_is_required(client: TestClient, admin: dict[str, str]) -> None:
    params = {"from": "2026-01-01T00:00:00Z", "to": "2026-04-03T00:00:00Z"}
    assert client.get(ROUTE, params=params, headers=admin).status_code == 200
    assert client.get(ROUTE, params=params).status_code == 401


def test_the_hourly_report_event_is_written_once(wiring: Wiring, case: Case) -> None:
    prefix = wiring.settings.subject_prefix
    now = case.start + timedelta(hours=2, minutes=10)  # the previous full hour is R's second hour
    assert publish_hourly_report(wiring.uow, prefix, now) is True
    assert publish_hourly_report(wiring.uow, prefix, now + timedelta(minutes=5)) is False
    with wiring.uow() as uow:
        events = [(i, s, p) for i, s, p in uow.outbox.unpublished(1000) if s == report_subject(prefix)]
    assert len(events) == 1
    event_id, _, payload = events[0]
    body = json.loads(payload)
    assert body["type"] == "utilization.report"
    assert body["id"] == event_id
    data = body["data"]
    assert data["from"] == (case.start + timedelta(hours=1)).isoformat()
    assert data["to"] == (case.start + timedelta(hours=2)).isoformat()
    # Alpha holds 8 GPUs all hour, unmeasured; beta was reclaimed at the hour's start: 8 handed back.
    assert _figures(data["total"]) == (2, 8.0, 0.0, 0.0, 0.0, 8.0, 8.0, None)
    assert {row["group"] for row in data["groups"]["team"]} == {"nlp", "vision"}
    assert set(data["groups"]) == {"team", "queue", "cluster", "gpu_model"}

    # The next hour is a new event.
    assert publish_hourly_report(wiring.uow, prefix, now + timedelta(hours=1)) is True
    with wiring.uow() as uow:
        assert len([s for _, s, _ in uow.outbox.unpublished(1000) if s == report_subject(prefix)]) == 2


def test_naive_times_are_utc(client: TestClient, admin: dict[str, str], case: Case) -> None:
    naive = {
        k: datetime.fromisoformat(v).astimezone(UTC).replace(tzinfo=None).isoformat() for k, v in case.params.items()
    }
    body = client.get(ROUTE, params=naive, headers=admin).json()
    assert _figures(body["total"]) == TOTAL


def test_the_report_loop_writes_each_hour_once(wiring: Wiring, case: Case) -> None:
    prefix = wiring.settings.subject_prefix
    now = case.start + timedelta(hours=2, minutes=3)
    stop = asyncio.Event()

    async def main() -> None:
        task = asyncio.create_task(report_loop(wiring.uow, prefix, lambda: now, stop, interval=0.05))
        await asyncio.sleep(0.5)  # several passes over the same hour
        stop.set()
        await task

    asyncio.run(main())
    with wiring.uow() as uow:
        assert len([s for _, s, _ in uow.outbox.unpublished(1000) if s == report_subject(prefix)]) == 1
