"""Anti-hoarding through the real database: telemetry windows -> idle findings and events ->
the scheduler reclaims the idle gang's GPUs for a waiting gang, with an audited evidence trail."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fastapi.testclient import TestClient
from sqlalchemy import select

from adapters.sql.tables import AuditRow
from controlplane.bootstrap import Wiring, utc_now
from controlplane.core.idle import IdlePolicy, IdleRules
from controlplane.core.snapshot import Policy
from controlplane.service.idle import idle_pass
from controlplane.service.scheduling import acquire_leadership, run_cycle
from controlplane.service.telemetry import fold
from controlplane.service.telemetry_wire import GpuSample, Metric
from tests.integration.fleet import Tenant, add_tenant, gang

TTL = 15.0
RULES = IdleRules(default=IdlePolicy(grace_seconds=600, notify_after=2, deprioritize_after=4, reclaim_after=6))


def _aligned(when: datetime) -> datetime:
    """On a telemetry window boundary (5 minutes), so the window counts below are exact."""
    return datetime.fromtimestamp(when.timestamp() // 300 * 300, UTC)


def _submit(client: TestClient, tenant: Tenant, name: str, replicas: int) -> str:
    r = client.post("/v1/workloads", json=gang(name, tenant.queue, replicas=replicas), headers=tenant.headers)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def _view(client: TestClient, tenant: Tenant, workload_id: str) -> dict[str, object]:
    return dict(client.get(f"/v1/workloads/{workload_id}", headers=tenant.headers).json())


def _run_and_nodes(client: TestClient, tenant: Tenant, workload_id: str) -> tuple[str, list[str]]:
    view = _view(client, tenant, workload_id)
    runs = view["runs"]
    assert isinstance(runs, list)
    nodes = view["nodes"]
    assert isinstance(nodes, list)
    return str(runs[-1]["id"]), [str(n) for n in nodes]


def _samples(run_id: str, nodes: list[str], activity: float, start: datetime, end: datetime) -> list[GpuSample]:
    out = []
    t = start
    while t < end:
        for node in nodes:
            for gpu in range(8):
                out.append(
                    GpuSample(
                        cluster="sim-h100",
                        node=node,
                        gpu_uuid=f"GPU-{node}-{gpu}",
                        gpu_index=gpu,
                        timestamp=t.timestamp(),
                        metrics={Metric.SM_ACTIVE: activity, Metric.FB_USED: 1000.0},
                        run_id=run_id,
                    )
                )
        t += timedelta(seconds=30)
    return out


def test_idle_gang_is_warned_then_reclaimed_for_a_waiting_gang(
    wiring: Wiring, client: TestClient, tenant: Tenant, admin: dict[str, str]
) -> None:
    other = add_tenant(client, admin, "nlp", "nlp-train")
    prefix = wiring.settings.subject_prefix
    start = _aligned(utc_now()) - timedelta(hours=2)
    epoch = acquire_leadership(wiring.uow, "s", start, TTL)
    assert epoch is not None
    hoarder = _submit(client, tenant, "hoarder", 2)
    busy = _submit(client, tenant, "busy", 2)
    run_cycle(wiring.uow, "s", epoch, Policy(), prefix, start, TTL * 1000, True)
    (hoarder_run, hoarder_nodes), (busy_run, busy_nodes) = (
        _run_and_nodes(client, tenant, hoarder),
        _run_and_nodes(client, tenant, busy),
    )
    with wiring.uow() as uow:
        for run_id, workload_id in ((hoarder_run, hoarder), (busy_run, busy)):
            assert uow.runs.set_state(run_id, ("admitted",), "running", "pods running", start)
            uow.workloads.set_state(workload_id, ("admitted",), "running", "pods running", start)
        uow.commit()
    waiting = _submit(client, other, "waiting", 2)

    # 100 minutes of telemetry: the hoarder's GPUs idle since 40 minutes in, the other gang busy.
    now = start + timedelta(minutes=100)
    windows = fold(
        _samples(hoarder_run, hoarder_nodes, 0.6, start, start + timedelta(minutes=40))
        + _samples(hoarder_run, hoarder_nodes, 0.0, start + timedelta(minutes=40), now)
        + _samples(busy_run, busy_nodes, 0.7, start, now)
    )
    with wiring.uow() as uow:
        uow.telemetry.merge_windows(windows, now)
        uow.commit()

    # Idle for 4 windows after 60 minutes: deprioritized and announced, not yet reclaimable.
    stats = idle_pass(wiring.uow, RULES, prefix, start + timedelta(minutes=60))
    assert stats.events == 1
    with wiring.uow() as uow:
        findings = uow.idle.findings()
        assert findings[hoarder_run].stage == "deprioritize"
        assert findings[busy_run].status == "busy"
        events = [(s, p) for _, s, p in uow.outbox.unpublished(1000) if ".events.idle." in s]
    assert [s for s, _ in events] == [f"{prefix}.events.idle.sim-h100"]
    # The API shows the finding on the live run, to its owner.
    shown = _view(client, tenant, hoarder)["runs"]
    assert isinstance(shown, list)
    assert shown[-1]["idle"]["stage"] == "deprioritize"
    assert shown[-1]["idle"]["idle_windows"] == 4
    busy_runs = _view(client, tenant, busy)["runs"]
    assert isinstance(busy_runs, list)
    assert busy_runs[-1]["idle"]["status"] == "busy"
    assert '"type":"idle.deprioritize"' in events[0][1]
    run_cycle(wiring.uow, "s", epoch, Policy(), prefix, start + timedelta(minutes=60), TTL * 1000, True)
    assert _view(client, tenant, hoarder)["state"] == "running"  # deprioritized is not reclaimed

    # At 100 minutes: idle 12 windows, past the reclaim stage; the waiting gang takes its GPUs.
    idle_pass(wiring.uow, RULES, prefix, now)
    with wiring.uow() as uow:
        assert uow.idle.findings()[hoarder_run].stage == "reclaim"
    result = run_cycle(wiring.uow, "s", epoch, Policy(), prefix, now, TTL * 1000, True)
    assert result.evicted == 1
    assert _view(client, tenant, hoarder)["state"] == "queued"
    assert str(_view(client, tenant, hoarder)["reason"]).startswith("reclaimed-idle:")
    assert _view(client, tenant, busy)["state"] == "running"
    assert _view(client, other, waiting)["state"] == "admitted"
    assert sorted(_run_and_nodes(client, other, waiting)[1]) == sorted(hoarder_nodes)
    with wiring.uow() as uow:
        audit = [
            (row.object_id, dict(row.detail))
            for row in uow.session.scalars(  # type: ignore[attr-defined]
                select(AuditRow).where(AuditRow.action == "run.reclaim-idle")
            )
        ]
    assert len(audit) == 1
    object_id, detail = audit[0]
    assert object_id == hoarder_run
    assert detail["epoch"] == epoch
    assert detail["beneficiary"] == waiting
    assert len(detail["evidence"]) >= 6
    assert all(e["status"] == "idle" for e in detail["evidence"])

    # Requeued, the hoarder waits for free capacity and evicts nobody, though its queue could
    # otherwise reclaim from nlp, which now borrows.
    run_cycle(wiring.uow, "s", epoch, Policy(), prefix, now + timedelta(minutes=1), TTL * 1000, True)
    assert _view(client, tenant, hoarder)["state"] == "queued"
    assert _view(client, other, waiting)["state"] == "admitted"


def test_no_reclaim_without_contention_or_on_stale_data(wiring: Wiring, client: TestClient, tenant: Tenant) -> None:
    prefix = wiring.settings.subject_prefix
    start = _aligned(utc_now()) - timedelta(hours=3)
    epoch = acquire_leadership(wiring.uow, "s", start, TTL)
    assert epoch is not None
    hoarder = _submit(client, tenant, "hoarder", 2)
    run_cycle(wiring.uow, "s", epoch, Policy(), prefix, start, TTL * 1000, True)
    run_id, nodes = _run_and_nodes(client, tenant, hoarder)
    with wiring.uow() as uow:
        uow.runs.set_state(run_id, ("admitted",), "running", "pods running", start)
        uow.workloads.set_state(hoarder, ("admitted",), "running", "pods running", start)
        uow.telemetry.merge_windows(fold(_samples(run_id, nodes, 0.0, start, start + timedelta(minutes=90))), start)
        uow.commit()

    idle_pass(wiring.uow, RULES, prefix, start + timedelta(minutes=90))
    with wiring.uow() as uow:
        assert uow.idle.findings()[run_id].stage == "reclaim"
    # Nobody waits: the hoarder keeps its GPUs.
    assert (
        run_cycle(wiring.uow, "s", epoch, Policy(), prefix, start + timedelta(minutes=91), TTL * 1000, True).evicted
        == 0
    )
    assert _view(client, tenant, hoarder)["state"] == "running"

    # An hour later no telemetry arrived: unknown, not idle; the mark is withdrawn and announced.
    stats = idle_pass(wiring.uow, RULES, prefix, start + timedelta(minutes=150))
    with wiring.uow() as uow:
        finding = uow.idle.findings()[run_id]
        assert finding.status == "unknown"
        assert finding.stage == "none"
        assert "telemetry" in finding.reason
        cleared = [p for _, s, p in uow.outbox.unpublished(1000) if '"type":"idle.cleared"' in p]
    assert stats.events == 1
    assert len(cleared) == 1
    with wiring.uow() as uow:
        assert not any(r.idle_reclaimable for r in uow.snapshots.load().live_runs)
