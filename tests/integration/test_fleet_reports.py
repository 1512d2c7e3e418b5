"""Fleet reports (waiting, fairness, evictions, cost, utilization over time) through the real
database, the REST API and the CLI, checked against figures worked out by hand."""

from __future__ import annotations

import csv
import io
import json
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from sqlalchemy import update

from adapters.sql.tables import WorkloadRow
from controlplane.bootstrap import Wiring, utc_now
from controlplane.cli.report_commands import register
from controlplane.cli.rest_api import Api
from controlplane.core.decision import EndCause
from controlplane.core.snapshot import Policy
from controlplane.service.scheduling import acquire_leadership, run_cycle
from controlplane.service.telemetry import fold
from tests.integration.fleet import Tenant, gang, h100_cluster, setup_fleet
from tests.integration.test_reports import _samples

TTL = 1e6
M = timedelta(minutes=1)
PRICE = 6.9  # h100_cluster's price per GPU-hour


@dataclass
class Case:
    start: datetime  # the report range is [start, start + 2h)
    vision: Tenant
    nlp: Tenant
    ids: dict[str, str]

    def params(self, **extra: Any) -> dict[str, Any]:
        return {"from": self.start.isoformat(), "to": (self.start + timedelta(hours=2)).isoformat(), **extra}


def _tenant(client: TestClient, admin: dict[str, str], team: str, queue: dict[str, Any]) -> Tenant:
    assert client.post("/v1/teams", json={"name": team}, headers=admin).status_code == 201
    r = client.post("/v1/queues", json={"team": team, **queue}, headers=admin)
    assert r.status_code == 201, r.text
    r = client.post("/v1/tokens", json={"name": f"{team}-ci", "team": team}, headers=admin)
    assert r.status_code == 201, r.text
    return Tenant(team, queue["name"], r.json()["token"])


def _submit(client: TestClient, who: Tenant, name: str, gpus: int, **extra: Any) -> str:
    r = client.post("/v1/workloads", json=gang(name, who.queue, replicas=1, gpus=gpus, **extra), headers=who.headers)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def _run(client: TestClient, who: Tenant, workload_id: str, index: int = -1) -> tuple[str, str]:
    view = client.get(f"/v1/workloads/{workload_id}", headers=who.headers).json()
    return str(view["runs"][index]["id"]), str(view["nodes"][0]) if view["nodes"] else ""


@pytest.fixture
def case(wiring: Wiring, client: TestClient, admin: dict[str, str]) -> Case:
    """Two nodes x 8 H100 (16 GPUs, 6.9 per GPU-hour); R = [S, S + 2h), S four hours ago.

    vision-train: no guarantee, weight 1. nlp-train: guarantee 4 gpu-eq, weight 3.
    - alpha (vision, 8 GPU): submitted S, admitted S+10m, running S+15m, preempted S+60m by urgent.
    - beta (nlp, 8 GPU): submitted S+5m, admitted S+30m, running S+30m, reclaimed idle S+90m
      (no audit entry: its beneficiary is unknown). Telemetry: activity 0 over [S+30m, S+90m).
    - urgent (vision, 8 GPU, priority urgent): submitted S+50m, admitted S+60m, running S+61m, live.
      Telemetry: activity 0.5 over [S+60m, S+120m).
    - gamma (vision, 1 GPU): submitted S+70m, still queued. delta (nlp, 1 GPU): submitted S+80m,
      cancelled S+95m, never admitted.
    """
    setup_fleet(client, admin, h100_cluster(nodes=2))
    vision = _tenant(client, admin, "vision", {"name": "vision-train"})
    nlp = _tenant(client, admin, "nlp", {"name": "nlp-train", "guaranteed": {"gpu-eq": 4}, "weight": 3})
    prefix = wiring.settings.subject_prefix
    start = utc_now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=4)
    epoch = acquire_leadership(wiring.uow, "s", start, TTL)
    assert epoch is not None
    ids = {"alpha": _submit(client, vision, "alpha", 8)}
    run_cycle(wiring.uow, "s", epoch, Policy(), prefix, start + 10 * M, TTL, True)
    ids["beta"] = _submit(client, nlp, "beta", 8)
    run_cycle(wiring.uow, "s", epoch, Policy(), prefix, start + 30 * M, TTL, True)
    alpha_run, _ = _run(client, vision, ids["alpha"])
    beta_run, beta_node = _run(client, nlp, ids["beta"])
    with wiring.uow() as uow:
        assert uow.runs.set_state(alpha_run, ("admitted",), "running", "pods running", start + 15 * M)
        assert uow.runs.set_state(beta_run, ("admitted",), "running", "pods running", start + 30 * M)
        uow.commit()
    ids["urgent"] = _submit(client, vision, "urgent", 8, priority_class="urgent")
    run_cycle(wiring.uow, "s", epoch, Policy(), prefix, start + 60 * M, TTL, True)
    urgent_run, urgent_node = _run(client, vision, ids["urgent"])
    ids["gamma"] = _submit(client, vision, "gamma", 1)
    ids["delta"] = _submit(client, nlp, "delta", 1)
    assert client.post(f"/v1/workloads/{ids['delta']}/cancel", headers=nlp.headers).status_code == 200
    windows = fold(
        _samples(beta_run, beta_node, 0.0, start + 30 * M, start + 90 * M)
        + _samples(urgent_run, urgent_node, 0.5, start + 60 * M, start + 120 * M)
    )
    submitted = {"alpha": 0, "beta": 5, "urgent": 50, "gamma": 70, "delta": 80}
    with wiring.uow() as uow:
        assert uow.runs.set_state(urgent_run, ("admitted",), "running", "pods running", start + 61 * M)
        assert uow.runs.set_state(
            beta_run, ("running",), "preempted", "reclaimed-idle: idle", start + 90 * M, cause=EndCause.RECLAIMED_IDLE
        )
        for name, minutes in submitted.items():
            uow.session.execute(  # type: ignore[attr-defined]
                update(WorkloadRow).where(WorkloadRow.id == ids[name]).values(created_at=start + minutes * M)
            )
        uow.session.execute(  # type: ignore[attr-defined]
            update(WorkloadRow).where(WorkloadRow.id == ids["delta"]).values(finished_at=start + 95 * M)
        )
        uow.telemetry.merge_windows(windows, start + 2 * timedelta(hours=1))
        uow.commit()
    # The scheduler really preempted alpha for urgent (and audited the beneficiary).
    alpha_view = client.get(f"/v1/workloads/{ids['alpha']}", headers=vision.headers).json()
    assert alpha_view["runs"][0]["state"] == "preempted"
    return Case(start, vision, nlp, ids)


def _rows(report: dict[str, Any], key: str, **match: Any) -> list[dict[str, Any]]:
    return [r for r in report[key] if all(r[k] == v for k, v in match.items())]


def test_waiting_counts_the_pending_ones_and_isolates_teams(
    case: Case, client: TestClient, admin: dict[str, str]
) -> None:
    before = utc_now()
    r = client.get("/v1/reports/waiting", params=case.params(), headers=admin)
    after = utc_now()
    assert r.status_code == 200, r.text
    report = r.json()
    gamma_low = (before - (case.start + 70 * M)).total_seconds()
    gamma_high = (after - (case.start + 70 * M)).total_seconds()
    (vision,) = _rows(report, "teams", team="vision")
    # vision waited 600 s (alpha), 600 s (urgent) and gamma is still waiting: p50 600, p95 = gamma's.
    assert (vision["workloads"], vision["admitted"], vision["still_pending"]) == (3, 2, 1)
    assert vision["p50_seconds"] == 600
    assert gamma_low - 1 <= vision["p95_seconds"] <= gamma_high + 1
    assert vision["max_seconds"] == vision["p95_seconds"]
    (nlp,) = _rows(report, "teams", team="nlp")
    # nlp: beta 1500 s, delta left after 900 s without an admission.
    assert (nlp["workloads"], nlp["admitted"], nlp["left_unadmitted"], nlp["p50_seconds"], nlp["p95_seconds"]) == (
        2,
        1,
        1,
        900,
        1500,
    )
    (big,) = _rows(report, "rows", team="vision", size="2-8")
    assert (big["workloads"], big["p50_seconds"], big["p95_seconds"]) == (2, 600, 600)
    (small,) = _rows(report, "rows", team="vision", size="<=1")
    assert small["still_pending"] == 1
    assert report["total"]["workloads"] == 5
    assert "still_pending" in report["note"]

    mine = client.get("/v1/reports/waiting", params=case.params(), headers=case.nlp.headers).json()
    assert {r["team"] for r in mine["rows"] + mine["teams"]} == {"nlp"}
    assert mine["total"]["workloads"] == 2


def test_fairness_share_against_entitlement_per_bucket(case: Case, client: TestClient, admin: dict[str, str]) -> None:
    r = client.get("/v1/reports/fairness", params=case.params(bucket=3600), headers=admin)
    assert r.status_code == 200, r.text
    report = r.json()
    assert report["capacity_gpu_eq"] == 16
    # Entitlements: nlp (4 + 12 x 3/4) / 16 = 0.8125, vision (12 x 1/4) / 16 = 0.1875.
    assert report["entitlements"] == {"nlp-train": 0.8125, "vision-train": 0.1875}
    first, second = case.start.isoformat(), (case.start + timedelta(hours=1)).isoformat()

    def row(bucket: str, queue: str) -> dict[str, Any]:
        (found,) = [x for x in report["rows"] if _same(x["bucket_start"], bucket) and x["queue"] == queue]
        return found

    # First hour: vision 8 GPUs x 50 min = 6.667, nlp 8 x 30 min = 4 GPU-hours: shares 0.625 / 0.375.
    assert row(first, "vision-train")["allocated_gpu_hours"] == pytest.approx(20 / 3, abs=1e-5)
    assert row(first, "vision-train")["share"] == pytest.approx(0.625, abs=1e-6)
    assert row(first, "vision-train")["share_over_entitlement"] == pytest.approx(0.625 / 0.1875, abs=1e-5)
    assert row(first, "nlp-train")["share"] == pytest.approx(0.375, abs=1e-6)
    # Second hour: vision 8 (urgent), nlp 4 (beta until S+90m): 2/3 and 1/3.
    assert row(second, "vision-train")["share"] == pytest.approx(2 / 3, abs=1e-6)
    assert row(second, "nlp-train")["share_over_entitlement"] == pytest.approx((1 / 3) / 0.8125, abs=1e-5)

    mine = client.get("/v1/reports/fairness", params=case.params(bucket=3600), headers=case.vision.headers).json()
    assert {x["queue"] for x in mine["rows"]} == {"vision-train"}
    assert mine["entitlements"] == {"vision-train": 0.1875}
    # A team token's share is still of the whole fleet.
    assert sorted(x["share"] for x in mine["rows"]) == pytest.approx([0.625, 2 / 3], abs=1e-6)
    teams = client.get("/v1/reports/fairness", params=case.params(bucket=3600, by="team"), headers=admin).json()
    assert {(x["team"], x["queue"]) for x in teams["rows"]} == {("nlp", "all"), ("vision", "all")}


def _same(a: str, b: str) -> bool:
    return datetime.fromisoformat(a).astimezone(UTC) == datetime.fromisoformat(b).astimezone(UTC)


def test_evictions_lost_returned_and_beneficiaries(case: Case, client: TestClient, admin: dict[str, str]) -> None:
    report = client.get("/v1/reports/evictions", params=case.params(), headers=admin).json()
    (preempted,) = _rows(report, "rows", kind="preempted")
    # alpha ran from S+15m to S+60m on 8 GPUs: 6 GPU-hours of work thrown away, for vision's urgent.
    assert (preempted["victim_team"], preempted["beneficiary_team"]) == ("vision", "vision")
    assert preempted["gpu_hours_lost"] == pytest.approx(6.0)
    assert preempted["gpu_hours_returned"] == 0
    (idle,) = _rows(report, "rows", kind="reclaimed-idle")
    # beta ran S+30m to S+90m (8 lost) and handed 8 GPUs back for the last 30 min of R (4 returned).
    assert (idle["victim_team"], idle["beneficiary_team"]) == ("nlp", "unknown")
    assert (idle["gpu_hours_lost"], idle["gpu_hours_returned"]) == (pytest.approx(8.0), pytest.approx(4.0))
    assert report["total"]["evictions"] == 2
    assert {k["kind"]: k["evictions"] for k in report["by_kind"]} == {
        "preempted": 1,
        "reclaimed": 0,
        "reclaimed-idle": 1,
        "rebalanced": 0,
        "taken-back": 0,
    }
    mine = client.get("/v1/reports/evictions", params=case.params(), headers=case.nlp.headers).json()
    assert [r["kind"] for r in mine["rows"]] == ["reclaimed-idle"]


def test_cost_and_timeline(case: Case, client: TestClient, admin: dict[str, str]) -> None:
    report = client.get("/v1/reports/cost", params=case.params(), headers=admin).json()
    vision = next(g for g in report["groups"] if g["group"] == "vision")
    nlp = next(g for g in report["groups"] if g["group"] == "nlp")
    # vision: alpha 8 x 50 min + urgent 8 x 60 min = 14.667 GPU-hours; urgent measured 8 at 0.5.
    assert vision["allocated_gpu_hours"] == pytest.approx(8 * 11 / 6, abs=1e-5)
    assert vision["allocated_cost"] == pytest.approx(8 * 11 / 6 * PRICE, abs=1e-4)
    assert vision["measured_cost"] == pytest.approx(8 * PRICE, abs=1e-4)
    assert vision["used_cost"] == pytest.approx(4 * PRICE, abs=1e-4)
    assert vision["cost_at_stake"] == pytest.approx((8 * 11 / 6 - 4) * PRICE, abs=1e-4)
    assert (nlp["allocated_cost"], nlp["used_cost"], nlp["cost_at_stake"]) == (
        pytest.approx(8 * PRICE),
        0,
        pytest.approx(8 * PRICE),
    )
    models = client.get("/v1/reports/cost", params=case.params(group_by="gpu_model"), headers=admin).json()
    assert [g["group"] for g in models["groups"]] == ["H100-80GB"]
    assert models["total"]["allocated_cost"] == pytest.approx(report["total"]["allocated_cost"])
    mine = client.get("/v1/reports/cost", params=case.params(), headers=case.nlp.headers).json()
    assert [g["group"] for g in mine["groups"]] == ["nlp"]

    timeline = client.get("/v1/reports/timeline", params=case.params(bucket=3600), headers=admin).json()
    second = case.start + timedelta(hours=1)
    (v2,) = [r for r in timeline["rows"] if r["group"] == "vision" and _same(r["bucket_start"], second.isoformat())]
    assert (v2["allocated_gpu_hours"], v2["used_gpu_hours"]) == (pytest.approx(8.0), pytest.approx(4.0))
    (n2,) = [r for r in timeline["rows"] if r["group"] == "nlp" and _same(r["bucket_start"], second.isoformat())]
    assert (n2["allocated_gpu_hours"], n2["idle_gpu_hours"], n2["reclaimed_gpu_hours"]) == (
        pytest.approx(4.0),
        pytest.approx(4.0),
        pytest.approx(4.0),
    )


@pytest.mark.parametrize(
    ("route", "extra", "words"),
    [
        ("waiting", {"to": "2026-01-01T00:00:00"}, "after"),
        ("cost", {"from": "2025-01-01T00:00:00", "to": "2025-06-01T00:00:00"}, "92 days"),
        (
            "fairness",
            {"from": "2025-01-01T00:00:00", "to": "2025-04-01T00:00:00", "bucket": 300},
            "at most 1000 buckets",
        ),
        ("timeline", {"bucket": 60}, ""),
        ("fairness", {"by": "cluster"}, ""),
    ],
)
def test_bad_ranges_get_a_422_with_a_sentence(
    wiring: Wiring, client: TestClient, admin: dict[str, str], route: str, extra: dict[str, Any], words: str
) -> None:
    params = {"from": "2026-01-02T00:00:00", "to": "2026-01-03T00:00:00", **extra}
    r = client.get(f"/v1/reports/{route}", params=params, headers=admin)
    assert r.status_code == 422, r.text
    assert words in r.text


class _Html(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)


def test_the_cli_writes_csv_and_one_self_contained_html_page(
    case: Case, client: TestClient, admin: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def through_client(self: Api, method: str, path: str, *, params: Any = None, **_: Any) -> Any:
        response = client.request(method, path, params=params, headers={"Authorization": f"Bearer {self.token}"})
        assert response.status_code == 200, response.text
        return response

    monkeypatch.setattr(Api, "request", through_client)
    group = click.Group("gpufleet")
    register(group)
    naive = "%Y-%m-%dT%H:%M:%S"  # the CLI takes naive UTC times
    end = case.start + timedelta(hours=2)
    span = ["--from", case.start.strftime(naive), "--to", end.strftime(naive), "--api", "http://test"]
    token = admin["Authorization"].removeprefix("Bearer ")
    result = CliRunner().invoke(group, ["report", "cost", *span, "--token", token, "--csv"])
    assert result.exit_code == 0, result.output
    rows = list(csv.reader(io.StringIO(result.output)))
    assert rows[0] == [
        "group",
        "allocated_gpu_hours",
        "used_gpu_hours",
        "allocated_cost",
        "measured_cost",
        "used_cost",
        "cost_at_stake",
        "unmeasured_cost",
    ]
    assert [r[0] for r in rows[1:]] == ["nlp", "vision", "total"]
    assert float(rows[1][3]) == pytest.approx(8 * PRICE)

    out = tmp_path / "fleet.html"
    result = CliRunner().invoke(group, ["report", "all", *span, "--token", token, "--bucket", "1h", "--html", str(out)])
    assert result.exit_code == 0, result.output
    page = out.read_text()
    parser = _Html()
    parser.feed(page)
    parser.close()
    assert parser.tags.count("section") == 6
    svgs = re.findall(r"<svg\b.*?</svg>", page, flags=re.DOTALL)
    # timeline 2, utilization 1, waiting 1, fairness 1, evictions 1, cost 1
    assert len(svgs) == parser.tags.count("svg") == 7
    for svg in svgs:
        root = ET.fromstring(svg)
        assert root.get("role") == "img"
    assert "<script" not in page.lower()
    assert not re.search(r"(src|href)\s*=", page)
    assert "http" not in page.replace("http://www.w3.org/2000/svg", "")
    titles = [ET.fromstring(s).findtext("{http://www.w3.org/2000/svg}title") for s in svgs]
    assert "Wait from submission to first admission, per team" in titles
    assert "no data" not in page  # every plot has data in this fleet

    json_out = CliRunner().invoke(group, ["report", "waiting", *span, "--token", case.nlp.token, "--json"])
    assert json.loads(json_out.output)["total"]["workloads"] == 2
