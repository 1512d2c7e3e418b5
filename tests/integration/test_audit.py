"""`gpufleet audit` through the real database (SQLite and PostgreSQL): the demo's fleet and hoarding
story give exactly the findings the demo really has; a team sees only its own and the fleet's; bad
filters are 422s; `--fail-on` sets the CLI's exit status; the daily event is written once a day;
an inventory report's non-GPU pods are kept per node and reported per pool."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import uvicorn
from click.testing import CliRunner
from fastapi.testclient import TestClient

from adapters.nats.server import free_port
from controlplane.api.app import create_app
from controlplane.api.context import ApiContext
from controlplane.bootstrap import Wiring
from controlplane.bootstrap.wiring import register_default_fleet
from controlplane.cli import demo, seed
from controlplane.cli.main import main
from controlplane.core.audit import AuditThresholds
from controlplane.core.snapshot import Policy
from controlplane.service import audit as svc
from controlplane.service.idle import idle_pass
from controlplane.service.inventory import InventoryNode, InventoryReport, apply_inventory
from controlplane.service.inventory_node import NonGpuPods
from controlplane.service.kubeconfigs import FileKubeconfigStore
from controlplane.service.scheduling import acquire_leadership, run_cycle
from controlplane.service.telemetry import fold
from controlplane.service.telemetry_wire import GpuSample, Metric
from tests.integration.fleet import admin_headers

# A fixed day (so the allocation-vs-use lookback holds only this story), on a 30 s window boundary.
START = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
HOARDER_CLUSTER = "oke-us-ashburn-1"


@dataclass
class Demo:
    client: TestClient
    wiring: Wiring
    admin: dict[str, str]
    demo: dict[str, str]
    vision: dict[str, str]
    now: datetime
    hoarder_run: str


def _samples(run_id: str, nodes: list[str], start: datetime, end: datetime) -> list[GpuSample]:
    """The demo's hoarder as simulated clusters report it: busy for 45 s, then idle."""
    out = []
    t = start
    while t < end:
        activity = 0.75 if (t - start).total_seconds() < 45 else 0.0
        out += [
            GpuSample(
                cluster=HOARDER_CLUSTER,
                node=node,
                gpu_uuid=f"GPU-{node}-{gpu}",
                gpu_index=gpu,
                timestamp=t.timestamp(),
                metrics={Metric.SM_ACTIVE: activity},
                run_id=run_id,
            )
            for node in nodes
            for gpu in range(8)
        ]
        t += timedelta(seconds=5)
    return out


@pytest.fixture
def story(wiring: Wiring, tmp_path: Path) -> Iterator[Demo]:
    """`gpufleet up --demo`'s fleet, teams and policy, and its hoarder marked reclaimable by the
    demo's idle policy, on a virtual clock in one process."""
    settings = demo.demo_settings(wiring.settings)
    rules = settings.idle_rules()
    clock = {"now": START}
    app = create_app(
        ApiContext(
            uow_factory=wiring.uow,
            subject_prefix=settings.subject_prefix,
            clock=lambda: clock["now"],
            idle_rules=rules,
        )
    )
    seed.seed_defaults(wiring)
    register_default_fleet(wiring)
    demo.ensure_demo_policy(wiring)
    team = {"Authorization": f"Bearer {demo.ensure_demo_team(wiring, tmp_path / 'demo.token')}"}
    vision = {"Authorization": f"Bearer {demo.ensure_waiting_team(wiring, tmp_path / 'vision.token')}"}
    with TestClient(app) as client:
        body = dict(demo.HOARDER_WORKLOAD, queue="research")
        r = client.post("/v1/workloads", json=body, headers=team)
        assert r.status_code == 201, r.text
        workload = r.json()["id"]
        epoch = acquire_leadership(wiring.uow, "s", START, 15.0)
        assert epoch is not None
        run_cycle(wiring.uow, "s", epoch, Policy(), settings.subject_prefix, START, 15_000.0, True)
        view = client.get(f"/v1/workloads/{workload}", headers=team).json()
        assert view["state"] == "admitted", view
        run_id, nodes = view["runs"][-1]["id"], view["nodes"]
        with wiring.uow() as uow:
            assert uow.runs.set_state(run_id, ("admitted",), "running", "pods running", START)
            uow.workloads.set_state(workload, ("admitted",), "running", "pods running", START)
            uow.commit()
        now = START + timedelta(minutes=6)
        with wiring.uow() as uow:
            uow.telemetry.merge_windows(fold(_samples(run_id, nodes, START, now), demo.DEMO_WINDOW_SECONDS), now)
            uow.commit()
        idle_pass(wiring.uow, rules, settings.subject_prefix, now)
        with wiring.uow() as uow:
            assert uow.idle.findings()[run_id].stage == "reclaim"
        clock["now"] = now
        yield Demo(client, wiring, admin_headers(wiring), team, vision, now, run_id)


def _rules(client: TestClient, headers: dict[str, str], query: str = "") -> list[tuple[str, str]]:
    r = client.get(f"/v1/audit{query}", headers=headers)
    assert r.status_code == 200, r.text
    return [(f["rule"], f["severity"]) for f in r.json()["findings"]]


def test_the_demo_reports_its_time_sliced_pool_and_its_hoarder_and_nothing_else(story: Demo) -> None:
    report = story.client.get("/v1/audit", headers=story.admin).json()
    found = {(f["rule"], tuple(o["name"] for o in f["objects"])) for f in report["findings"]}
    assert found == {
        ("timeslice-pool-open-to-all", ("gke-us-central1/g2-l4-shared",)),
        ("idle-run", (story.hoarder_run, "demo")),
        ("allocation-unused", ("demo",)),
    }
    assert report["counts"] == {"info": 0, "warning": 1, "high": 2, "critical": 0}
    idle = next(f for f in report["findings"] if f["rule"] == "idle-run")
    assert idle["evidence"]["stage"] == "reclaim"
    assert idle["evidence"]["gpu_eq"] == 32
    assert [f["severity"] for f in report["findings"]] == ["high", "high", "warning"]  # most severe first
    unused = next(f for f in report["findings"] if f["rule"] == "allocation-unused")
    # 32 A100-40GB GPUs for 6 minutes at $3.05, busy (75 %) for the first 45 s only
    assert unused["evidence"]["allocated_gpu_hours"] == pytest.approx(3.2, abs=0.01)
    assert unused["evidence"]["cost_at_stake"] == pytest.approx(unused["evidence"]["wasted_gpu_hours"] * 3.05, abs=0.01)
    assert "GPU-hours" in unused["evidence_text"]
    assert unused["fix_text"]


def test_after_the_reclaim_the_hoarder_is_still_reported_for_the_day(story: Demo) -> None:
    body = dict(demo.WAITING_WORKLOAD, queue=demo.WAITING_QUEUE)
    r = story.client.post("/v1/workloads", json=body, headers=story.vision)
    assert r.status_code == 201, r.text
    epoch = acquire_leadership(story.wiring.uow, "s", story.now, 15.0)
    assert epoch is not None
    prefix = story.wiring.settings.subject_prefix
    result = run_cycle(story.wiring.uow, "s", epoch, Policy(), prefix, story.now, 15_000.0, True)
    assert result.evicted == 1
    report = story.client.get("/v1/audit", headers=story.admin).json()
    assert {(f["rule"], tuple(o["name"] for o in f["objects"])) for f in report["findings"]} == {
        ("timeslice-pool-open-to-all", ("gke-us-central1/g2-l4-shared",)),
        ("idle-reclaimed", ("demo-hoarder", "demo")),
        ("allocation-unused", ("demo",)),
    }
    vision = story.client.get("/v1/audit", headers=story.vision).json()
    assert [f["rule"] for f in vision["findings"]] == ["timeslice-pool-open-to-all"]


def test_a_team_sees_its_own_findings_and_the_fleets_never_another_teams(story: Demo) -> None:
    assert sorted(_rules(story.client, story.demo)) == [
        ("allocation-unused", "high"),
        ("idle-run", "high"),
        ("timeslice-pool-open-to-all", "warning"),
    ]
    vision = story.client.get("/v1/audit", headers=story.vision).json()
    assert [f["rule"] for f in vision["findings"]] == ["timeslice-pool-open-to-all"]
    assert "demo" not in json.dumps(vision["findings"])
    assert vision["counts"]["high"] == 0


def test_filters_and_422s(story: Demo) -> None:
    assert _rules(story.client, story.admin, "?rule=idle-run") == [("idle-run", "high")]
    assert {r for r, _ in _rules(story.client, story.admin, "?min_severity=high")} == {"idle-run", "allocation-unused"}
    both = "?rule=idle-run&rule=timeslice-pool-open-to-all"
    assert {r for r, _ in _rules(story.client, story.admin, both)} == {"idle-run", "timeslice-pool-open-to-all"}
    for query in ("?min_severity=fatal", "?rule=no-such-rule", "?" + "&".join(["rule=idle-run"] * 40)):
        r = story.client.get(f"/v1/audit{query}", headers=story.admin)
        assert r.status_code == 422, (query, r.text)
        assert r.json()["detail"]
    assert story.client.get("/v1/audit").status_code == 401
    assert "/v1/audit" in story.client.get("/openapi.json").json()["paths"]


def test_the_cli_fails_on_findings_at_or_above_fail_on(story: Demo) -> None:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(story.client.app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        token = story.demo["Authorization"].removeprefix("Bearer ")

        def audit(*args: str) -> tuple[int, str]:
            result = CliRunner().invoke(main, ["audit", "--api", f"http://127.0.0.1:{port}", "--token", token, *args])
            return result.exit_code, result.output

        code, out = audit()
        assert code == 0
        assert "idle-run" in out
        assert "g2-l4-shared" in out
        assert audit("--fail-on", "critical")[0] == 0
        assert audit("--fail-on", "high")[0] == 2
        assert audit("--fail-on", "warning", "--rule", "timeslice-pool-open-to-all")[0] == 2
        assert audit("--fail-on", "high", "--rule", "timeslice-pool-open-to-all")[0] == 0
        code, out = audit("--json", "--rule", "idle-run")
        assert code == 0
        assert [f["rule"] for f in json.loads(out)["findings"]] == ["idle-run"]
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_the_daily_audit_event_is_written_once_per_utc_day(story: Demo) -> None:
    prefix = story.wiring.settings.subject_prefix
    rules = demo.demo_settings(story.wiring.settings).idle_rules()
    publish = svc.publish_daily_audit
    assert publish(story.wiring.uow, prefix, rules, AuditThresholds(), story.now)
    assert not publish(story.wiring.uow, prefix, rules, AuditThresholds(), story.now + timedelta(hours=3))
    assert publish(story.wiring.uow, prefix, rules, AuditThresholds(), story.now + timedelta(days=1))
    with story.wiring.uow() as uow:
        events = [(s, json.loads(p)) for _, s, p in uow.outbox.unpublished(10_000) if s.endswith(".report.audit")]
    assert [s for s, _ in events] == [f"{prefix}.events.report.audit"] * 2
    first = events[0][1]
    assert first["type"] == "audit.report"
    assert first["data"]["day"] == "2026-11-30"
    assert {f["rule"] for f in first["data"]["findings"]} == {
        "timeslice-pool-open-to-all",
        "idle-run",
        "allocation-unused",
    }
    assert first["id"] != events[1][1]["id"]


def test_non_gpu_pods_from_an_inventory_report_are_kept_per_node_and_reported_per_pool(wiring: Wiring) -> None:
    client = TestClient(create_app(ApiContext(uow_factory=wiring.uow)))
    client.app.state.kubeconfigs = FileKubeconfigStore(wiring.settings.state_dir / "kubeconfigs")  # type: ignore[attr-defined]
    admin = admin_headers(wiring)
    kubeconfig = (
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://k.example:6443'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n"
    )
    r = client.post(
        "/v1/clusters", json={"name": "k1", "provider": "kubernetes", "kubeconfig": kubeconfig}, headers=admin
    )
    assert r.status_code == 201, r.text
    taint = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]

    def node(name: str, pods: NonGpuPods | None) -> InventoryNode:
        return InventoryNode.model_validate(
            {
                "name": name,
                "pool": "gpu",
                "schedulable": True,
                "ready": True,
                "gpu_product": "NVIDIA-L4",
                "gpu_model": "L4",
                "gpu_count": 4,
                "allocatable": {"cpu": 48000, "memory": 192 * 1024**3, "nvidia.com/gpu": 4},
                "taints": taint,
                "non_gpu_pods": pods.model_dump() if pods else None,
            }
        )

    now = datetime.now(UTC)
    seen = NonGpuPods(count=3, sample=["etl/a", "etl/b", "web/c"])
    report = InventoryReport(
        observed_at=now, nodes=[node("n1", seen), node("n2", NonGpuPods(count=0)), node("n3", None)]
    )
    with wiring.uow() as uow:
        apply_inventory(uow, "k1", report, now, "gpufleet")
        uow.commit()
    found = client.get("/v1/audit", params={"rule": "non-gpu-pods-on-gpu-nodes"}, headers=admin).json()["findings"]
    assert [(f["objects"][0]["name"], f["evidence"]["pods"], f["evidence"]["sample"]) for f in found] == [
        ("k1/gpu", 3, ["etl/a", "etl/b", "web/c"])
    ]
    # a later report replaces the summary: the pods left
    later = InventoryReport(
        observed_at=now + timedelta(minutes=1),
        nodes=[node("n1", NonGpuPods(count=0)), node("n2", None), node("n3", None)],
    )
    with wiring.uow() as uow:
        apply_inventory(uow, "k1", later, now + timedelta(minutes=1), "gpufleet")
        uow.commit()
    assert client.get("/v1/audit", params={"rule": "non-gpu-pods-on-gpu-nodes"}, headers=admin).json()["findings"] == []
