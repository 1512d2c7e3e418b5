"""The ingest consumers on a real nats-server and database: a submit backlog does not hold back a pod
report (each kind has its own consumer), and several pullers of the submit consumer apply each
message once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import pytest
from fastapi.testclient import TestClient
from nats.aio.client import Client
from nats.js import JetStreamContext
from sqlalchemy import func, select

from adapters.nats.connection import INBOUND_ID_HEADER
from adapters.nats.inbound import JetStreamInbound
from adapters.nats.topology import INBOUND_STREAM, SUBMIT_CONSUMER, ensure_topology, stored_subject
from adapters.sim.cluster import SimCluster
from adapters.sql.tables import InboxRow, OutboxRow, RunRow, WorkloadRow
from controlplane.bootstrap import Wiring, run_components, utc_now
from controlplane.core.snapshot import Policy
from controlplane.service.dispatch import dispatch_once
from controlplane.service.fleet_fit import FleetFit
from controlplane.service.scheduling import acquire_leadership, run_cycle
from controlplane.workers.ingest_loop import ingest_loop
from tests.integration.fleet import Tenant, gang


@pytest.fixture
async def js(wiring: Wiring) -> AsyncIterator[JetStreamContext]:
    nc: Client = await nats.connect(wiring.settings.nats_url)
    context = nc.jetstream()
    # Streams are named per installation; each test gets its own subject prefix, so recreate them.
    for name in (INBOUND_STREAM, "GPUFLEET_EVENTS", "GPUFLEET_DLQ", "GPUFLEET_TELEMETRY"):
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await context.delete_stream(name)
    await ensure_topology(context, wiring.settings.subject_prefix)
    yield context
    await nc.close()


async def _store(js: JetStreamContext, prefix: str, sent_on: str, body: bytes, msg_id: str) -> None:
    """Put a message in the inbound stream as the gateway stores what a sender published on `sent_on`."""
    await js.publish(stored_subject(prefix, sent_on), body, headers={INBOUND_ID_HEADER: msg_id})


def _scalar(wiring: Wiring, query: Any) -> Any:
    with wiring.uow() as uow:
        return uow.session.scalar(query)  # type: ignore[attr-defined]


class _Recorder:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, str]] = []

    async def publish(self, subject: str, payload: bytes, msg_id: str) -> None:
        self.sent.append((subject, payload, msg_id))


async def _running_report(wiring: Wiring, client: TestClient, tenant: Tenant, tmp_path: Path) -> tuple[bytes, str]:
    """A gang admitted and dispatched to the simulated cluster, and that cluster's report of its pod
    running (not applied yet): its body and message id."""
    client.post("/v1/workloads", json=gang("watched", tenant.queue, replicas=1), headers=tenant.headers)
    epoch = acquire_leadership(wiring.uow, "s", utc_now(), 15)
    assert epoch is not None
    run_cycle(wiring.uow, "s", epoch, Policy(), wiring.settings.subject_prefix, utc_now(), 15, True)
    recorder, now = _Recorder(), [1_000.0]
    sim = SimCluster("sim-h100", recorder.publish, "p", tmp_path / "sim.json", start_delay=1.0, clock=lambda: now[0])
    await dispatch_once(wiring.uow, {"sim-h100": sim}, wiring.settings.subject_prefix, utc_now)
    now[0] = 1_001.5
    await sim.tick()
    _, body, msg_id = recorder.sent[-1]
    assert json.loads(body)["pods"][0]["phase"] == "Running"
    return body, msg_id


@pytest.mark.timeout(180)
async def test_a_pod_report_behind_a_submit_backlog_is_applied_before_the_backlog_drains(
    js: JetStreamContext, wiring: Wiring, client: TestClient, tenant: Tenant, tmp_path: Path
) -> None:
    """The ingest component as `gpufleet server run ingest` starts it. The report was stored after
    2,000 submits: one consumer for all would apply it last; its own consumer applies it while the
    submits are still being worked through."""
    prefix = wiring.settings.subject_prefix
    report, report_id = await _running_report(wiring, client, tenant, tmp_path)
    backlog = 2000
    sent_on = f"{prefix}.submit.{tenant.team}.{tenant.queue}"
    for first in range(0, backlog, 250):
        await asyncio.gather(
            *(
                _store(js, prefix, sent_on, json.dumps(gang(f"b{i}", tenant.queue, replicas=1)).encode(), f"b{i}")
                for i in range(first, first + 250)
            )
        )
    await _store(js, prefix, f"{prefix}.cluster.sim-h100.pods", report, report_id)
    stop = asyncio.Event()
    ingest = asyncio.create_task(run_components(wiring.settings, ("ingest",), stop))
    try:
        for _ in range(1200):
            if _scalar(wiring, select(RunRow.state)) == "running":
                break
            await asyncio.sleep(0.05)
        submits_in_sql = int(_scalar(wiring, select(func.count()).select_from(WorkloadRow)) or 0) - 1
        assert _scalar(wiring, select(RunRow.state)) == "running"
        assert submits_in_sql < backlog, "the pod report waited for the whole submit backlog"
        for _ in range(1200):  # and the backlog is applied too
            if int(_scalar(wiring, select(func.count()).select_from(WorkloadRow)) or 0) == backlog + 1:
                break
            await asyncio.sleep(0.05)
        assert int(_scalar(wiring, select(func.count()).select_from(WorkloadRow)) or 0) == backlog + 1
    finally:
        stop.set()
        await asyncio.wait_for(ingest, 60)


@pytest.mark.timeout(180)
async def test_two_pullers_of_the_submit_consumer_apply_each_message_once(
    js: JetStreamContext, wiring: Wiring, tenant: Tenant, caplog: pytest.LogCaptureFixture
) -> None:
    """300 messages: 150 ids, each stored twice (a batch's worth, then the same reversed, so the two
    pullers' batches hold the same inbox keys in opposite orders at once), and every fifth id a retry
    of the one before it under a new message id (same idempotency key). Each id is applied once (a
    batch that meets keys another holds uncommitted waits, then finds them taken); no batch fails.
    (Key order makes a deadlock between such batches impossible; this test is too short-lived to
    show one without it: the two inserts rarely overlap.)"""
    prefix = wiring.settings.subject_prefix
    sent_on = f"{prefix}.submit.{tenant.team}.{tenant.queue}"

    def body(i: int) -> bytes:
        key = f"k{i - 1}" if i % 5 == 4 else f"k{i}"  # a retry of the submit before it
        return json.dumps(gang(f"g{i}", tenant.queue, replicas=1, idempotency_key=key)).encode()

    ids, batch = list(range(150)), 40
    for first in range(0, len(ids), batch):  # a chunk of a batch's size, then the same chunk reversed
        chunk = ids[first : first + batch]
        for i in chunk + chunk[::-1]:
            await _store(js, prefix, sent_on, body(i), f"m{i}")
    stop, fit = asyncio.Event(), FleetFit()
    pullers = [
        asyncio.create_task(
            ingest_loop(
                JetStreamInbound(js, prefix, SUBMIT_CONSUMER), wiring.uow, prefix, utc_now, stop, fit=fit, batch=batch
            )
        )
        for _ in range(2)
    ]
    caplog.set_level(logging.WARNING, logger="controlplane.workers.ingest_loop")
    try:
        for _ in range(600):
            info = await js.consumer_info(INBOUND_STREAM, SUBMIT_CONSUMER)
            if (info.num_pending, info.num_ack_pending) == (0, 0):
                break
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await asyncio.gather(*pullers)
    assert (info.num_pending, info.num_ack_pending, info.num_redelivered) == (0, 0, 0)
    keys = {f"k{i - 1}" if i % 5 == 4 else f"k{i}" for i in ids}
    assert _scalar(wiring, select(func.count()).select_from(WorkloadRow)) == len(keys) == 120
    assert _scalar(wiring, select(func.count(func.distinct(WorkloadRow.idempotency_key)))) == 120
    assert _scalar(wiring, select(func.count()).select_from(InboxRow)) == len(ids)
    assert _scalar(wiring, select(func.count()).where(OutboxRow.subject.like("%.queued"))) == 120
    assert not [r for r in caplog.records if "one by one" in r.getMessage()], "a batch failed (a deadlock?)"
