"""How far behind gpufleet's durable consumers are, as the broker counts it (for metrics)."""

from __future__ import annotations

from nats.js import JetStreamContext

from adapters.nats.topology import INBOUND_STREAM, INGEST_CONSUMER, TELEMETRY_CONSUMER, TELEMETRY_STREAM

CONSUMERS = ((INBOUND_STREAM, INGEST_CONSUMER), (TELEMETRY_STREAM, TELEMETRY_CONSUMER))


async def consumer_backlogs(js: JetStreamContext) -> dict[str, tuple[int, int]]:
    """Consumer name -> (messages not delivered yet, delivered and not acked yet)."""
    backlogs: dict[str, tuple[int, int]] = {}
    for stream, durable in CONSUMERS:
        info = await js.consumer_info(stream, durable, timeout=5.0)
        backlogs[durable] = (int(info.num_pending or 0), int(info.num_ack_pending or 0))
    return backlogs
