"""Hostile messages against the real ingest loop and a real nats-server: none of them stops it.

The issue's attack: 1,000 deeply nested bodies raised `RecursionError` out of the decoder, were
redelivered forever and filled `max_ack_pending`, so submits and pod reports stopped. Here 1,200
poison messages of six kinds are interleaved with real submits; every submit lands, every poison
message ends in the dead-letter stream with its reason, and the consumer has nothing left pending.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import nats
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, RetentionPolicy, StreamConfig

from adapters.nats.inbound import JetStreamInbound
from adapters.nats.server import NatsServerProcess
from adapters.nats.topology import (
    DLQ_STREAM,
    INBOUND_STREAM,
    RETIRED_INGEST_CONSUMER,
    SUBMIT_CONSUMER,
    ensure_topology,
    retire_ingest_consumer,
)
from adapters.sql.tables import InboxRow, WorkloadRow
from controlplane.bootstrap import Wiring, utc_now
from controlplane.service import ingest
from controlplane.service.errors import StoreUnavailable
from controlplane.service.ports import UnitOfWork
from controlplane.workers.ingest_loop import ingest_loop
from tests.gateway import inbound_gateway
from tests.integration.fleet import Tenant, gang


@pytest.fixture
async def js(running_nats: NatsServerProcess, wiring: Wiring) -> AsyncIterator[JetStreamContext]:
    nc: Client = await nats.connect(running_nats.url)
    context = nc.jetstream()
    for name in (INBOUND_STREAM, "GPUFLEET_EVENTS", DLQ_STREAM, "GPUFLEET_TELEMETRY"):
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await context.delete_stream(name)
    await ensure_topology(context, wiring.settings.subject_prefix)
    async with inbound_gateway(nc, wiring.settings.subject_prefix):  # senders' messages reach the stream through it
        yield context
    await nc.close()


def _count(wiring: Wiring, row: type[Any]) -> int:
    with wiring.uow() as uow:
        return int(uow.session.query(row).count())  # type: ignore[attr-defined]


def _poison(kind: int, i: int, queue: str) -> bytes:
    """Six ways to hurt a JSON consumer; each is refused by the shared decoder or the model."""
    if kind == 0:
        return b"[" * 5_000 + b"]" * 5_000  # RecursionError in a plain json.loads
    if kind == 1:
        return b'{"a":' * 3_000 + b"1" + b"}" * 3_000
    if kind == 2:
        return b'{"name": "x\xff\xfe", "queue": "q"}'  # not UTF-8
    if kind == 3:
        return json.dumps(gang(f"inf-{i}", queue, duration_seconds=float("inf"))).encode()  # Infinity
    if kind == 4:
        return b'{"name": "n", "pod_sets": [{"replicas": ' + b"9" * 5000 + b"}]}"  # int past the digit limit
    return b'{"name": "a", "name": "b"}'  # duplicate keys


async def _run_until(
    wiring: Wiring, js: JetStreamContext, done: Callable[[], bool], limit: float, uow_factory: Any = None
) -> float:
    prefix = wiring.settings.subject_prefix
    stop = asyncio.Event()
    started = time.monotonic()
    task = asyncio.create_task(
        ingest_loop(JetStreamInbound(js, prefix, SUBMIT_CONSUMER), uow_factory or wiring.uow, prefix, utc_now, stop)
    )
    try:
        while not done() and time.monotonic() - started < limit:
            await asyncio.sleep(0.2)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
    return time.monotonic() - started


async def _dead_letters(js: JetStreamContext, prefix: str) -> list[Any]:
    sub = await js.pull_subscribe(f"{prefix}.dlq.>", durable="poison-reader", stream=DLQ_STREAM)
    dead: list[Any] = []
    while True:
        try:
            batch = await sub.fetch(500, timeout=1)
        except (TimeoutError, nats.errors.TimeoutError):
            return dead
        for msg in batch:
            await msg.ack()
        dead.extend(batch)


async def test_a_poison_burst_is_dead_lettered_and_submits_keep_flowing(
    js: JetStreamContext, wiring: Wiring, tenant: Tenant
) -> None:
    """End-to-end (~15 s): worth it, it is the attack of the issue at its scale."""
    prefix = wiring.settings.subject_prefix
    subject = f"{prefix}.submit.{tenant.team}.{tenant.queue}"
    poison, good = 1200, 40
    for i in range(poison):
        headers = {"Gpufleet-Msg-Id": f"poison-{i}"}
        await js.publish(subject, _poison(i % 6, i, tenant.queue), headers=headers)
        if i % 30 == 29:  # the last message of the burst is a good one
            body = json.dumps(gang(f"good-{i // 30}", tenant.queue, replicas=1, gpus=1)).encode()
            await js.publish(subject, body, headers={"Gpufleet-Msg-Id": f"good-{i}"})
    elapsed = await _run_until(wiring, js, lambda: _count(wiring, WorkloadRow) >= good, limit=120)
    assert _count(wiring, WorkloadRow) == good, (
        f"only {_count(wiring, WorkloadRow)} of {good} submits after {elapsed:.0f}s"
    )
    dead = await _dead_letters(js, prefix)
    reasons = [m.headers["Gpufleet-Dlq-Reason"] for m in dead]
    assert len(dead) == poison
    assert sum("no NaN or infinities" in r for r in reasons) == poison // 6
    assert sum("levels deep" in r for r in reasons) == 2 * poison // 6
    assert sum("UTF-8" in r for r in reasons) == poison // 6
    assert sum("digits" in r for r in reasons) == poison // 6
    assert sum("appears twice" in r for r in reasons) == poison // 6
    info = await js.consumer_info(INBOUND_STREAM, SUBMIT_CONSUMER)
    assert (info.num_pending, info.num_ack_pending, info.num_redelivered) == (0, 0, 0)
    # Interest retention: acknowledged messages do not stay in the inbound stream.
    assert (await js.stream_info(INBOUND_STREAM)).state.messages == 0


class AlwaysFailsOn:
    """A unit-of-work factory whose transactions fail for one message, like a bug a payload hits."""

    def __init__(self, wiring: Wiring) -> None:
        self.wiring = wiring

    def __call__(self) -> UnitOfWork:
        return _Failing(self.wiring.uow())


class _Failing:
    def __init__(self, inner: UnitOfWork) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __enter__(self) -> Any:
        self.inner.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.inner.__exit__(*exc)

    @property
    def inbox(self) -> Any:
        inbox = self.inner.inbox

        class Inbox:
            def first_time(self, consumer: str, msg_id: str, now: Any) -> bool:
                if msg_id.endswith("/cursed"):  # inbox keys are <sender>/<message id>
                    raise KeyError("a bug this payload reaches")
                return bool(inbox.first_time(consumer, msg_id, now))

        return Inbox()


async def test_a_message_that_keeps_failing_is_dead_lettered_after_bounded_deliveries(
    js: JetStreamContext, wiring: Wiring, tenant: Tenant
) -> None:
    prefix = wiring.settings.subject_prefix
    subject = f"{prefix}.submit.{tenant.team}.{tenant.queue}"
    cursed = json.dumps(gang("cursed", tenant.queue, replicas=1, gpus=1)).encode()
    await js.publish(subject, cursed, headers={"Gpufleet-Msg-Id": "cursed"})
    after = json.dumps(gang("after", tenant.queue, replicas=1, gpus=1)).encode()
    await js.publish(subject, after, headers={"Gpufleet-Msg-Id": "after"})
    # Naks come back after 2 s each: five deliveries take about 8 s.
    dead: list[Any] = []

    def finished() -> bool:
        return _count(wiring, WorkloadRow) == 1 and bool(dead)

    async def watch() -> None:
        sub = await js.pull_subscribe(f"{prefix}.dlq.>", durable="cursed-reader", stream=DLQ_STREAM)
        while not dead:
            with contextlib.suppress(TimeoutError, nats.errors.TimeoutError):
                dead.extend(await sub.fetch(1, timeout=0.5))

    watcher = asyncio.create_task(watch())
    await _run_until(wiring, js, finished, limit=40, uow_factory=AlwaysFailsOn(wiring))
    watcher.cancel()
    assert _count(wiring, WorkloadRow) == 1  # the message behind it was applied long before
    assert len(dead) == 1
    reason = dead[0].headers["Gpufleet-Dlq-Reason"]
    assert f"failed on {ingest.MAX_DELIVERIES} deliveries" in reason
    assert "KeyError" in reason
    info = await js.consumer_info(INBOUND_STREAM, SUBMIT_CONSUMER)
    assert (info.num_pending, info.num_ack_pending) == (0, 0)
    assert info.config.max_deliver == ingest.MAX_DELIVERIES + 5
    assert _count(wiring, InboxRow) == 1


async def test_a_database_outage_holds_messages_without_spending_deliveries(
    js: JetStreamContext, wiring: Wiring, tenant: Tenant
) -> None:
    class Outage:
        """The database is down for the first 3 s."""

        def __init__(self) -> None:
            self.until = time.monotonic() + 3.0

        def __call__(self) -> UnitOfWork:
            if time.monotonic() < self.until:
                raise StoreUnavailable("the database is unavailable")
            return wiring.uow()

    prefix = wiring.settings.subject_prefix
    body = json.dumps(gang("through-outage", tenant.queue, replicas=1, gpus=1)).encode()
    await js.publish(f"{prefix}.submit.{tenant.team}.{tenant.queue}", body, headers={"Gpufleet-Msg-Id": "o-1"})
    await _run_until(wiring, js, lambda: _count(wiring, WorkloadRow) == 1, limit=30, uow_factory=Outage())
    assert _count(wiring, WorkloadRow) == 1
    info = await js.consumer_info(INBOUND_STREAM, SUBMIT_CONSUMER)
    assert info.num_redelivered == 0  # held, retried in place: no delivery was spent


async def test_an_installation_with_the_old_limits_stream_moves_to_interest_in_place(
    running_nats: NatsServerProcess, wiring: Wiring
) -> None:
    prefix = wiring.settings.subject_prefix
    nc: Client = await nats.connect(running_nats.url)
    js = nc.jetstream()
    for name in (INBOUND_STREAM, "GPUFLEET_EVENTS", DLQ_STREAM, "GPUFLEET_TELEMETRY"):
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await js.delete_stream(name)
    subjects = [f"{prefix}.submit.>", f"{prefix}.cancel", f"{prefix}.cluster.>"]
    old = StreamConfig(name=INBOUND_STREAM, subjects=subjects, retention=RetentionPolicy.LIMITS)
    await js.add_stream(old)
    await js.add_consumer(INBOUND_STREAM, ConsumerConfig(durable_name=RETIRED_INGEST_CONSUMER, max_deliver=-1))
    await js.publish(f"{prefix}.cancel", b"{}")  # not yet consumed: must survive the change
    await ensure_topology(js, prefix)
    info = await js.stream_info(INBOUND_STREAM)
    consumer = await js.consumer_info(INBOUND_STREAM, SUBMIT_CONSUMER)
    assert (info.config.retention, info.state.messages) == (RetentionPolicy.INTEREST, 1)
    assert consumer.config.max_deliver == ingest.MAX_DELIVERIES + 5
    # The old unfiltered consumer still holds that message (on a senders' subject of before the
    # gateway, which no filtered consumer matches): it is kept for ingest to drain, then deleted.
    assert await retire_ingest_consumer(js) is True
    old_consumer = await js.pull_subscribe_bind(durable=RETIRED_INGEST_CONSUMER, stream=INBOUND_STREAM)
    [held] = await old_consumer.fetch(1, timeout=5)
    assert held.subject == f"{prefix}.cancel"
    await held.ack_sync()
    assert await retire_ingest_consumer(js) is False
    with pytest.raises(nats.js.errors.NotFoundError):
        await js.consumer_info(INBOUND_STREAM, RETIRED_INGEST_CONSUMER)
    assert (await js.stream_info(INBOUND_STREAM)).state.messages == 0
    await nc.close()
