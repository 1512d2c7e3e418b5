"""Inference serving signals through the real database (PostgreSQL and SQLite): declared at submit,
ingested from telemetry batches (authorised per cluster, unknown runs dropped, redelivery and
reordering harmless), fed to the idle policy, shown on the workload view and read by the audit."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi.testclient import TestClient

from controlplane.bootstrap import Wiring, utc_now
from controlplane.core.idle import IdlePolicy, IdleRules
from controlplane.core.snapshot import Policy
from controlplane.service.idle import idle_pass
from controlplane.service.ingest_messages import InboundMessage
from controlplane.service.ingest_messages import Outcome as IngestOutcome
from controlplane.service.ingest_submits import SubmitMessage, apply_submits
from controlplane.service.scheduling import acquire_leadership, run_cycle
from controlplane.service.serving import ServingReading
from controlplane.service.telemetry import BatchMessage, Outcome, fold, handle_batch
from controlplane.service.telemetry_wire import GpuSample, Metric, encode_batch
from tests.integration.fleet import Tenant, add_tenant, gang, setup_fleet
from tests.telemetry.known import register

TTL = 15.0
RULES = IdleRules(
    default=IdlePolicy(grace_seconds=600, notify_after=2, deprioritize_after=4, reclaim_after=6), working_hours=None
)
SERVING = {"traffic_metric": "vllm:request_success_total", "latency_metric": "vllm:e2e_request_latency_seconds"}


def _aligned(when: datetime) -> datetime:
    return datetime.fromtimestamp(when.timestamp() // 300 * 300, UTC)


def _inference(name: str, queue: str, serving: dict[str, Any] | None = None) -> dict[str, Any]:
    body = gang(name, queue, replicas=1, gpus=8, kind="inference")
    if serving is not None:
        body["serving"] = serving
    return body


def _message(
    prefix: str, cluster: str, msg_id: str, samples: list[GpuSample], serving: list[ServingReading]
) -> BatchMessage:
    return BatchMessage(f"{prefix}.telemetry.{cluster}.dcgm", encode_batch(cluster, samples, serving), msg_id)


def test_submit_validates_and_the_view_shows_the_serving_block(client: TestClient, tenant: Tenant) -> None:
    declared = {**SERVING, "latency_objective_ms": 500, "metrics_port": 8000, "metrics_path": "/metrics"}
    r = client.post("/v1/workloads", json=_inference("chat", tenant.queue, declared), headers=tenant.headers)
    assert r.status_code == 201, r.text
    assert r.json()["serving"] == declared
    again = client.get(f"/v1/workloads/{r.json()['id']}", headers=tenant.headers).json()
    assert again["serving"] == declared
    plain = client.post("/v1/workloads", json=_inference("plain", tenant.queue), headers=tenant.headers)
    assert plain.status_code == 201
    assert plain.json()["serving"] is None

    refused = {
        "training": gang("t", tenant.queue, replicas=1, serving=SERVING),
        "metric name": _inference("x", tenant.queue, {"traffic_metric": "vllm request total"}),
        "port": _inference("x", tenant.queue, {**SERVING, "metrics_port": 70000}),
        "path": _inference("x", tenant.queue, {**SERVING, "metrics_path": "metrics?x=1"}),
        "long path": _inference("x", tenant.queue, {**SERVING, "metrics_path": "/" + "a" * 300}),
        "no signal": _inference("x", tenant.queue, {"metrics_port": 8000}),
        "objective without latency": _inference(
            "x", tenant.queue, {"traffic_metric": "requests_total", "latency_objective_ms": 100}
        ),
        "unknown key": _inference("x", tenant.queue, {**SERVING, "scrape_everything": True}),
        "string port": _inference("x", tenant.queue, {**SERVING, "metrics_port": "8000"}),
    }
    for what, body in refused.items():
        r = client.post("/v1/workloads", json=body, headers=tenant.headers)
        assert r.status_code == 422, (what, r.text)
        assert "serving" in r.text, (what, r.text)


def test_ingest_is_authorised_per_cluster_and_idempotent(wiring: Wiring) -> None:
    register(wiring, "c1", "run-a", "run-b")
    register(wiring, "c2", "run-z")
    prefix = wiring.settings.subject_prefix
    now = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    t1, t2 = now - timedelta(seconds=60), now - timedelta(seconds=30)
    first = [ServingReading("run-a", t2, 4.5, 120.0), ServingReading("run-b", t1, 0.0, None)]
    # c1 reporting c2's run, and a run nobody knows: both dropped, the rest taken.
    mixed = [ServingReading("run-z", t2, 99.0, 1.0), ServingReading("run-ghost", t2, 1.0, 1.0)]
    result = handle_batch(
        wiring.uow(),
        [_message(prefix, "c1", "m1", [], first), _message(prefix, "c1", "m2", [], [*mixed, first[0]])],
        prefix,
        now,
    )
    assert [o for o, _ in result.outcomes] == [Outcome.APPLIED, Outcome.APPLIED]
    assert "2 samples or serving readings of runs that are not runs of c1 refused" in result.outcomes[1][1]
    only_strangers = handle_batch(wiring.uow(), [_message(prefix, "c1", "m3", [], mixed)], prefix, now)
    assert only_strangers.outcomes[0][0] is Outcome.UNKNOWN  # dead-lettered: nothing of it is kept
    with wiring.uow() as uow:
        stored = uow.serving.latest(["run-a", "run-b", "run-z", "run-ghost"])
    assert set(stored) == {"run-a", "run-b"}
    assert (stored["run-a"].requests_per_second, stored["run-a"].latency_ms) == (4.5, 120.0)
    assert stored["run-a"].observed_at == t2

    # Redelivery is a no-op (the inbox); an older reading arriving late never replaces a newer one.
    again = handle_batch(wiring.uow(), [_message(prefix, "c1", "m1", [], first)], prefix, now)
    assert again.outcomes[0][0] is Outcome.DUPLICATE
    late = [ServingReading("run-a", t1, 50.0, 9.0)]
    assert handle_batch(wiring.uow(), [_message(prefix, "c1", "m4", [], late)], prefix, now).serving == 1
    newer = [ServingReading("run-b", now, 2.0, 80.0)]
    handle_batch(wiring.uow(), [_message(prefix, "c1", "m5", [], newer)], prefix, now)
    with wiring.uow() as uow:
        stored = uow.serving.latest(["run-a", "run-b"])
    assert (stored["run-a"].requests_per_second, stored["run-a"].observed_at) == (4.5, t2)
    assert (stored["run-b"].requests_per_second, stored["run-b"].latency_ms) == (2.0, 80.0)

    # Malformed serving entries dead-letter the message, whatever else it holds.
    bad = BatchMessage(
        f"{prefix}.telemetry.c1.dcgm",
        b'{"schema":"gpufleet.dcgm/v1","cluster":"c1","fields":[],"samples":[],"serving":[["run-a",1,-1,null]]}',
        "m6",
    )
    outcome, detail = handle_batch(wiring.uow(), [bad], prefix, now).outcomes[0]
    assert outcome is Outcome.MALFORMED
    assert "serving[0]" in detail


def _samples(run_id: str, nodes: list[str], activity: float, start: datetime, end: datetime) -> list[GpuSample]:
    out = []
    t = start
    while t < end:
        for node in nodes:
            for gpu in range(8):
                out.append(
                    GpuSample(
                        "sim-h100", node, f"GPU-{node}-{gpu}", gpu, t.timestamp(), {Metric.SM_ACTIVE: activity}, run_id
                    )
                )
        t += timedelta(seconds=30)
    return out


def test_idle_pass_reclaims_inference_without_traffic_and_exempts_serving_ones(
    wiring: Wiring, client: TestClient, admin: dict[str, str]
) -> None:
    setup_fleet(client, admin)
    tenant = add_tenant(client, admin, "serve", "serve-prod")
    prefix = wiring.settings.subject_prefix
    start = _aligned(utc_now()) - timedelta(hours=2)
    epoch = acquire_leadership(wiring.uow, "s", start, TTL)
    assert epoch is not None
    ids = {}
    for name, serving in (("quiet", SERVING), ("busy-chat", {**SERVING, "latency_objective_ms": 100}), ("mute", None)):
        r = client.post("/v1/workloads", json=_inference(name, tenant.queue, serving), headers=tenant.headers)
        assert r.status_code == 201, r.text
        ids[name] = r.json()["id"]
    run_cycle(wiring.uow, "s", epoch, Policy(), prefix, start, TTL * 1000, True)
    runs: dict[str, tuple[str, list[str]]] = {}
    for name, workload_id in ids.items():
        view = client.get(f"/v1/workloads/{workload_id}", headers=tenant.headers).json()
        runs[name] = (view["runs"][-1]["id"], view["nodes"])
    with wiring.uow() as uow:
        for name, (run_id, _) in runs.items():
            assert uow.runs.set_state(run_id, ("admitted",), "running", "pods running", start)
            uow.workloads.set_state(ids[name], ("admitted",), "running", "pods running", start)
        uow.commit()

    # All three hold idle GPUs for 100 minutes; only the traffic differs.
    now = start + timedelta(minutes=100)
    samples = [s for run_id, nodes in runs.values() for s in _samples(run_id, nodes, 0.0, start, now)]
    readings = [
        ServingReading(runs["quiet"][0], now - timedelta(seconds=20), 0.0, None),
        ServingReading(runs["busy-chat"][0], now - timedelta(seconds=20), 3.2, 250.0),
    ]
    with wiring.uow() as uow:
        uow.telemetry.merge_windows(fold(samples), now)
        uow.commit()
    result = handle_batch(wiring.uow(), [_message(prefix, "sim-h100", "serve-1", [], readings)], prefix, now)
    assert result.serving == 2

    idle_pass(wiring.uow, RULES, prefix, now)
    with wiring.uow() as uow:
        findings = uow.idle.findings()
        signals = {s.workload: s for s in uow.serving.signals()}
    assert findings[runs["quiet"][0]].stage == "reclaim"  # zero requests/s and idle GPUs
    assert findings[runs["busy-chat"][0]].status == "exempt"
    assert "3.2 requests/s" in findings[runs["busy-chat"][0]].reason
    assert findings[runs["mute"][0]].status == "exempt"  # no declared signal: never judged idle
    assert "no traffic data" in findings[runs["mute"][0]].reason

    # The workload view shows the latest reading on the run.
    shown = client.get(f"/v1/workloads/{ids['busy-chat']}", headers=tenant.headers).json()["runs"][-1]["serving"]
    assert (shown["requests_per_second"], shown["latency_ms"]) == (3.2, 250.0)

    # The audit's read: declared or not, latest reading, objective and whether it is breached.
    assert set(signals) == {"quiet", "busy-chat", "mute"}
    assert (signals["mute"].declared, signals["mute"].requests_per_second) == (False, None)
    assert signals["busy-chat"].declared
    assert signals["busy-chat"].latency_objective_ms == 100.0
    assert signals["busy-chat"].objective_breached
    assert signals["quiet"].declared
    assert not signals["quiet"].objective_breached

    # A reading gone stale is unknown traffic again: the quiet server is exempt, not idle.
    later = now + timedelta(minutes=30)
    with wiring.uow() as uow:
        uow.telemetry.merge_windows(fold(_samples(runs["quiet"][0], runs["quiet"][1], 0.0, now, later)), later)
        uow.commit()
    idle_pass(wiring.uow, RULES, prefix, later)
    with wiring.uow() as uow:
        stale = uow.idle.findings()[runs["quiet"][0]]
    assert stale.status == "exempt"
    assert "stale" in stale.reason


def test_a_nats_submit_stores_the_serving_block_and_refuses_a_bad_one(
    wiring: Wiring, client: TestClient, tenant: Tenant
) -> None:
    prefix = wiring.settings.subject_prefix
    declared = {**SERVING, "latency_objective_ms": 300.0, "metrics_port": 9000, "metrics_path": "/stats"}

    def submit(msg_id: str, body: dict[str, Any]) -> SubmitMessage:
        subject = f"{prefix}.submit.{tenant.team}.{tenant.queue}"
        return SubmitMessage(
            InboundMessage(subject, json.dumps(body).encode(), {}, msg_id), tenant.team, tenant.queue, body
        )

    good = _inference("nats-chat", tenant.queue, declared)
    bad = gang("nats-train", tenant.queue, replicas=1, serving=SERVING)
    with wiring.uow() as uow:
        handled = apply_submits(uow, [submit("n1", good), submit("n2", bad)], prefix, utc_now())
        uow.commit()
    assert handled[0].outcome is IngestOutcome.APPLIED
    assert handled[1].outcome is not IngestOutcome.APPLIED
    assert "serving is for inference workloads only" in handled[1].detail
    view = client.get(f"/v1/workloads/{handled[0].detail}", headers=tenant.headers).json()
    assert view["serving"] == declared
