"""The durable pull consumers that feed inbound messages to the ingest service (one per kind of
message, see `topology.INGEST_CONSUMERS`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from adapters.nats.connection import INBOUND_ID_HEADER
from adapters.nats.dead_letters import publish_dead_letter
from adapters.nats.topology import INBOUND_STREAM, sent_subject
from controlplane.service.ingest import InboundMessage

log = logging.getLogger(__name__)


@dataclass
class Delivery:
    """One inbound message with its acknowledgement operations."""

    message: InboundMessage
    _msg: Msg

    @property
    def attempt(self) -> int:
        return int(self._msg.metadata.num_delivered or 1)

    @property
    def published_at(self) -> float | None:
        """Unix seconds at which JetStream stored the message (ingest lag)."""
        stamp = self._msg.metadata.timestamp
        return stamp.timestamp() if stamp is not None else None

    async def hold(self) -> None:
        await self._msg.in_progress()

    async def ack(self) -> None:
        # Double ack: the server confirms it, so a lost ack shows up here rather than as a
        # silent redelivery (which the inbox would absorb anyway).
        await self._msg.ack_sync(timeout=5.0)

    async def send_ack(self) -> None:
        await self._msg.ack()

    async def retry_later(self, delay: float) -> None:
        await self._msg.nak(delay=delay)


class JetStreamInbound:
    """One puller of one durable consumer; several pullers of the same consumer (in one process or
    many) are each handed different messages."""

    def __init__(self, js: JetStreamContext, prefix: str, consumer: str) -> None:
        self.js = js
        self.prefix = prefix
        self.consumer = consumer
        self._sub: JetStreamContext.PullSubscription | None = None

    async def fetch(self, batch: int = 64, timeout: float = 1.0) -> list[Delivery]:
        if self._sub is None:
            self._sub = await self.js.pull_subscribe_bind(durable=self.consumer, stream=INBOUND_STREAM)
        try:
            msgs = await self._sub.fetch(batch, timeout=timeout)
        except (TimeoutError, nats.errors.TimeoutError):
            return []
        deliveries = []
        for msg in msgs:
            # A bearer token a client still sends is dropped here: identity comes from the subject.
            headers = {k: v for k, v in (msg.headers or {}).items() if k.lower() != "authorization"}
            msg_id = (
                headers.get(INBOUND_ID_HEADER)
                or headers.get("Nats-Msg-Id")
                or f"{INBOUND_STREAM}:{msg.metadata.sequence.stream}"
            )
            subject = sent_subject(self.prefix, msg.subject)
            deliveries.append(Delivery(InboundMessage(subject, msg.data, headers, msg_id), msg))
        return deliveries

    async def confirm(self) -> None:
        """One round trip (PING, PONG): the server has read every ack sent before it. A confirmed
        ack per message costs a request each, about half the consumer's own work on a batch of
        submits; a dead connection still shows here, and an ack lost past the server's front door
        costs a redelivery the inbox absorbs."""
        await self.js._nc.flush(timeout=5)

    async def dead_letter(self, message: InboundMessage, reason: str) -> None:
        await publish_dead_letter(self.js, self.prefix, message.subject, message.data, message.msg_id, reason)

    def reset(self) -> None:
        """Forget the subscription; the next fetch binds again (after a server restart)."""
        self._sub = None
