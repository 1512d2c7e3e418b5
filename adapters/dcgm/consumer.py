"""The durable pull consumer of telemetry batches: big fetches, fire-and-forget acks after commit."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from adapters.nats.connection import INBOUND_ID_HEADER
from adapters.nats.dead_letters import publish_dead_letter
from adapters.nats.topology import TELEMETRY_CONSUMER, TELEMETRY_STREAM, sent_subject
from controlplane.service.telemetry import BatchMessage

log = logging.getLogger(__name__)


@dataclass(slots=True)
class TelemetryDelivery:
    message: BatchMessage
    published_at: float | None  # unix seconds at which JetStream stored it
    msg: Msg
    attempt: int = 1  # deliveries so far, this one included


class JetStreamTelemetrySource:
    def __init__(self, nc: Client, prefix: str) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.prefix = prefix
        self._sub: JetStreamContext.PullSubscription | None = None

    async def fetch(self, batch: int, timeout: float) -> list[TelemetryDelivery]:
        if self._sub is None:
            self._sub = await self.js.pull_subscribe_bind(durable=TELEMETRY_CONSUMER, stream=TELEMETRY_STREAM)
        try:
            msgs = await self._sub.fetch(batch, timeout=timeout)
        except (TimeoutError, nats.errors.TimeoutError):
            return []
        out: list[TelemetryDelivery] = []
        for msg in msgs:
            meta = msg.metadata
            headers = msg.headers or {}
            msg_id = (
                headers.get(INBOUND_ID_HEADER)
                or headers.get("Nats-Msg-Id")
                or f"{TELEMETRY_STREAM}:{meta.sequence.stream}"
            )
            stamp = meta.timestamp.timestamp() if meta.timestamp is not None else None
            attempt = int(meta.num_delivered or 1)
            subject = sent_subject(self.prefix, msg.subject)
            out.append(TelemetryDelivery(BatchMessage(subject, msg.data, msg_id), stamp, msg, attempt))
        return out

    async def ack(self, deliveries: Sequence[TelemetryDelivery]) -> None:
        # Plain acks, then one flush: a double ack per message would cost a round trip each, and a
        # lost ack only means a redelivery that the inbox turns into a no-op.
        for delivery in deliveries:
            await delivery.msg.ack()
        await self.nc.flush(timeout=10)

    async def retry_later(self, deliveries: Sequence[TelemetryDelivery], delay: float) -> None:
        for delivery in deliveries:
            with contextlib.suppress(nats.errors.Error):
                await delivery.msg.nak(delay=delay)

    async def hold(self, deliveries: Sequence[TelemetryDelivery]) -> None:
        for delivery in deliveries:
            await delivery.msg.in_progress()
        await self.nc.flush(timeout=10)

    async def dead_letter(self, message: BatchMessage, reason: str) -> None:
        await publish_dead_letter(self.js, self.prefix, message.subject, message.data, message.msg_id, reason)

    def reset(self) -> None:
        """Forget the subscription; the next fetch binds again (after a server restart)."""
        self._sub = None
