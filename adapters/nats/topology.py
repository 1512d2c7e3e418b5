"""JetStream streams and consumers, declared as code and created (or updated) at start-up.

`gpufleet server nats-topology --out deploy/nats` writes the same declarations as JSON for operators
who manage streams with their own tooling; a test keeps the two in step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any

import nats.errors
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import NotFoundError, ServiceUnavailableError

from controlplane.service import ingest, telemetry

log = logging.getLogger(__name__)
DAY = 86400.0

INBOUND_STREAM = "GPUFLEET_IN"
EVENTS_STREAM = "GPUFLEET_EVENTS"
DLQ_STREAM = "GPUFLEET_DLQ"
# The ingest consumers: one per kind of inbound message, each filtered to its kind's subjects, so a
# burst of submits queues behind its own consumer and never ahead of a pod report or a cancel
# (nats-server 2.9 takes one filter subject per consumer, hence one consumer per kind). Every
# ingest process pulls each of them; JetStream shares a consumer's messages out among its pullers.
SUBMIT_CONSUMER = "ingest-submit"
CANCEL_CONSUMER = "ingest-cancel"
CLUSTER_CONSUMER = "ingest-cluster"
INGEST_CONSUMERS = {"submit": SUBMIT_CONSUMER, "cancel": CANCEL_CONSUMER, "cluster": CLUSTER_CONSUMER}
# The one unfiltered consumer of every inbound message, before the kinds had their own. At start-up,
# once the filtered ones exist, it is deleted if it holds nothing (or the Interest stream would keep
# every message for it forever). While it still holds messages (an installation upgraded with a
# backlog, perhaps on the senders' subjects of before the gateway, which no filter matches) it is
# kept, and the ingest processes pull it too until a later start-up finds it drained: a message it
# shares with a filtered consumer is applied once, the inbox absorbing the second delivery.
RETIRED_INGEST_CONSUMER = "ingest"
TELEMETRY_STREAM = "GPUFLEET_TELEMETRY"
TELEMETRY_CONSUMER = "telemetry"
MAX_REPLICAS = 5  # JetStream's own limit on stream replicas
# Senders publish on `<p>.submit…`, `<p>.cancel…`, `<p>.cluster…` and `<p>.telemetry…`, which no
# stream captures: the control plane's inbound gateway (`gateway.py`) takes them, checks them and
# stores them under `<p>.in.…`, where nobody else may publish. A stream that captured the senders'
# subjects would answer each publish on whatever reply subject the sender named, so a tenant could
# have JetStream write its acknowledgements onto another tenant's subjects.
STORED = "in"
SENT_KINDS = ("submit", "cancel", "cluster", "telemetry")


def stored_subject(prefix: str, subject: str) -> str:
    """Where the gateway stores a message a sender published on `subject`."""
    return f"{prefix}.{STORED}.{subject.removeprefix(prefix + '.')}"


def sent_subject(prefix: str, subject: str) -> str:
    """The subject a stored message was sent on (the sender's identity is in it). A message stored
    before the gateway existed was captured on its sent subject and is returned as it is."""
    return (
        f"{prefix}.{subject.removeprefix(f'{prefix}.{STORED}.')}"
        if subject.startswith(f"{prefix}.{STORED}.")
        else subject
    )


@dataclass(frozen=True)
class Topology:
    streams: tuple[StreamConfig, ...]
    consumers: tuple[tuple[str, ConsumerConfig], ...]


def topology(prefix: str = "gpufleet", replicas: int = 1) -> Topology:
    """`replicas`: copies of every stream in a JetStream cluster (`GPUFLEET_NATS_REPLICAS`; 3 on a
    three-server cluster survives the loss of any one server; 1 on a single server). Consumers
    set no replica count of their own: they inherit their stream's, and so follow it when an
    existing stream is scaled (an explicit count is refused while the stream is still catching up)."""
    if not 1 <= replicas <= MAX_REPLICAS:
        raise ValueError(f"JetStream replicas must be 1..{MAX_REPLICAS}, not {replicas}")
    streams = (
        StreamConfig(
            name=INBOUND_STREAM,
            description="Commands and reports into gpufleet: submit, cancel, cluster pods and inventory",
            subjects=[f"{prefix}.{STORED}.{kind}.>" for kind in INGEST_CONSUMERS],
            # Interest: a message is removed once its kind's ingest consumer acked it (after its SQL
            # commit, or its dead-lettering), so applied commands never pile up towards max_bytes
            # and discard=new below only bites when ingest is down for long. Not WorkQueue:
            # nats-server refuses to change an existing stream to or from WorkQueue, and
            # Interest can replace Limits in place on every installation. With no consumer at
            # all, an Interest stream keeps nothing: the consumer is created right after it.
            retention=RetentionPolicy.INTEREST,
            storage=StorageType.FILE,
            max_age=7 * DAY,
            max_msg_size=1 << 20,
            # Publishers see back-pressure instead of silently losing unconsumed commands.
            discard=DiscardPolicy.NEW,
            max_bytes=4 << 30,
            # Nats-Msg-Id is de-duplicated across the whole stream; the gateway writes it as
            # `<sender>/<id>`, so no sender can squat another's id. The window stays the server's
            # minimum: the ingest inbox de-duplicates retries per sender for days anyway.
            duplicate_window=0.1,
            num_replicas=replicas,
        ),
        StreamConfig(
            name=EVENTS_STREAM,
            description="Lifecycle events out of gpufleet (published from the SQL outbox)",
            subjects=[f"{prefix}.events.>"],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_age=7 * DAY,
            discard=DiscardPolicy.OLD,
            duplicate_window=300.0,
            num_replicas=replicas,
        ),
        StreamConfig(
            name=DLQ_STREAM,
            description="Messages gpufleet could not parse, with the reason in a header",
            subjects=[f"{prefix}.dlq.>"],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_age=30 * DAY,
            # A flood of poison cannot fill the disk: past 1 GiB the oldest dead letters go first.
            max_bytes=1 << 30,
            discard=DiscardPolicy.OLD,
            duplicate_window=120.0,
            num_replicas=replicas,
        ),
        StreamConfig(
            name=TELEMETRY_STREAM,
            # Its own stream, not GPUFLEET_IN: telemetry is orders of magnitude more traffic, and
            # with the command stream's discard=new a telemetry backlog would start refusing submits.
            description="DCGM sample batches from the cluster agents, folded into SQL windows",
            subjects=[f"{prefix}.{STORED}.telemetry.>"],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            # Stale telemetry is worth little; dropping the oldest leaves gaps, which the idle
            # policy reads as "unknown", never as "idle".
            max_age=1 * DAY,
            max_msg_size=1 << 20,
            discard=DiscardPolicy.OLD,
            max_bytes=8 << 30,
            duplicate_window=0.1,  # as GPUFLEET_IN: ids scoped to the sender, the inbox de-duplicates
            num_replicas=replicas,
        ),
    )
    consumers = (
        *((INBOUND_STREAM, _ingest_consumer(prefix, kind, durable)) for kind, durable in INGEST_CONSUMERS.items()),
        (
            TELEMETRY_STREAM,
            ConsumerConfig(
                durable_name=TELEMETRY_CONSUMER,
                description="gpufleet telemetry: many batches per SQL transaction, acked after the commit",
                ack_policy=AckPolicy.EXPLICIT,
                ack_wait=60.0,
                max_deliver=telemetry.MAX_DELIVERIES + 5,
                # Room for several fetches of thousands of batches in flight, or the pull stalls.
                max_ack_pending=50_000,
            ),
        ),
    )
    return Topology(streams, consumers)


# Messages a consumer may have delivered and not yet acknowledged. The submit consumer's pullers
# fetch batches of `FETCH_BATCH` each (several pullers in each of several processes), or their
# pulls would stall on the limit; the others carry far less traffic.
MAX_ACK_PENDING = {"submit": 20_000, "cancel": 1000, "cluster": 5000}


def _ingest_consumer(prefix: str, kind: str, durable: str) -> ConsumerConfig:
    return ConsumerConfig(
        durable_name=durable,
        description=f"gpufleet ingest of {kind} messages: acks only after the SQL commit",
        filter_subject=f"{prefix}.{STORED}.{kind}.>",
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=30.0,
        # The worker dead-letters a message on its MAX_DELIVERIES-th failed delivery; this
        # backstop only matters if even dead-lettering keeps failing (the server then
        # stops redelivering and sends a max-deliveries advisory).
        max_deliver=ingest.MAX_DELIVERIES + 5,
        max_ack_pending=MAX_ACK_PENDING[kind],
    )


# While a JetStream cluster elects its meta leader or a stream's leader (at start-up, with several
# processes declaring at once, or while a server restarts), an API request times out or is answered
# 503. Declaring is idempotent, so those are retried; a config the server refuses is raised at once.
_NOT_READY = (nats.errors.TimeoutError, nats.errors.NoRespondersError, ServiceUnavailableError)


async def ensure_topology(
    js: JetStreamContext, prefix: str = "gpufleet", replicas: int = 1, patience: float = 120.0
) -> None:
    """Create or update every stream and consumer, waiting up to `patience` seconds for JetStream to
    answer. An existing stream is brought to `replicas` too: a JetStream cluster scales it in place
    (it takes a few seconds) and its consumers follow."""
    plan = topology(prefix, replicas)
    loop = asyncio.get_running_loop()
    deadline, delay = loop.time() + patience, 0.5
    while True:
        try:
            await _declare(js, plan)
            return
        except _NOT_READY as exc:
            if loop.time() + delay > deadline:
                raise
            log.warning("JetStream not ready (%s); declaring streams again in %.1f s", type(exc).__name__, delay)
            await asyncio.sleep(delay)
            delay = min(2 * delay, 5.0)


async def _declare(js: JetStreamContext, plan: Topology) -> None:
    for stream in plan.streams:
        assert stream.name
        try:
            await js.stream_info(stream.name)
        except NotFoundError:
            await js.add_stream(stream)
            log.info("created stream %s", stream.name)
        else:
            await js.update_stream(stream)
    for stream_name, consumer in plan.consumers:
        await js.add_consumer(stream_name, consumer)


async def retire_ingest_consumer(js: JetStreamContext) -> bool:
    """Delete the retired unfiltered ingest consumer if it holds nothing; True when it still holds
    messages (and is kept, for the ingest processes to drain). Call after `ensure_topology`."""
    try:
        info = await js.consumer_info(INBOUND_STREAM, RETIRED_INGEST_CONSUMER)
    except NotFoundError:
        return False
    held = int(info.num_pending or 0) + int(info.num_ack_pending or 0)
    if held:
        log.warning("the retired consumer %s still holds %d messages; draining it", RETIRED_INGEST_CONSUMER, held)
        return True
    with contextlib.suppress(NotFoundError):
        await js.delete_consumer(INBOUND_STREAM, RETIRED_INGEST_CONSUMER)
        log.info("deleted the retired consumer %s", RETIRED_INGEST_CONSUMER)
    return False


def as_json(prefix: str = "gpufleet", replicas: int = 1) -> dict[str, Any]:
    plan = topology(prefix, replicas)
    return {
        "streams": [s.as_dict() for s in plan.streams],
        "consumers": [{"stream": name, "config": c.as_dict()} for name, c in plan.consumers],
    }
