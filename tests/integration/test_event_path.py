"""The event path against a real nats-server and a real database: outbox, inbox, DLQ, rejections."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

import nats
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from adapters.nats import secrets as nats_secrets
from adapters.nats.connection import JetStreamPublisher
from adapters.nats.inbound import JetStreamInbound
from adapters.nats.server import NatsServerProcess
from adapters.nats.topology import CLUSTER_CONSUMER, DLQ_STREAM, SUBMIT_CONSUMER, ensure_topology
from adapters.sql.tables import InboxRow, OutboxRow, WorkloadRow
from controlplane.bootstrap import Wiring, utc_now
from controlplane.service import ingest
from controlplane.service.ports import UnitOfWork
from controlplane.service.relay import housekeeping, relay_once
from controlplane.workers.ingest_loop import handle_delivery
from controlplane.workers.relay_loop import relay_loop
from tests.gateway import inbound_gateway
from tests.integration.fleet import Tenant, gang


@pytest.fixture
async def js(secure_nats: NatsServerProcess, wiring: Wiring) -> AsyncIterator[JetStreamContext]:
    """The control plane's own connection to a nats-server with authentication."""
    secrets = nats_secrets.load(secure_nats.secrets_file)  # type: ignore[attr-defined]
    nc: Client = await nats.connect(secure_nats.url, user=secrets.control_user, password=secrets.control_password)
    context = nc.jetstream()
    # Streams are named per installation; each test gets its own subject prefix, so recreate them.
    for name in ("GPUFLEET_IN", "GPUFLEET_EVENTS", "GPUFLEET_DLQ"):
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await context.delete_stream(name)
    await ensure_topology(context, wiring.settings.subject_prefix)
    async with inbound_gateway(nc, wiring.settings.subject_prefix):  # senders' messages reach the stream through it
        yield context
    await nc.close()


def _count(wiring: Wiring, row: type[Any]) -> int:
    with wiring.uow() as uow:
        return int(uow.session.query(row).count())  # type: ignore[attr-defined]


async def _drain(inbound: JetStreamInbound, wiring: Wiring, want: int) -> list[ingest.Outcome | None]:
    outcomes: list[ingest.Outcome | None] = []
    for _ in range(50):
        for delivery in await inbound.fetch(timeout=0.2):
            outcomes.append(
                await handle_delivery(inbound, delivery, wiring.uow, wiring.settings.subject_prefix, utc_now)
            )
        if len(outcomes) >= want:
            break
    return outcomes


async def test_submit_over_nats_creates_the_workload_and_acks_after_commit(
    js: JetStreamContext, wiring: Wiring, tenant: Tenant
) -> None:
    prefix = wiring.settings.subject_prefix
    body = json.dumps(gang("from-nats", tenant.queue)).encode()
    await js.publish(
        f"{prefix}.submit.{tenant.team}.{tenant.queue}", body, headers={**tenant.headers, "Nats-Msg-Id": "req-1"}
    )
    inbound = JetStreamInbound(js, prefix, SUBMIT_CONSUMER)
    assert await _drain(inbound, wiring, 1) == [ingest.Outcome.APPLIED]
    with wiring.uow() as uow:
        rows = uow.session.query(WorkloadRow).all()  # type: ignore[attr-defined]
        assert [(r.name, r.state, r.idempotency_key) for r in rows] == [("from-nats", "queued", "req-1")]
    info = await js.consumer_info("GPUFLEET_IN", SUBMIT_CONSUMER)
    assert info.num_ack_pending == 0
    assert info.num_pending == 0


async def test_redelivered_message_is_a_no_op(wiring: Wiring, tenant: Tenant) -> None:
    prefix = wiring.settings.subject_prefix
    message = ingest.InboundMessage(
        f"{prefix}.submit.{tenant.team}.{tenant.queue}",
        json.dumps(gang("once", tenant.queue)).encode(),
        tenant.headers,
        "m-7",
    )
    first = ingest.handle(wiring.uow(), message, prefix, utc_now())
    again = ingest.handle(wiring.uow(), message, prefix, utc_now())
    assert first.outcome is ingest.Outcome.APPLIED
    assert again.outcome is ingest.Outcome.DUPLICATE
    assert _count(wiring, WorkloadRow) == 1
    assert _count(wiring, InboxRow) == 1


async def test_malformed_message_goes_to_dead_letter_and_consumer_continues(
    js: JetStreamContext, wiring: Wiring, tenant: Tenant
) -> None:
    prefix = wiring.settings.subject_prefix
    await js.publish(f"{prefix}.submit.{tenant.team}.{tenant.queue}", b"{not json", headers={"Nats-Msg-Id": "bad-1"})
    await js.publish(f"{prefix}.cluster.nowhere.pods", b'{"run_id": 5}', headers={"Nats-Msg-Id": "bad-2"})
    good = json.dumps(gang("after-poison", tenant.queue)).encode()
    await js.publish(
        f"{prefix}.submit.{tenant.team}.{tenant.queue}", good, headers={**tenant.headers, "Nats-Msg-Id": "ok-1"}
    )
    # Submits and cluster reports have consumers of their own; each comes to what it would alone.
    submits = await _drain(JetStreamInbound(js, prefix, SUBMIT_CONSUMER), wiring, 2)
    reports = await _drain(JetStreamInbound(js, prefix, CLUSTER_CONSUMER), wiring, 1)
    assert submits == [ingest.Outcome.MALFORMED, ingest.Outcome.APPLIED]
    assert reports == [ingest.Outcome.MALFORMED]
    dlq = await js.pull_subscribe(f"{prefix}.dlq.>", durable="dlq-reader", stream=DLQ_STREAM)
    dead = await dlq.fetch(2, timeout=2)
    assert [m.subject for m in dead] == [
        f"{prefix}.dlq.submit.{tenant.team}.{tenant.queue}",
        f"{prefix}.dlq.cluster.nowhere.pods",
    ]
    assert dead[0].data == b"{not json"
    assert dead[0].headers is not None
    assert "not JSON" in dead[0].headers["Gpufleet-Dlq-Reason"]
    assert dead[1].headers is not None
    assert "run_id" in dead[1].headers["Gpufleet-Dlq-Reason"]
    assert _count(wiring, WorkloadRow) == 1


async def test_rejected_submission_produces_a_rejection_event(
    js: JetStreamContext, wiring: Wiring, tenant: Tenant
) -> None:
    prefix = wiring.settings.subject_prefix
    events = await js.pull_subscribe(f"{prefix}.events.workload.*.*.rejected", durable="rej", stream="GPUFLEET_EVENTS")
    too_big = json.dumps(gang("huge", tenant.queue, replicas=40)).encode()
    cases = [
        (too_big, tenant.team, "no cluster in the fleet could ever hold"),
        (json.dumps(gang("anon", tenant.queue)).encode(), "no-such-team", "no team 'no-such-team'"),
        (json.dumps({"name": "x", "queue": tenant.queue, "pod_sets": []}).encode(), tenant.team, "pod_sets"),
    ]
    for i, (body, team, _) in enumerate(cases):
        await js.publish(f"{prefix}.submit.{team}.{tenant.queue}", body, headers={"Gpufleet-Msg-Id": f"r-{i}"})
    inbound = JetStreamInbound(js, prefix, SUBMIT_CONSUMER)
    assert await _drain(inbound, wiring, 3) == [ingest.Outcome.REJECTED] * 3
    assert await relay_once(wiring.uow, JetStreamPublisher(js), utc_now) == 3
    received = await events.fetch(3, timeout=2)
    reasons = [json.loads(m.data)["data"]["reason"] for m in received]
    for (_, _, expected), reason in zip(cases, reasons, strict=True):
        assert expected in reason
    assert {json.loads(m.data)["data"]["request_id"] for m in received} == {"r-0", "r-1", "r-2"}
    assert _count(wiring, WorkloadRow) == 0


async def test_relay_publishes_with_outbox_id_as_msg_id_exactly_once(
    js: JetStreamContext, wiring: Wiring, tenant: Tenant
) -> None:
    prefix = wiring.settings.subject_prefix
    sub = await js.pull_subscribe(f"{prefix}.events.>", durable="all-events", stream="GPUFLEET_EVENTS")
    message = ingest.InboundMessage(
        f"{prefix}.submit.{tenant.team}.{tenant.queue}",
        json.dumps(gang("evented", tenant.queue)).encode(),
        tenant.headers,
        "e-1",
    )
    ingest.handle(wiring.uow(), message, prefix, utc_now())
    publisher = JetStreamPublisher(js)
    assert await relay_once(wiring.uow, publisher, utc_now) == 1
    assert await relay_once(wiring.uow, publisher, utc_now) == 0
    [msg] = await sub.fetch(1, timeout=2)
    envelope = json.loads(msg.data)
    assert msg.subject == f"{prefix}.events.workload.{tenant.team}.{tenant.queue}.queued"
    assert msg.headers is not None
    assert msg.headers["Nats-Msg-Id"] == envelope["id"]
    assert envelope["type"] == "workload.queued"
    assert envelope["version"] == 1
    assert envelope["data"]["name"] == "evented"
    with wiring.uow() as uow:
        [row] = uow.session.query(OutboxRow).all()  # type: ignore[attr-defined]
        assert row.id == envelope["id"]
        assert row.published_at is not None


class FlakyPublisher:
    def __init__(self, inner: JetStreamPublisher, failures: int) -> None:
        self.inner = inner
        self.failures = failures
        self.attempted: list[str] = []

    async def publish(self, subject: str, payload: bytes, msg_id: str) -> None:
        self.attempted.append(msg_id)
        if self.failures > 0:
            self.failures -= 1
            raise TimeoutError("no PubAck")
        await self.inner.publish(subject, payload, msg_id)


async def test_relay_failure_keeps_the_row_and_retries_with_the_same_msg_id(
    js: JetStreamContext, wiring: Wiring, tenant: Tenant
) -> None:
    prefix = wiring.settings.subject_prefix
    for i in range(2):
        message = ingest.InboundMessage(
            f"{prefix}.submit.{tenant.team}.{tenant.queue}",
            json.dumps(gang(f"w{i}", tenant.queue)).encode(),
            tenant.headers,
            f"f{i}",
        )
        ingest.handle(wiring.uow(), message, prefix, utc_now())
    flaky = FlakyPublisher(JetStreamPublisher(js), failures=1)
    assert await relay_once(wiring.uow, flaky, utc_now) == 0
    with wiring.uow() as uow:
        rows = uow.session.query(OutboxRow).order_by(OutboxRow.seq).all()  # type: ignore[attr-defined]
        assert [r.published_at for r in rows] == [None, None]
        assert rows[0].attempts == 1
        assert "no PubAck" in rows[0].last_error
        ids = [r.id for r in rows]
    assert await relay_once(wiring.uow, flaky, utc_now) == 2
    assert flaky.attempted == [ids[0], ids[0], ids[1]]
    info = await js.stream_info("GPUFLEET_EVENTS")
    assert info.state.messages == 2


class FailingFirst:
    """A unit-of-work factory whose first `n` transactions fail, like a database outage."""

    def __init__(self, inner: Callable[[], UnitOfWork], n: int) -> None:
        self.inner = inner
        self.n = n

    def __call__(self) -> UnitOfWork:
        if self.n > 0:
            self.n -= 1
            raise ConnectionError("database unavailable")
        return self.inner()


async def test_message_is_not_acked_when_the_database_fails_and_is_redelivered(
    js: JetStreamContext, wiring: Wiring, tenant: Tenant
) -> None:
    prefix = wiring.settings.subject_prefix
    body = json.dumps(gang("survives-outage", tenant.queue)).encode()
    await js.publish(
        f"{prefix}.submit.{tenant.team}.{tenant.queue}", body, headers={**tenant.headers, "Nats-Msg-Id": "o-1"}
    )
    inbound = JetStreamInbound(js, prefix, SUBMIT_CONSUMER)
    flaky = FailingFirst(wiring.uow, 1)
    [delivery] = await inbound.fetch(timeout=2)
    assert await handle_delivery(inbound, delivery, flaky, prefix, utc_now) is None
    assert _count(wiring, WorkloadRow) == 0
    redelivered: list[ingest.Outcome | None] = []
    for _ in range(30):
        for d in await inbound.fetch(timeout=0.5):
            assert d.message.msg_id == "o-1"
            redelivered.append(await handle_delivery(inbound, d, flaky, prefix, utc_now))
        if redelivered:
            break
        await asyncio.sleep(0.2)
    assert redelivered == [ingest.Outcome.APPLIED]
    assert _count(wiring, WorkloadRow) == 1


async def test_only_one_relay_publishes_at_a_time(js: JetStreamContext, wiring: Wiring, tenant: Tenant) -> None:
    prefix = wiring.settings.subject_prefix
    message = ingest.InboundMessage(
        f"{prefix}.submit.{tenant.team}.{tenant.queue}",
        json.dumps(gang("one", tenant.queue)).encode(),
        tenant.headers,
        "l-1",
    )
    ingest.handle(wiring.uow(), message, prefix, utc_now())
    recorders = [FlakyPublisher(JetStreamPublisher(js), failures=0) for _ in range(2)]
    stop = asyncio.Event()
    relays = [asyncio.create_task(relay_loop(wiring.uow, r, utc_now, stop, 0.05)) for r in recorders]
    for _ in range(100):
        if any(r.attempted for r in recorders):
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)
    stop.set()
    await asyncio.gather(*relays)
    assert sorted(len(r.attempted) for r in recorders) == [0, 1]


def test_housekeeping_prunes_published_events_and_old_inbox_rows(wiring: Wiring, tenant: Tenant) -> None:
    prefix = wiring.settings.subject_prefix
    long_ago = utc_now() - timedelta(days=9)
    for i in range(2):
        message = ingest.InboundMessage(
            f"{prefix}.submit.{tenant.team}.{tenant.queue}",
            json.dumps(gang(f"h{i}", tenant.queue)).encode(),
            tenant.headers,
            f"h{i}",
        )
        ingest.handle(wiring.uow(), message, prefix, long_ago if i == 0 else utc_now())
    with wiring.uow() as uow:
        first = uow.outbox.unpublished(1)[0][0]
        uow.outbox.mark_published([first], long_ago)
        uow.commit()
    assert housekeeping(wiring.uow, utc_now()) == (1, 1)
    assert _count(wiring, OutboxRow) == 1  # the unpublished event is never pruned
    assert _count(wiring, InboxRow) == 1
