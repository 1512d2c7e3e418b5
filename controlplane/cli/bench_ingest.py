"""`gpufleet dev bench ingest`: DCGM samples through a real nats-server and the real consumer into SQL.

A separate process plays the agents of a synthetic fleet (one message per node per scrape, the
way `gpufleet agent` publishes) while this process runs the production telemetry loop. Figures
are measured, never asserted: the command reports what it saw, hit or miss.
"""

from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing
import secrets
import statistics
import time
from collections.abc import Sequence
from typing import Any

import click
from nats.aio.client import Client
from sqlalchemy import func, insert, select

from adapters.dcgm.consumer import JetStreamTelemetrySource, TelemetryDelivery
from adapters.nats.connection import connect
from adapters.nats.gateway import InboundGateway
from adapters.nats.topology import ensure_topology
from adapters.sql.tables import (
    ClusterRow,
    PriorityClassRow,
    QueueRow,
    RunRow,
    TeamRow,
    TelemetryWindowRow,
    WorkloadRow,
)
from controlplane.agent.synthetic import FleetSpec, publisher_process, synthetic_runs
from controlplane.bootstrap import Wiring, utc_now
from controlplane.cli.bench_submit import PREFIX, bench_environment
from controlplane.service.telemetry import BatchResult, Outcome
from controlplane.workers import telemetry_loop


def _percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return round(values[0], 4)
    return round(statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1], 4)


class _Recorder:
    """Observes the telemetry loop: lags, busy time, and when everything has landed."""

    def __init__(self, expected_messages: int, stop: asyncio.Event) -> None:
        self.expected = expected_messages
        self.stop = stop
        self.lags: list[float] = []
        self.samples = self.transactions = self.messages = self.duplicates = 0
        self.busy = 0.0
        self.fetched_at = 0.0
        self.first_commit: float | None = None
        self.last_commit: float | None = None

    def __call__(self, deliveries: Sequence[telemetry_loop.TelemetryDelivery], result: BatchResult) -> None:
        now = time.time()
        self.busy += time.perf_counter() - self.fetched_at
        self.first_commit = self.first_commit or now
        self.last_commit = now
        self.transactions += 1
        self.messages += len(deliveries)
        self.samples += result.samples
        self.duplicates += sum(1 for outcome, _ in result.outcomes if outcome is Outcome.DUPLICATE)
        self.lags.extend(now - d.published_at for d in deliveries if d.published_at is not None)
        # Every message handled, whatever became of it: a duplicate must not make the bench hang.
        if self.messages >= self.expected:
            self.stop.set()


class _TimedSource(JetStreamTelemetrySource):
    """Notes when each fetch returned, so the recorder can tell processing time from waiting."""

    def __init__(self, nc: Client, prefix: str, recorder: _Recorder) -> None:
        super().__init__(nc, prefix)
        self.recorder = recorder

    async def fetch(self, batch: int, timeout: float) -> list[TelemetryDelivery]:
        deliveries = await super().fetch(batch, timeout)
        self.recorder.fetched_at = time.perf_counter()
        return deliveries


async def _consume(
    wiring: Wiring, url: str, spec: FleetSpec, fetch: int, window: int, limit: float, prefill: bool
) -> dict[str, Any]:
    nc = await connect(url, "bench-consumer")
    await ensure_topology(nc.jetstream(), PREFIX)
    # The agents' batches reach the stream through the inbound gateway, which the ingest process
    # runs in production too: its cost is part of the figure.
    gateway = InboundGateway(nc, PREFIX, confine_replies=False)
    await gateway.start()
    stop = asyncio.Event()
    recorder = _Recorder(spec.messages, stop)
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    publisher = context.Process(target=publisher_process, args=(url, spec, send), daemon=True)
    publisher.start()
    send.close()
    if prefill:
        # Everything is in the stream before the consumer starts: its rate alone is measured.
        await asyncio.to_thread(receive.poll, limit)
    consumer_start = time.time()
    cpu_start = time.process_time()
    consumer = asyncio.create_task(
        telemetry_loop.telemetry_loop(
            _TimedSource(nc, PREFIX, recorder), wiring.uow, PREFIX, utc_now, stop, fetch, window, recorder
        )
    )
    try:
        await asyncio.wait_for(stop.wait(), timeout=limit)
    except TimeoutError:
        stop.set()
    await consumer
    cpu = time.process_time() - cpu_start
    published = receive.recv() if await asyncio.to_thread(receive.poll, 30.0) else "publisher did not report"
    publisher.join(timeout=10)
    await nc.close()
    if isinstance(published, str):
        raise click.ClickException(f"publishing failed: {published}")
    publish_start, publish_end, sent = published
    end = recorder.last_commit or time.time()
    with wiring.engine.connect() as conn:
        windows, landed = conn.execute(
            select(func.count(), func.coalesce(func.sum(TelemetryWindowRow.samples), 0))
            .select_from(TelemetryWindowRow)
            .where(TelemetryWindowRow.cluster.startswith(spec.cluster_prefix, autoescape=True))
        ).one()
    # Concurrent mode: from the first publish to the commit that completed the set.
    # Prefill mode: from the consumer's start, since publishing was over by then.
    elapsed = end - (consumer_start if prefill else publish_start)
    return {
        "complete": recorder.samples >= spec.samples,
        "mode": "prefill" if prefill else "concurrent",
        "samples": spec.samples,
        "samples_committed": recorder.samples,
        "samples_in_windows": int(landed),
        "messages_published": sent,
        "messages_committed": recorder.messages,
        "duplicates": recorder.duplicates,
        "windows": int(windows),
        "transactions": recorder.transactions,
        "mean_messages_per_transaction": round(recorder.messages / recorder.transactions, 1)
        if recorder.transactions
        else 0,
        "samples_per_second": _rate(recorder.samples, elapsed),
        "publish_samples_per_second": _rate(spec.samples, publish_end - publish_start),
        # Samples per second of the consumer's processing time (decode, fold, SQL, DLQ, acks),
        # i.e. what it could sustain if it never waited for messages.
        "consumer_busy_seconds": round(recorder.busy, 3),
        "consumer_capacity_samples_per_second": _rate(recorder.samples, recorder.busy),
        # CPU of this process (event loop and worker threads, not the publisher or nats-server)
        # while consuming: the figure that does not depend on what else the machine is running.
        "consumer_cpu_seconds": round(cpu, 3),
        "samples_per_consumer_cpu_second": _rate(recorder.samples, cpu),
        # From JetStream's store timestamp to the ack that followed the SQL commit.
        "lag_p50_seconds": _percentile(recorder.lags, 50),
        "lag_p95_seconds": _percentile(recorder.lags, 95),
        "lag_max_seconds": round(max(recorder.lags), 4) if recorder.lags else None,
        "elapsed_seconds": round(elapsed, 3),
    }


def _register_fleet(wiring: Wiring, spec: FleetSpec) -> None:
    """Register the synthetic clusters and their runs: ingest keeps only telemetry of known
    clusters and of their own runs."""
    now = utc_now()
    tag = spec.cluster_prefix.rstrip("-")
    with wiring.engine.begin() as conn:
        if conn.scalar(select(PriorityClassRow.name).where(PriorityClassRow.name == "bench")) is None:
            conn.execute(insert(PriorityClassRow), [{"name": "bench", "value": 0}])
        conn.execute(insert(TeamRow), [{"id": f"t-{tag}", "name": f"t-{tag}", "created_at": now}])
        conn.execute(
            insert(QueueRow), [{"id": f"q-{tag}", "name": f"q-{tag}", "team_id": f"t-{tag}", "created_at": now}]
        )
        for cluster, run_ids in synthetic_runs(spec).items():
            conn.execute(insert(ClusterRow), [{"id": cluster, "name": cluster, "provider": "sim", "created_at": now}])
            if not run_ids:
                continue
            workload = {"team_id": f"t-{tag}", "queue_id": f"q-{tag}", "priority_class": "bench", "priority": 0}
            conn.execute(
                insert(WorkloadRow),
                [
                    {
                        **workload,
                        "id": run,
                        "name": run,
                        "kind": "training",
                        "min_available": 1,
                        "state": "running",
                        "created_seq": 0,
                        "created_at": now,
                        "updated_at": now,
                    }
                    for run in run_ids
                ],
            )
            conn.execute(
                insert(RunRow),
                [
                    {
                        "id": run,
                        "workload_id": run,
                        "attempt": 1,
                        "cluster_id": cluster,
                        "epoch": 1,
                        "state": "running",
                        "created_at": now,
                    }
                    for run in run_ids
                ],
            )


def _rate(count: int, seconds: float) -> float:
    return round(count / seconds, 1) if seconds > 0 else 0.0


def run_bench(
    spec: FleetSpec,
    database_url: str | None,
    fetch: int,
    window: int,
    limit: float,
    prefill: bool = False,
) -> dict[str, Any]:
    with bench_environment("ingest", database_url) as env:
        url = env.url
        _register_fleet(env.wiring, spec)
        figures = asyncio.run(_consume(env.wiring, env.nats.url, spec, fetch, window, limit, prefill))
    return {
        **figures,
        "database": url.split(":", 1)[0].split("+", 1)[0],
        "nodes": spec.nodes,
        "gpus_per_node": spec.gpus_per_node,
        "clusters": spec.clusters,
        "seconds": spec.seconds,
        "sample_interval": spec.sample_interval,
        "fetch_batch": fetch,
        "window_seconds": window,
    }


@click.command("ingest")
@click.option("--nodes", default=1000, show_default=True, type=click.IntRange(min=1))
@click.option("--gpus-per-node", default=8, show_default=True, type=click.IntRange(min=1, max=64))
@click.option("--seconds", default=60.0, show_default=True, type=click.FloatRange(min=0.001), help="simulated")
@click.option(
    "--sample-interval", default=1.0, show_default=True, type=click.FloatRange(min=0.001), help="simulated scrape gap"
)
@click.option("--clusters", default=4, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--fetch", default=telemetry_loop.TELEMETRY_FETCH, show_default=True, type=click.IntRange(min=1, max=50_000)
)
@click.option("--window", default=300, show_default=True, type=click.IntRange(min=1), help="window seconds")
@click.option(
    "--database-url",
    default=None,
    help="a migrated scratch database; its windows of clusters bench-<tag>-c<n> stay (default: a fresh SQLite file)",
)
@click.option("--timeout", default=600.0, show_default=True, type=click.FloatRange(min=1.0), help="give up after")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--prefill", is_flag=True, help="publish everything first, then time the consumer alone")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def bench_ingest(
    nodes: int,
    gpus_per_node: int,
    seconds: float,
    sample_interval: float,
    clusters: int,
    fetch: int,
    window: int,
    database_url: str | None,
    timeout: float,
    seed: int,
    prefill: bool,
    as_json: bool,
) -> None:
    """Publish a fleet's DCGM samples to a real nats-server and time the telemetry consumer."""
    # Samples sit in the recent past so none is rejected as too old or from the future.
    start = time.time() - seconds - 60
    # Cluster names unique to this run, so figures read back from a shared database count only it.
    run_tag = f"bench-{secrets.token_hex(3)}-c"
    spec = FleetSpec(nodes, gpus_per_node, seconds, sample_interval, clusters, start, seed, PREFIX, run_tag)
    # Reconnect chatter of the bench's own short-lived connections is not a finding.
    logging.getLogger("adapters.nats.connection").setLevel(logging.ERROR)
    result = run_bench(spec, database_url, fetch, window, timeout, prefill)
    if as_json:
        click.echo(json.dumps(result))
        return
    for key, value in result.items():
        click.echo(f"{key:>32}  {value}")
