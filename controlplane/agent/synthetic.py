"""Simulated agents of a synthetic fleet, for `gpufleet dev bench ingest`.

They publish exactly what `gpufleet agent` would (one batch per node per scrape, same subject,
payload and Nats-Msg-Id shapes), from their own process so that the consumer being measured does
not share an interpreter with them. This module stays light to import: a spawned child loads it.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from adapters.nats.connection import connect
from controlplane.service.telemetry_wire import GpuSample, encode_batch, telemetry_subject

IN_FLIGHT = 512  # publishes awaiting their PubAck at once


@dataclass(frozen=True)
class FleetSpec:
    nodes: int
    gpus_per_node: int
    seconds: float
    sample_interval: float
    clusters: int
    start: float  # unix time of the first scrape
    seed: int
    prefix: str = "bench"
    cluster_prefix: str = "c"  # clusters are named <cluster_prefix><n>

    @property
    def scrapes(self) -> int:
        return max(1, int(self.seconds / self.sample_interval))

    @property
    def samples(self) -> int:
        return self.nodes * self.gpus_per_node * self.scrapes

    @property
    def messages(self) -> int:
        return self.nodes * self.scrapes


def synthetic_run_id(spec: FleetSpec, node: int) -> str:
    """The run on `node` (named after the clusters, so benches sharing a database never collide)."""
    return f"run-{spec.cluster_prefix}{node:05d}"


def synthetic_runs(spec: FleetSpec) -> dict[str, list[str]]:
    """Run ids by cluster name: what the control plane must know for the samples to be kept."""
    runs: dict[str, list[str]] = {f"{spec.cluster_prefix}{c}": [] for c in range(spec.clusters)}
    for node in range(spec.nodes):
        if node % 10 != 9:
            runs[f"{spec.cluster_prefix}{node % spec.clusters}"].append(synthetic_run_id(spec, node))
    return runs


def node_batch(spec: FleetSpec, node: int, scrape: int, rng: random.Random) -> tuple[str, bytes, str]:
    """What one node's agent publishes for one scrape: subject, payload, Nats-Msg-Id."""
    cluster = f"{spec.cluster_prefix}{node % spec.clusters}"
    at = spec.start + scrape * spec.sample_interval
    host = f"node-{node:05d}"
    # Most nodes run one 8-GPU gang; every tenth is idle and unattributed, as in a real fleet.
    run = None if node % 10 == 9 else synthetic_run_id(spec, node)
    samples = []
    for gpu in range(spec.gpus_per_node):
        # Six decimals, as dcgm-exporter prints its gauges.
        busy = 0.0 if run is None else round(rng.random(), 6)
        samples.append(
            GpuSample(
                cluster=cluster,
                node=host,
                gpu_uuid=f"GPU-{node:08x}-{gpu:04x}-bench",
                gpu_index=gpu,
                timestamp=at,
                metrics={
                    "sm_active": busy,
                    "gr_engine_active": round(min(1.0, busy * 1.1), 6),
                    "tensor_active": round(busy * 0.8, 6),
                    "gpu_util": 100.0 if busy > 0.05 else 0.0,
                    "fb_used_mib": 40_000.0 if run else 0.0,
                    "fb_free_mib": 41_000.0 if run else 81_000.0,
                    "power_w": round(90.0 + 600.0 * busy, 3),
                    "xid": 0.0,
                },
                run_id=run,
                pod=None if run is None else f"{run}-worker-0",
                namespace=None if run is None else "team-bench",
            )
        )
    return telemetry_subject(spec.prefix, cluster), encode_batch(cluster, samples), f"dcgm:{cluster}:{host}:{scrape}"


async def _publish_fleet(url: str, spec: FleetSpec) -> tuple[float, float, int]:
    nc = await connect(url, "bench-agents")
    js = nc.jetstream()
    rng = random.Random(spec.seed)
    pending: list[Any] = []
    sent = 0
    started = time.time()
    for scrape in range(spec.scrapes):
        for node in range(spec.nodes):
            subject, payload, msg_id = node_batch(spec, node, scrape, rng)
            pending.append(js.publish(subject, payload, timeout=30.0, headers={"Nats-Msg-Id": msg_id}))
            if len(pending) >= IN_FLIGHT:
                await asyncio.gather(*pending)
                sent += len(pending)
                pending.clear()
    await asyncio.gather(*pending)
    sent += len(pending)
    finished = time.time()
    await nc.close()
    return started, finished, sent


def publisher_process(url: str, spec: FleetSpec, out: Connection) -> None:
    """Entry point of the publishing child: sends back (started, finished, sent) or an error text."""
    logging.getLogger("adapters.nats.connection").setLevel(logging.ERROR)
    try:
        out.send(asyncio.run(_publish_fleet(url, spec)))
    except Exception as exc:  # reported to the parent, which prints it as the bench's failure
        out.send(f"{type(exc).__name__}: {exc}")
    finally:
        out.close()
