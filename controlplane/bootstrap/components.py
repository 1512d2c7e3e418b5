"""Which tasks each component (api, scheduler, dispatcher, ingest, relay) runs in a process, and
the embedded API server and per-cluster periodic steps they need (NATS auth callout: nats_auth.py)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import socket
from collections.abc import Callable, Iterator, Mapping
from datetime import timedelta
from typing import Any

import uvicorn

from adapters.dcgm.consumer import JetStreamTelemetrySource
from adapters.nats import secrets as nats_secrets
from adapters.nats.connection import INBOUND_ID_HEADER, JetStreamPublisher, connect
from adapters.nats.consumer_stats import consumer_backlogs
from adapters.nats.gateway import InboundGateway
from adapters.nats.inbound import JetStreamInbound
from adapters.nats.topology import (
    INGEST_CONSUMERS,
    RETIRED_INGEST_CONSUMER,
    SUBMIT_CONSUMER,
    ensure_topology,
    retire_ingest_consumer,
    stored_subject,
)
from adapters.prometheus import FleetCollector, PrometheusMetrics, exposition, new_registry, serve_metrics
from adapters.sql.gauges_repo import SqlFleetGauges
from controlplane.api.app import create_app
from controlplane.api.context import ApiContext
from controlplane.bootstrap.nats_auth import serve_auth_callout
from controlplane.bootstrap.real_fleet import RealFleet
from controlplane.bootstrap.sim_fleet import SimFleet
from controlplane.bootstrap.wiring import Wiring, utc_now
from controlplane.config import Settings
from controlplane.service.auth import authorize_scrape
from controlplane.service.auth_limits import FailedAuthLimiter
from controlplane.service.autoscale import autoscale_once
from controlplane.service.cloud_ports import CloudProvider
from controlplane.service.fleet_fit import FleetFit
from controlplane.service.fleet_sync import sync_due
from controlplane.service.gang_timeout import requeue_stalled_gangs, requeue_undispatched
from controlplane.service.kubeconfigs import FileKubeconfigStore
from controlplane.service.relay import relay_gap
from controlplane.service.scheduling import lease_gap
from controlplane.workers import loops
from controlplane.workers.dispatch_loop import DISPATCHER_LEASE, dispatcher_loop
from controlplane.workers.idle_loop import idle_loop
from controlplane.workers.ingest_loop import FETCH_BATCH, SUBMIT_FETCH_BATCH, ingest_loop, submit_pullers
from controlplane.workers.relay_loop import relay_loop
from controlplane.workers.report_loop import report_loop
from controlplane.workers.scheduler_loop import scheduler_loop
from controlplane.workers.telemetry_loop import metered_telemetry, telemetry_loop

log = logging.getLogger(__name__)
COMPONENTS = ("api", "scheduler", "dispatcher", "ingest", "relay")
# How often the ingest process asks the broker how far behind its durable consumers are.
CONSUMER_BACKLOG_SECONDS = 10.0


class _EmbeddedServer(uvicorn.Server):
    """uvicorn inside a process that owns its signals: it stops when told, not on its own."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _reuse_port_socket(host: str, port: int) -> socket.socket:
    """A listening socket that other processes may bind too (SO_REUSEPORT)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


async def run_components(
    settings: Settings,
    components: tuple[str, ...],
    stop: asyncio.Event,
    extra: list[Any] | None = None,
    providers: Mapping[str, CloudProvider] | None = None,
) -> None:
    """Run the named components in this event loop until `stop` is set. `providers` replaces the cloud
    adapters `build_provider` would make (tests, embedding)."""
    wiring = Wiring(settings)
    prefix = settings.subject_prefix
    secrets = nats_secrets.load(settings.nats_secrets_file) if settings.nats_secrets_file else None
    name = f"gpufleet-{'+'.join(components)}"
    if secrets is not None and "ingest" in components:
        # Before anything else connects: without the callout answering, no agent or client can.
        extra = [*(extra or []), *(await serve_auth_callout(settings, secrets, wiring, stop))]
    nc = await connect(
        settings.nats_url,
        name,
        user=secrets.control_user if secrets else None,
        password=secrets.control_password if secrets else None,
        resilient=True,
    )
    js = nc.jetstream()
    await ensure_topology(js, prefix, settings.nats_replicas)
    publisher = JetStreamPublisher(js)
    # Reports the control plane makes for a cluster (its watchers of real clusters, simulated
    # clusters without NATS authentication) are stored as the gateway stores the cluster's own.
    inbound_publisher = JetStreamPublisher(
        js, id_header=INBOUND_ID_HEADER, subject_map=lambda subject: stored_subject(prefix, subject)
    )
    tasks: list[asyncio.Task[None]] = []
    policy = settings.scheduling_policy()
    clock = utc_now
    server: uvicorn.Server | None = None
    registry = new_registry()  # this run's own: two control planes in one process do not mix
    metrics = PrometheusMetrics(registry)
    gauges = SqlFleetGauges(wiring.engine, max_run_series=settings.metrics_max_run_series, pools=False)
    if "api" in components:  # the API processes export the fleet's SQL gauges (read when scraped)
        registry.register(FleetCollector(gauges, utc_now, settings.metrics_fleet_interval))
    stop_metrics: Callable[[], None] | None = None
    # Failed authentications per client address, one count for the API and the metrics port.
    auth_failures = FailedAuthLimiter(settings.auth_failure_limit, settings.auth_failure_window)
    if "api" in components:
        ctx = ApiContext(
            exposition=lambda: exposition(registry),
            auth_failures=auth_failures,
            trusted_hosts=tuple(settings.api_trusted_hosts),
            trusted_proxies=tuple(settings.api_trusted_proxies),
            session_ttl=timedelta(seconds=settings.ui_session_ttl),
            metrics=metrics,
            # The dashboard's pages and `GET /v1/status`: the fleet figures without the SLO families,
            # which they do not show and which cost most of a read on a large fleet.
            gauges=SqlFleetGauges(wiring.engine, slo=False),
            uow_factory=wiring.uow,
            subject_prefix=prefix,
            idle_rules=settings.idle_rules(),
            audit_thresholds=settings.audit_thresholds(),
            readiness={
                "database": wiring.database_ready,
                "nats": lambda: None if nc.is_connected else "not connected to NATS",
                # A dead scheduler or dispatcher means submits are taken but nothing is admitted
                # or dispatched: not ready until some process holds each lease again.
                "scheduler": lambda: lease_gap(wiring.uow, "scheduler", utc_now()),
                "dispatcher": lambda: lease_gap(wiring.uow, DISPATCHER_LEASE, utc_now()),
                "events": lambda: relay_gap(wiring.uow, utc_now(), settings.relay_ready_lag),
            },
        )
        app = create_app(ctx)
        app.state.kubeconfigs = FileKubeconfigStore(settings.state_dir / "kubeconfigs")
        config = uvicorn.Config(
            # log_config None: uvicorn's lines go through this process's handlers (text or JSON).
            app,
            host=settings.api_host,
            port=settings.api_port,
            log_level="warning",
            lifespan="off",
            log_config=None,
            # X-Forwarded-* are read by the app itself, from `api_trusted_proxies` only (api/edge.py);
            # uvicorn's own reading would trust 127.0.0.1 (or $FORWARDED_ALLOW_IPS) behind its back.
            proxy_headers=False,
            # httptools (C, llhttp) parses HTTP/1.1; the pure-Python h11 is the fallback where it is absent.
            http="httptools" if importlib.util.find_spec("httptools") else "h11",
        )
        server = _EmbeddedServer(config)
        sockets = [_reuse_port_socket(settings.api_host, settings.api_port)] if settings.api_reuse_port else None
        tasks.append(asyncio.create_task(server.serve(sockets=sockets), name="api"))
    if "scheduler" in components:
        tasks.append(
            asyncio.create_task(
                scheduler_loop(
                    wiring.uow,
                    policy,
                    prefix,
                    clock,
                    stop,
                    settings.scheduler_interval,
                    settings.lease_ttl,
                    settings.check_invariants,
                    metrics,
                    settings.snapshot_rebuild_interval,
                ),
                name="scheduler",
            )
        )
        idle_rules = settings.idle_rules()
        tasks.append(
            asyncio.create_task(
                idle_loop(wiring.uow, idle_rules, prefix, clock, stop, settings.idle_interval, settings.lease_ttl),
                name="idle",
            )
        )
        tasks.append(
            asyncio.create_task(
                report_loop(
                    wiring.uow,
                    prefix,
                    clock,
                    stop,
                    lease_ttl=settings.lease_ttl,
                    audit=(idle_rules, settings.audit_thresholds()),
                ),
                name="reports",
            )
        )
    if "dispatcher" in components:
        fleet = SimFleet(wiring, inbound_publisher, prefix, settings.sim_start_delay, settings.telemetry_interval)
        tasks.append(asyncio.create_task(fleet.run(stop), name="sim-fleet"))
        real = RealFleet(wiring, inbound_publisher, prefix, providers, metrics)
        tasks.append(asyncio.create_task(real.run(stop), name="real-fleet"))
        tasks.extend(_real_cluster_tasks(wiring, real, settings, prefix, stop))

        async def dispatch_timeout() -> None:
            await asyncio.to_thread(requeue_undispatched, wiring.uow, prefix, utc_now, settings.dispatch_timeout)

        tasks.append(
            asyncio.create_task(
                loops.periodic_loop("dispatch timeout", dispatch_timeout, stop, settings.gang_timeout_interval),
                name="dispatch-timeout",
            )
        )
        tasks.append(
            asyncio.create_task(
                dispatcher_loop(
                    wiring.uow,
                    lambda: {**fleet.drivers(), **real.drivers()},
                    prefix,
                    clock,
                    stop,
                    settings.dispatcher_interval,
                    settings.orphan_gc_interval,
                    settings.lease_ttl,
                    fleet.set_active,
                    settings.vanished_run_grace,
                    metrics,
                ),
                name="dispatcher",
            )
        )
    if "relay" in components:
        tasks.append(
            asyncio.create_task(
                relay_loop(
                    wiring.uow,
                    publisher,
                    clock,
                    stop,
                    settings.relay_interval,
                    settings.lease_ttl,
                    metrics=metrics,
                    dead_letters=publisher,
                ),
                name="relay",
            )
        )
    if "ingest" in components:
        gateway = InboundGateway(nc, prefix, confine_replies=secrets is not None, on_refused=metrics.inbound_refused)
        await gateway.start()
        fit = FleetFit()  # the process's memo of the submit-time fleet check, shared by its loops
        pullers = dict.fromkeys(INGEST_CONSUMERS.values(), 1)
        pullers[SUBMIT_CONSUMER] = submit_pullers(wiring.engine.dialect.name)
        if await retire_ingest_consumer(js):
            pullers[RETIRED_INGEST_CONSUMER] = 1
        for consumer, count in pullers.items():
            batch = SUBMIT_FETCH_BATCH if consumer == SUBMIT_CONSUMER else FETCH_BATCH
            for puller in range(count):
                source = JetStreamInbound(js, prefix, consumer)
                loop = ingest_loop(source, wiring.uow, prefix, clock, stop, metrics, fit, batch)
                tasks.append(asyncio.create_task(loop, name=f"{consumer}-{puller}"))
        telemetry_source = JetStreamTelemetrySource(nc, prefix)
        tasks.append(
            asyncio.create_task(
                telemetry_loop(
                    telemetry_source,
                    wiring.uow,
                    prefix,
                    clock,
                    stop,
                    window_seconds=settings.telemetry_window_seconds,
                    observer=metered_telemetry(metrics),
                ),
                name="telemetry",
            )
        )

        async def consumer_backlog() -> None:
            for consumer, (pending, ack_pending) in (await consumer_backlogs(js)).items():
                metrics.consumer_pending(consumer, pending, ack_pending)

        tasks.append(
            asyncio.create_task(
                loops.periodic_loop("consumer backlog", consumer_backlog, stop, CONSUMER_BACKLOG_SECONDS),
                name="consumer-backlog",
            )
        )
    for coroutine in extra or []:
        tasks.append(asyncio.create_task(coroutine))
    try:
        if settings.metrics_port:
            try:
                stop_metrics = serve_metrics(
                    registry,
                    settings.metrics_host,
                    settings.metrics_port,
                    lambda source, authorization: authorize_scrape(wiring.uow, auth_failures, source, authorization),
                )
            except OSError:
                stop.set()  # the port is taken: stop what started, then say why
                raise
        await stop.wait()
    finally:
        if server is not None:
            server.should_exit = True
        done, pending = await asyncio.wait(tasks, timeout=10)
        for task in pending:
            task.cancel()
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                log.error("%s ended with %r", task.get_name(), task.exception())
        # close, not drain: every ack was confirmed and SQL holds the truth, so there is nothing
        # to flush, and draining a pull subscription waits out its drain timeout.
        await nc.close()
        if stop_metrics is not None:
            stop_metrics()
        wiring.close()


def _real_cluster_tasks(
    wiring: Wiring, real: RealFleet, settings: Settings, prefix: str, stop: asyncio.Event
) -> list[asyncio.Task[None]]:
    """Fleet sync, gang start timeout, node inventory and cloud autoscaling, each a periodic step of the dispatcher."""

    async def sync() -> None:
        await sync_due(
            wiring.uow, real.provider_for, prefix, utc_now, settings.fleet_sync_interval, real.inventory_nodes
        )

    async def gang_timeout() -> None:
        await asyncio.to_thread(requeue_stalled_gangs, wiring.uow, prefix, utc_now, settings.gang_start_timeout)

    async def inventory() -> None:
        await real.publish_inventory()

    async def autoscale() -> None:
        await autoscale_once(wiring.uow, real.provider_for, prefix, utc_now, settings.autoscale_cooldown)

    # Fleet sync checks often which clusters are due; each cluster is synced every fleet_sync_interval.
    tick = min(settings.fleet_sync_interval, 1.0)
    tasks = [
        asyncio.create_task(loops.periodic_loop("fleet sync", sync, stop, tick), name="fleet-sync"),
        asyncio.create_task(
            loops.periodic_loop("gang timeout", gang_timeout, stop, settings.gang_timeout_interval),
            name="gang-timeout",
        ),
        asyncio.create_task(
            loops.periodic_loop("inventory", inventory, stop, settings.fleet_sync_interval), name="inventory"
        ),
    ]
    if settings.autoscale:
        tasks.append(
            asyncio.create_task(
                loops.periodic_loop("autoscale", autoscale, stop, settings.autoscale_interval), name="autoscale"
            )
        )
    return tasks
