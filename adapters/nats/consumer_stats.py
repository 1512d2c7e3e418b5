"""How far behind gpufleet's durable consumers are, as the broker counts it (for metrics)."""

from __future__ import annotations

from nats.js import JetStreamContext

from adapters.nats.topology import INBOUND_STREAM, INGEST_CONSUMERS, TELEMETRY_CONSUMER, TELEMETRY_STREAM
from controlplane.service import ingest, telemetry

# Metric label -> the durable consumers it counts. The ingest consumers (one per kind of message)
# are counted together under the label their messages are counted under once applied
# (`gpufleet_ingest_messages_total{consumer="ingest"}`), which the alerts join on.
CONSUMERS = {
    ingest.CONSUMER: tuple((INBOUND_STREAM, durable) for durable in INGEST_CONSUMERS.values()),
    telemetry.CONSUMER: ((TELEMETRY_STREAM, TELEMETRY_CONSUMER),),
}


async def consumer_backlogs(js: JetStreamContext) -> dict[str, tuple[int, int]]:
    """Metric label -> (messages not delivered yet, delivered and not acked yet)."""
    backlogs: dict[str, tuple[int, int]] = {}
    for label, durables in CONSUMERS.items():
        pending = ack_pending = 0
        for stream, durable in durables:
            info = await js.consumer_info(stream, durable, timeout=5.0)
            pending += int(info.num_pending or 0)
            ack_pending += int(info.num_ack_pending or 0)
        backlogs[label] = (pending, ack_pending)
    return backlogs
