"""Telemetry through a real nats-server with authentication (connected as the control plane) into
the database, on PostgreSQL and SQLite."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from typing import Any

import nats
import pytest
from nats.aio.client import Client

from adapters.dcgm.consumer import JetStreamTelemetrySource
from adapters.nats import secrets as nats_secrets
from adapters.nats.server import NatsServerProcess
from adapters.nats.topology import DLQ_STREAM, TELEMETRY_CONSUMER, TELEMETRY_STREAM, ensure_topology
from controlplane.bootstrap import Wiring, utc_now
from controlplane.service import telemetry
from controlplane.service.ports import UnitOfWork
from controlplane.service.telemetry import BatchResult, WindowQuery
from controlplane.service.telemetry_wire import GpuSample, encode_batch, telemetry_subject
from controlplane.workers.telemetry_loop import TelemetryDelivery, handle_telemetry, telemetry_loop
from tests.gateway import inbound_gateway
from tests.telemetry.known import register


@pytest.fixture(autouse=True)
def _known_clusters_and_runs(wiring: Wiring) -> None:
    """Ingest keeps only telemetry of registered clusters and of their own runs."""
    register(wiring, "east", "run-1")


@pytest.fixture
async def nc(secure_nats: NatsServerProcess, wiring: Wiring) -> AsyncIterator[Client]:
    secrets = nats_secrets.load(secure_nats.secrets_file)  # type: ignore[attr-defined]
    client = await nats.connect(secure_nats.url, user=secrets.control_user, password=secrets.control_password)
    js = client.jetstream()
    # Streams are named per installation; each test gets its own subject prefix, so recreate them.
    for name in ("GPUFLEET_IN", "GPUFLEET_EVENTS", DLQ_STREAM, TELEMETRY_STREAM):
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await js.delete_stream(name)
    await ensure_topology(js, wiring.settings.subject_prefix)
    async with inbound_gateway(client, wiring.settings.subject_prefix):  # agents' batches reach the stream through it
        yield client
    await client.close()


def _samples(run: str, t: float, busy: float) -> list[GpuSample]:
    return [
        GpuSample("east", "node-1", f"GPU-{g}", g, t, {"sm_active": busy, "fb_used_mib": 1000.0 * g}, run_id=run)
        for g in range(2)
    ]


def _stored(wiring: Wiring) -> list[telemetry.TelemetryWindow]:
    return telemetry.windows(wiring.uow(), WindowQuery())


async def _run_until(wiring: Wiring, nc: Client, done: int, uow_factory: object | None = None) -> list[BatchResult]:
    """Run the production loop until `done` messages were handled; return what each pass did."""
    results: list[BatchResult] = []
    handled = 0
    stop = asyncio.Event()

    def observe(deliveries: Sequence[TelemetryDelivery], result: BatchResult) -> None:
        nonlocal handled
        results.append(result)
        handled += len(deliveries)
        if handled >= done:
            stop.set()

    prefix = wiring.settings.subject_prefix
    source = JetStreamTelemetrySource(nc, prefix)
    factory = uow_factory or wiring.uow
    loop = asyncio.create_task(telemetry_loop(source, factory, prefix, utc_now, stop, observer=observe))  # type: ignore[arg-type]
    try:
        await asyncio.wait_for(stop.wait(), timeout=20)
    finally:
        stop.set()
        await loop
    return results


async def test_published_batches_become_windows_and_are_all_acked(wiring: Wiring, nc: Client) -> None:
    prefix = wiring.settings.subject_prefix
    js = nc.jetstream()
    now = datetime.now(UTC).timestamp()
    subject = telemetry_subject(prefix, "east")
    ids = ("a", "b", "b")  # the second "b" is a retry: the inbox (per cluster) applies it once
    for msg_id, (ago, busy) in zip(ids, ((20, 0.25), (10, 0.75), (10, 0.75)), strict=True):
        body = encode_batch("east", _samples("run-1", now - ago, busy))
        await js.publish(subject, body, headers={"Gpufleet-Msg-Id": msg_id})
    results = await _run_until(wiring, nc, 3)
    assert sum(r.samples for r in results) == 4
    windows = _stored(wiring)
    assert {w.gpu_key for w in windows} == {"east/node-1/GPU-0", "east/node-1/GPU-1"}
    assert sum(w.samples for w in windows) == 4
    by_gpu = {w.gpu_key: w for w in windows if w.samples == 2}
    for w in by_gpu.values():
        assert w.activity_mean == pytest.approx(0.5)
    info = await js.consumer_info(TELEMETRY_STREAM, TELEMETRY_CONSUMER)
    assert (info.num_ack_pending, info.num_pending) == (0, 0)


async def test_malformed_batch_goes_to_the_dead_letter_stream_and_the_consumer_goes_on(
    wiring: Wiring, nc: Client
) -> None:
    prefix = wiring.settings.subject_prefix
    js = nc.jetstream()
    now = datetime.now(UTC).timestamp()
    subject = telemetry_subject(prefix, "east")
    await js.publish(subject, b"{not json", headers={"Nats-Msg-Id": "poison-1"})
    # A batch claiming another cluster than its subject: an agent writing outside its permission.
    west = [dataclasses.replace(x, cluster="west") for x in _samples("run-9", now, 0.5)]
    await js.publish(subject, encode_batch("west", west), headers={"Nats-Msg-Id": "poison-2"})
    await js.publish(subject, encode_batch("east", _samples("run-1", now, 0.5)), headers={"Nats-Msg-Id": "good-1"})
    results = await _run_until(wiring, nc, 3)
    outcomes = [o for r in results for o, _ in r.outcomes]
    assert outcomes.count(telemetry.Outcome.MALFORMED) == 2
    assert outcomes.count(telemetry.Outcome.APPLIED) == 1
    assert sum(w.samples for w in _stored(wiring)) == 2
    dlq = await js.pull_subscribe(f"{prefix}.dlq.>", durable="tele-dlq", stream=DLQ_STREAM)
    dead = await dlq.fetch(2, timeout=2)
    assert {m.subject for m in dead} == {f"{prefix}.dlq.telemetry.east.dcgm"}
    reasons = {m.data: (m.headers or {}).get("Gpufleet-Dlq-Reason", "") for m in dead}
    assert "not JSON" in reasons[b"{not json"]
    assert any("sent for 'east'" in r for r in reasons.values())
    info = await js.consumer_info(TELEMETRY_STREAM, TELEMETRY_CONSUMER)
    assert (info.num_ack_pending, info.num_pending) == (0, 0)


class FailingFirst:
    """A unit-of-work factory whose first `n` transactions fail, like a database outage."""

    def __init__(self, wiring: Wiring, n: int) -> None:
        self.wiring = wiring
        self.n = n

    def __call__(self) -> UnitOfWork:
        if self.n > 0:
            self.n -= 1
            raise ConnectionError("database unavailable")
        return self.wiring.uow()


async def test_a_failed_commit_is_not_acked_and_the_redelivery_applies_once(wiring: Wiring, nc: Client) -> None:
    prefix = wiring.settings.subject_prefix
    js = nc.jetstream()
    now = datetime.now(UTC).timestamp()
    subject = telemetry_subject(prefix, "east")
    await js.publish(subject, encode_batch("east", _samples("run-1", now, 0.5)), headers={"Nats-Msg-Id": "o-1"})
    source = JetStreamTelemetrySource(nc, prefix)
    first = await source.fetch(10, 2.0)
    assert len(first) == 1
    assert await handle_telemetry(source, first, FailingFirst(wiring, 1), prefix, utc_now) is None
    assert _stored(wiring) == []
    redelivered = []
    for _ in range(30):
        redelivered = await source.fetch(10, 0.5)
        if redelivered:
            break
    assert [d.message.msg_id for d in redelivered] == ["o-1"]
    result = await handle_telemetry(source, redelivered, wiring.uow, prefix, utc_now)
    assert result is not None
    assert result.outcomes[0][0] is telemetry.Outcome.APPLIED
    # Handled again (a late redelivery after a lost ack): the inbox makes it a no-op.
    again = telemetry.handle_batch(wiring.uow(), [redelivered[0].message], prefix, utc_now())
    assert again.outcomes[0][0] is telemetry.Outcome.DUPLICATE
    assert sum(w.samples for w in _stored(wiring)) == 2


class PoisonedWindows:
    """A unit-of-work factory whose transaction fails whenever it holds samples of `poison-node`:
    a payload that reaches a bug past the decoder."""

    def __init__(self, wiring: Wiring) -> None:
        self.wiring = wiring

    def __call__(self) -> UnitOfWork:
        return _Guarded(self.wiring.uow())  # type: ignore[return-value]


class _Guarded:
    def __init__(self, inner: UnitOfWork) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __enter__(self) -> _Guarded:
        self.inner.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.inner.__exit__(*exc)

    @property
    def telemetry(self) -> Any:
        repo = self.inner.telemetry

        class Repo:
            def __getattr__(self, name: str) -> Any:
                return getattr(repo, name)

            def merge_windows(self, windows: Sequence[telemetry.TelemetryWindow], now: datetime) -> None:
                if any(w.node == "poison-node" for w in windows):
                    raise RuntimeError("a bug this batch reaches")
                repo.merge_windows(windows, now)

        return Repo()


async def test_a_batch_that_keeps_failing_is_isolated_and_dead_lettered(wiring: Wiring, nc: Client) -> None:
    prefix = wiring.settings.subject_prefix
    js = nc.jetstream()
    now = datetime.now(UTC).timestamp()
    subject = telemetry_subject(prefix, "east")
    poison = [dataclasses.replace(s, node="poison-node") for s in _samples("run-1", now, 0.5)]
    await js.publish(subject, encode_batch("east", _samples("run-1", now - 30, 0.5)), headers={"Nats-Msg-Id": "g1"})
    await js.publish(subject, encode_batch("east", poison), headers={"Nats-Msg-Id": "p1"})
    await js.publish(subject, encode_batch("east", _samples("run-1", now - 20, 0.5)), headers={"Nats-Msg-Id": "g2"})
    stop = asyncio.Event()
    source = JetStreamTelemetrySource(nc, prefix)
    loop = asyncio.create_task(telemetry_loop(source, PoisonedWindows(wiring), prefix, utc_now, stop))
    dlq = await js.pull_subscribe(f"{prefix}.dlq.>", durable="telemetry-poison", stream=DLQ_STREAM)
    dead: list[Any] = []
    try:
        for _ in range(60):
            with contextlib.suppress(TimeoutError, nats.errors.TimeoutError):
                dead.extend(await dlq.fetch(1, timeout=0.5))
            if dead:
                break
    finally:
        stop.set()
        await loop
    # The good batches landed as soon as the mixed batch was tried one by one (second delivery).
    assert sum(w.samples for w in _stored(wiring)) == 4
    assert len(dead) == 1
    assert dead[0].headers["Gpufleet-Original-Subject"] == subject
    assert f"failed on {telemetry.MAX_DELIVERIES} deliveries" in dead[0].headers["Gpufleet-Dlq-Reason"]
    info = await js.consumer_info(TELEMETRY_STREAM, "telemetry")
    assert (info.num_pending, info.num_ack_pending) == (0, 0)
