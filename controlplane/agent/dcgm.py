"""The in-cluster telemetry agent: scrape dcgm-exporter, attribute GPUs to runs, publish batches.

One agent per node (a DaemonSet next to dcgm-exporter) or one per cluster scraping several
exporters. It never writes to SQL and never manages streams: the control plane declares the
telemetry stream, and NATS permissions can limit an agent to `<prefix>.telemetry.<its cluster>.>`.
Telemetry is allowed to be lossy: a scrape that cannot be published is dropped after a few tries
with the same Nats-Msg-Id, leaving a gap that the idle policy reads as "unknown", never "idle".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from adapters.dcgm.exposition import RunResolver, SlotAssignments, parse_exposition, run_of_pod_name
from adapters.nats.connection import INBOUND_ID_HEADER, JetStreamPublisher, connect
from controlplane.agent.serving import ServingRound
from controlplane.service.ports import EventPublisher
from controlplane.service.telemetry_wire import encode_batch, telemetry_subject

log = logging.getLogger(__name__)
SUBJECT_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,63}$")
NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# Well under the stream's 1 MiB message limit: a sample encodes to ~300 bytes.
SAMPLES_PER_MESSAGE = 500
PUBLISH_ATTEMPTS = 3


@dataclass(frozen=True)
class AgentConfig:
    cluster: str
    dcgm_url: str
    prefix: str = "gpufleet"
    interval: float = 10.0
    node: str = socket.gethostname()  # for series without a Hostname label (`--no-hostname`)
    scrape_timeout: float = 5.0
    # Namespaces gpufleet runs pods in on this cluster (its `kubernetes.namespace` setting): only
    # pods there are attributed to runs.
    namespaces: tuple[str, ...] = ("gpufleet",)

    def __post_init__(self) -> None:
        for name in ("cluster", "prefix"):
            if not SUBJECT_TOKEN.match(getattr(self, name)):
                raise ValueError(f"{name} must be letters, digits, '-' or '_' (it becomes a NATS subject token)")
        if not self.interval > 0:
            raise ValueError("interval must be positive")
        if not self.namespaces:
            raise ValueError("at least one namespace is needed")
        for namespace in self.namespaces:
            if len(namespace) > 63 or not NAMESPACE.match(namespace):
                raise ValueError(f"namespace {namespace!r} is not a Kubernetes namespace name")

    @property
    def subject(self) -> str:
        return telemetry_subject(self.prefix, self.cluster)


@dataclass(frozen=True)
class ScrapeReport:
    samples: int
    messages: int  # published (or already stored: a retried publish is de-duplicated by NATS)
    attributed: int  # samples with a run id
    blanks: int
    unidentified: int
    serving: int = 0  # serving readings published (runs with a rate or latency this round)


async def scrape_once(
    client: httpx.AsyncClient,
    config: AgentConfig,
    resolver: RunResolver,
    publisher: EventPublisher,
    now: float,
    serving: ServingRound | None = None,
) -> ScrapeReport:
    """Scrape, map and publish one round; raises on a failed scrape or publish. With `serving`, the
    round's serving readings ride in the first message (alone, when there are no samples)."""
    response = await client.get(config.dcgm_url, timeout=config.scrape_timeout)
    response.raise_for_status()
    result = parse_exposition(response.text, config.cluster, config.node, resolver, now)
    samples = result.samples
    readings = await serving.readings(client, now) if serving is not None else []
    # One id per scrape and chunk: a retry after an unknown publish outcome reuses it, so the
    # stream keeps one copy, and the consumer's inbox catches anything past the dedup window.
    scrape_id = f"dcgm:{config.cluster}:{config.node}:{math.floor(now * 1000)}"
    messages = 0
    starts = range(0, max(len(samples), 1 if readings else 0), SAMPLES_PER_MESSAGE)
    for chunk_no, start in enumerate(starts):
        chunk = samples[start : start + SAMPLES_PER_MESSAGE]
        payload = encode_batch(config.cluster, chunk, readings if chunk_no == 0 else ())
        await _publish(publisher, config.subject, payload, f"{scrape_id}:{chunk_no}")
        messages += 1
    return ScrapeReport(
        samples=len(samples),
        messages=messages,
        attributed=sum(1 for s in samples if s.run_id is not None),
        blanks=result.blanks,
        unidentified=result.unidentified,
        serving=len(readings),
    )


async def _publish(publisher: EventPublisher, subject: str, payload: bytes, msg_id: str) -> None:
    for attempt in range(1, PUBLISH_ATTEMPTS + 1):
        try:
            await publisher.publish(subject, payload, msg_id)
            return
        except Exception:
            if attempt == PUBLISH_ATTEMPTS:
                raise
            await asyncio.sleep(0.5 * attempt)


async def run_agent(
    config: AgentConfig,
    publisher: EventPublisher,
    resolver: RunResolver,
    stop: asyncio.Event,
    clock: Callable[[], float] = time.time,
    once: bool = False,
    serving: ServingRound | None = None,
) -> ScrapeReport | None:
    """Scrape every `interval` seconds until `stop`; a failed round is logged and skipped."""
    last: ScrapeReport | None = None
    async with httpx.AsyncClient() as client:
        while not stop.is_set():
            started = time.monotonic()
            try:
                last = await scrape_once(client, config, resolver, publisher, clock(), serving)
                log.debug("published %d samples in %d messages", last.samples, last.messages)
            except Exception as exc:
                if once:
                    raise
                log.warning("telemetry round failed: %s: %s", type(exc).__name__, exc)
            if once:
                break
            # Fixed cadence: the next round starts `interval` after this one started.
            remaining = config.interval - (time.monotonic() - started)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=max(0.0, remaining))
    return last


def default_resolver(assignments: Path | None, namespaces: frozenset[str] = frozenset({"gpufleet"})) -> RunResolver:
    """Runs from the pods' `gpufleet.io/run` label (dcgm-exporter's pod labels), else from the pod
    name (gpufleet names pods after the run id, no Kubernetes API call needed), both only in
    `namespaces`; the node-assignment file, if given, covers series without a pod."""
    return RunResolver(
        pod_run=lambda namespace, pod: run_of_pod_name(namespace, pod, namespaces),
        slot_run=SlotAssignments(assignments) if assignments is not None else None,
        namespaces=namespaces,
    )


async def main(
    config: AgentConfig,
    nats_url: str,
    stop: asyncio.Event,
    resolver: RunResolver,
    once: bool = False,
    credential: str | None = None,
    serving: ServingRound | None = None,
) -> ScrapeReport | None:
    """The agent process: one NATS connection that reconnects forever, and the scrape loop. With
    `credential` (the cluster's NATS credential) it connects as that cluster and nothing else."""
    nc = await connect(
        nats_url,
        f"gpufleet-agent-{config.cluster}-{config.node}",
        token=credential,
        inbox_prefix=f"_INBOX.cluster-{config.cluster}" if credential else "_INBOX",
    )
    try:
        publisher = JetStreamPublisher(nc.jetstream(), id_header=INBOUND_ID_HEADER)
        return await run_agent(config, publisher, resolver, stop, once=once, serving=serving)
    finally:
        await nc.drain()
