"""The composition root: the only module that picks adapters and wires them to the service layer."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import hashlib
import logging
import socket
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import uvicorn
from sqlalchemy import Engine, text

from adapters.clouds import build_provider
from adapters.dcgm.consumer import JetStreamTelemetrySource
from adapters.files import private_dir, private_sqlite, write_private
from adapters.kubernetes import (
    KubernetesCluster,
    KubeSettings,
    ManifestError,
    PodStatusWatcher,
    configuration_for,
)
from adapters.kubernetes.nodes import observe_node
from adapters.kubernetes.reserved import reserved_by_node
from adapters.kubernetes.status import list_live_pod_objects, list_node_objects
from adapters.nats import secrets as nats_secrets
from adapters.nats.callout import AuthCallout
from adapters.nats.connection import INBOUND_ID_HEADER, JetStreamPublisher, connect
from adapters.nats.consumer_stats import consumer_backlogs
from adapters.nats.inbound import JetStreamInbound
from adapters.nats.server import NatsClusterMember, NatsServerProcess
from adapters.nats.topology import as_json as topology_json
from adapters.nats.topology import ensure_topology
from adapters.prometheus import FleetCollector, PrometheusMetrics, exposition, new_registry, serve_metrics
from adapters.sim.cluster import SimCluster
from adapters.sim.fleet import default_fleet
from adapters.sql.engine import make_engine, make_session_factory
from adapters.sql.gauges_repo import SqlFleetGauges
from adapters.sql.migrate import upgrade_to_head
from adapters.sql.uow import SqlUnitOfWork
from controlplane.api.app import create_app
from controlplane.api.context import ApiContext
from controlplane.config import Settings
from controlplane.service import admin, nats_identity
from controlplane.service.autoscale import autoscale_once
from controlplane.service.cloud_ports import CloudProvider, ClusterLocator, UnsafeKubeconfig, validate_user_kubeconfig
from controlplane.service.cloud_state import CloudClusterRecord
from controlplane.service.cluster_status import PodReport
from controlplane.service.commands import ClusterSpec
from controlplane.service.fleet_sync import locator_of, sync_due
from controlplane.service.gang_timeout import requeue_stalled_gangs, requeue_undispatched
from controlplane.service.inventory import InventoryNode, InventoryReport, inventory_msg_id, inventory_subject
from controlplane.service.kubeconfigs import FileKubeconfigStore
from controlplane.service.metered_cloud import metered
from controlplane.service.metrics import NO_METRICS, Metrics
from controlplane.service.ports import ClusterDriver, EventPublisher, PermanentDispatchError, RunOrder, UnitOfWork
from controlplane.service.scheduling import lease_gap
from controlplane.workers import loops
from controlplane.workers.dispatch_loop import DISPATCHER_LEASE, dispatcher_loop
from controlplane.workers.idle_loop import idle_loop
from controlplane.workers.ingest_loop import ingest_loop
from controlplane.workers.relay_loop import relay_loop
from controlplane.workers.report_loop import report_loop
from controlplane.workers.scheduler_loop import scheduler_loop
from controlplane.workers.telemetry_loop import metered_telemetry, telemetry_loop

log = logging.getLogger(__name__)
COMPONENTS = ("api", "scheduler", "dispatcher", "ingest", "relay")
# How often the ingest process asks the broker how far behind its durable consumers are.
CONSUMER_BACKLOG_SECONDS = 10.0

__all__ = [
    "INBOUND_ID_HEADER",
    "NatsClusterMember",
    "NatsServerProcess",
    "Settings",
    "Wiring",
    "connect",
    "loops",
    "migrate",
    "nats_secrets",
    "run_components",
    "topology_json",
    "utc_now",
]


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass
class Wiring:
    settings: Settings
    engine: Engine = field(init=False)

    def __post_init__(self) -> None:
        url = self.settings.effective_database_url
        if url.startswith("sqlite"):
            private_dir(self.settings.state_dir)
            private_sqlite(url)
        self.engine = make_engine(url)
        self._sessions = make_session_factory(self.engine)

    def uow(self) -> UnitOfWork:
        return SqlUnitOfWork(self._sessions)

    def database_ready(self) -> str | None:
        with self.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        return None

    def close(self) -> None:
        self.engine.dispose()


def migrate(settings: Settings) -> None:
    if settings.effective_database_url.startswith("sqlite"):
        private_dir(settings.state_dir)
        private_sqlite(settings.effective_database_url)
    upgrade_to_head(settings.effective_database_url)


def register_default_fleet(wiring: Wiring) -> int:
    """Register the simulated four-cluster fleet on an installation that has no clusters yet."""
    if admin.list_clusters(wiring.uow()):
        return 0
    for spec in default_fleet():
        admin.create_cluster(wiring.uow(), ClusterSpec.model_validate(spec), "bootstrap", utc_now())
    return len(default_fleet())


class _EmbeddedServer(uvicorn.Server):
    """uvicorn inside a process that owns its signals: it stops when told, not on its own."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class SimFleet:
    """Simulated clusters for every registered `sim` cluster, created as clusters appear. Each
    publishes DCGM telemetry every `telemetry_interval` seconds (None: none), except while the file
    `<state dir>/sim/<cluster>.telemetry-off` exists (its agent is "down")."""

    def __init__(
        self,
        wiring: Wiring,
        publisher: JetStreamPublisher,
        prefix: str,
        start_delay: float,
        telemetry_interval: float | None = None,
    ) -> None:
        self.wiring = wiring
        self.publisher = publisher
        self.prefix = prefix
        self.start_delay = start_delay
        self.telemetry_interval = telemetry_interval
        self.clusters: dict[str, SimCluster] = {}
        self.active = False
        # One connection per simulated cluster for the process's life, reused across lease terms.
        self.own_connections: dict[str, ClusterConnection] = {}
        self._retired: list[ClusterConnection] = []  # replaced by a new credential, closed at the end

    def set_active(self, active: bool) -> None:
        """Only the dispatcher holding the lease drives the simulated clusters (their state files are
        shared, locked stores, so a deposed holder that has not yet noticed does no harm)."""
        self.active = active
        self.clusters = {}
        if active:
            self.refresh()

    def _publisher_for(self, cluster: str) -> EventPublisher:
        """With NATS authentication on, a simulated cluster is a cluster agent like any other: its own
        connection with its own credential (kept in a 0600 file of the state dir, issued on first use)."""
        if self.wiring.settings.nats_secrets_file is None:
            return self.publisher
        path = self.wiring.settings.state_dir / "sim" / f"{cluster}.nats-credential"
        # Issued on first use, and again for a cluster that has none (deleted and registered anew);
        # a revoked one is left revoked: the simulated agent then stays out, like a real one.
        if not path.exists() or not nats_identity.list_cluster_credentials(self.wiring.uow(), cluster):
            _, raw = nats_identity.rotate_cluster_credential(self.wiring.uow(), cluster, "sim-fleet", utc_now())
            write_secret(path, raw)
        credential = path.read_text().strip()
        connection = self.own_connections.get(cluster)
        if connection is None or connection.credential != credential:
            if connection is not None:
                self._retired.append(connection)
            connection = ClusterConnection(self.wiring.settings.nats_url, cluster, credential)
            self.own_connections[cluster] = connection
        return connection

    def refresh(self) -> None:
        self._adopt(self._sim_cluster_names())

    def _sim_cluster_names(self) -> list[str]:
        return [view.name for view in admin.list_clusters(self.wiring.uow()) if view.provider == "sim"]

    def _adopt(self, names: list[str]) -> None:
        for name in names:
            if name not in self.clusters:
                self.clusters[name] = SimCluster(
                    name=name,
                    publish=self._publisher_for(name).publish,
                    prefix=self.prefix,
                    state_file=self.wiring.settings.state_dir / "sim" / f"{name}.json",
                    start_delay=self.start_delay,
                    telemetry_interval=self.telemetry_interval,
                    telemetry_switch=self.wiring.settings.state_dir / "sim" / f"{name}.telemetry-off",
                )

    def drivers(self) -> Mapping[str, ClusterDriver]:
        return self.clusters

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                if not self.active:
                    await loops.sleep_or_stop(stop, 0.2)
                    continue
                names = await asyncio.to_thread(self._sim_cluster_names)
                if self.active:  # the lease may have moved while the database was read
                    self._adopt(names)
            except Exception:
                log.exception("simulated fleet refresh failed")
            for cluster in list(self.clusters.values()):
                # One cluster whose reports fail (its credential revoked, say) stops no other.
                try:
                    await cluster.tick()
                    await cluster.emit_telemetry()
                    await cluster.emit_inventory()
                except Exception:
                    log.exception("simulated cluster %s tick failed", cluster.name)
            await loops.sleep_or_stop(stop, 0.2)
        for connection in [*self.own_connections.values(), *self._retired]:
            await connection.close()


class ClusterConnection:
    """`EventPublisher` for one cluster agent: its own NATS connection, authenticated by its cluster
    credential, opened on first use. Messages carry their id in `Gpufleet-Msg-Id` (see topology)."""

    def __init__(self, url: str, cluster: str, credential: str) -> None:
        self.url, self.cluster, self.credential = url, cluster, credential
        self._nc: Any = None
        self._js: Any = None

    async def publish(self, subject: str, payload: bytes, msg_id: str) -> None:
        if self._nc is not None and self._nc.is_closed:  # refused for good (revoked): try afresh next time
            self._nc = self._js = None
        if self._js is None:
            self._nc = await connect(
                self.url,
                f"gpufleet-sim-{self.cluster}",
                token=self.credential,
                inbox_prefix=nats_identity.cluster_grant("", self.cluster, "").inbox_prefix,
            )
            self._js = self._nc.jetstream()
        await self._js.publish(subject, payload, timeout=5.0, headers={INBOUND_ID_HEADER: msg_id})

    async def close(self) -> None:
        if self._nc is not None:
            await self._nc.close()


class _CloudCredentials:
    """A cloud cluster's Kubernetes credentials, in memory only, renewed `margin` before they expire.

    Installed as the client configuration's `refresh_api_key_hook`, which the Kubernetes client calls
    before every request (always in a worker thread), so a long-lived driver never sends a stale token.
    """

    def __init__(
        self,
        provider: CloudProvider,
        locator: ClusterLocator,
        margin: float,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.provider, self.locator, self.margin, self.clock = provider, locator, timedelta(seconds=margin), clock
        self._lock = threading.Lock()
        self.renewals = 0
        self._renew()

    def _renew(self) -> None:
        self.access = self.provider.credentials(self.locator)
        # A token that lives less than twice the margin (OKE's: 4 minutes, against a 5-minute
        # default) would be renewed before every request, each a cloud API call: renew it half-way.
        lifetime = self.access.expires_at - self.clock()
        self._renew_before = min(self.margin, lifetime / 2)

    def hook(self, cfg: Any) -> None:
        with self._lock:
            if self.access.expires_within(self._renew_before, self.clock()):
                self._renew()
                self.renewals += 1
            cfg.api_key = {"authorization": self.access.token}


class _KubeDriver:
    """The dispatcher's view of a `KubernetesCluster`: invalid manifests are permanent failures."""

    def __init__(self, cluster: KubernetesCluster) -> None:
        self.cluster = cluster

    async def apply(self, order: RunOrder) -> bool:
        try:
            return await self.cluster.apply(order)
        except ManifestError as exc:
            raise PermanentDispatchError(str(exc)) from exc

    async def delete(self, run_id: str) -> bool:
        return await self.cluster.delete(run_id)

    async def list_owned(self) -> set[str]:
        return await self.cluster.list_owned()


class RealFleet:
    """Kubernetes drivers and pod watchers for every registered non-simulated cluster.

    A cloud cluster gets its driver once fleet sync has discovered it; its credentials come from the
    cloud provider and are renewed before they expire. A `kubernetes` cluster is reached with the
    kubeconfig stored in the state dir. Every watcher publishes `PodReport`s on
    `<prefix>.cluster.<name>.pods`, which the ingest path folds into run state.
    """

    def __init__(
        self,
        wiring: Wiring,
        publisher: EventPublisher,
        prefix: str,
        providers: Mapping[str, CloudProvider] | None = None,
        metrics: Metrics = NO_METRICS,
    ) -> None:
        self.wiring = wiring
        self.settings = wiring.settings
        self.publisher = publisher
        self.prefix = prefix
        self.metrics = metrics
        self._providers: dict[str, CloudProvider] = {k: metered(v, metrics) for k, v in (providers or {}).items()}
        self._provider_lock = threading.Lock()
        self.kubeconfigs = FileKubeconfigStore(self.settings.state_dir / "kubeconfigs")
        self.clusters: dict[str, KubernetesCluster] = {}
        self.credentials: dict[str, _CloudCredentials] = {}
        self.watchers: dict[str, tuple[PodStatusWatcher, asyncio.Task[None]]] = {}
        self.errors: dict[str, str] = {}
        self.pool_label_keys: dict[str, str | None] = {}

    def provider_for(self, name: str) -> CloudProvider:
        with self._provider_lock:
            if name not in self._providers:
                built = build_provider(name, **self.settings.cloud_endpoints.get(name, {}))
                self._providers[name] = metered(built, self.metrics)
            return self._providers[name]

    def _configuration(self, record: CloudClusterRecord) -> Any:
        override = self.settings.kube_api_override
        if record.provider == "kubernetes":
            host, token, ca = _from_kubeconfig(self.kubeconfigs.read(record.kubeconfig_ref))
        else:
            source = _CloudCredentials(
                self.provider_for(record.provider), locator_of(record), self.settings.credential_refresh_margin
            )
            self.credentials[record.name] = source
            host, token, ca = source.access.host, source.access.token, source.access.ca_data
        host = override or host
        cfg = configuration_for(host, token, verify_ssl=not host.startswith("http://"))
        if ca and not override:
            cfg.ca_cert_data = base64.b64decode(ca).decode()
        if record.provider != "kubernetes":
            cfg.refresh_api_key_hook = self.credentials[record.name].hook  # type: ignore[assignment]
        return cfg

    def refresh(self) -> None:
        """Build drivers for clusters that gained pools; hand every driver its current pools (blocking)."""
        with self.wiring.uow() as uow:
            records = uow.cloud.real_clusters()
            clusters, _ = uow.admin.fleet()
        pools = {c.name: {p.name: p for p in c.pools} for c in clusters}
        known = {f.name for f in dataclasses.fields(KubeSettings)}  # not e.g. INVENTORY_MARK or pool_label_key
        for record in records:
            # Every real cluster gets its client before it has pools: its nodes are what make them.
            driver = self.clusters.get(record.name)
            try:
                settings = KubeSettings(**{k: v for k, v in record.kube_settings.items() if k in known})
            except Exception as exc:  # stored before a rule was added; dispatch reports it
                self.errors[record.name] = f"{type(exc).__name__}: {exc}"
                continue
            key = record.kube_settings.get("pool_label_key")
            self.pool_label_keys[record.name] = key if isinstance(key, str) else None
            if driver is not None:
                driver.update_pools(pools.get(record.name, {}))
                driver.settings = settings  # PATCHed settings apply from the next dispatch on
                continue
            try:
                cfg = self._configuration(record)
            except Exception as exc:  # the cluster stays without a driver; dispatch reports it
                self.errors[record.name] = f"{type(exc).__name__}: {exc}"
                log.warning("no driver for cluster %s: %s", record.name, self.errors[record.name])
                continue
            self.errors.pop(record.name, None)
            self.clusters[record.name] = KubernetesCluster(record.name, cfg, settings, pools.get(record.name, {}))

    def drivers(self) -> dict[str, ClusterDriver]:
        return {name: _KubeDriver(cluster) for name, cluster in self.clusters.items()}

    def _sink(self, cluster: str) -> Callable[[PodReport], Awaitable[None]]:
        subject = f"{self.prefix}.cluster.{cluster}.pods"

        async def publish(report: PodReport) -> None:
            payload = report.encode()  # trimmed to fit one NATS message, however large the gang
            digest = hashlib.sha256(payload).hexdigest()[:16]
            await self.publisher.publish(subject, payload, f"{cluster}:{report.run_id}:{digest}")

        return publish

    def start_watchers(self) -> None:
        for name, cluster in self.clusters.items():
            if name in self.watchers:
                continue
            watcher = PodStatusWatcher(cluster.configuration, cluster.settings.namespace, self._sink(name))
            self.watchers[name] = (watcher, asyncio.create_task(watcher.run(), name=f"pods-{name}"))

    async def inventory_nodes(self, record: CloudClusterRecord) -> list[InventoryNode] | None:
        """The cluster's nodes in inventory terms, or None while it has no API client."""
        cluster = self.clusters.get(record.name)
        if cluster is None:
            return None
        key = record.kube_settings.get("pool_label_key")
        return await self._observe(record.name, cluster.api_client, key if isinstance(key, str) else None)

    async def _observe(self, name: str, api: Any, pool_label_key: str | None) -> list[InventoryNode]:
        """The cluster's nodes, each with what pods gpufleet did not place request of it. A cluster
        whose pods cannot be listed (RBAC of an older member deploy) is planned on bare allocatable,
        with a warning, rather than not at all."""
        nodes = [observe_node(n, pool_label_key) for n in await list_node_objects(api)][:10_000]
        try:
            reserved = reserved_by_node(await list_live_pod_objects(api))
        except Exception as exc:
            log.warning(
                "cluster %s: pods not listed (%s); its pools are planned without what other pods request", name, exc
            )
            return nodes
        return [n.model_copy(update={"reserved": reserved.get(n.name, {})}) for n in nodes]

    async def publish_inventory(self) -> int:
        """Publish one `InventoryReport` per cluster with a client; returns the reports published."""
        sent = 0
        for name, cluster in list(self.clusters.items()):
            try:
                nodes = await self._observe(name, cluster.api_client, self.pool_label_keys.get(name))
                report = InventoryReport(observed_at=utc_now(), nodes=nodes)
                await self.publisher.publish(
                    inventory_subject(self.prefix, name),
                    report.model_dump_json().encode(),
                    inventory_msg_id(name, report.observed_at),
                )
                sent += 1
            except Exception as exc:  # one unreachable cluster does not hold up the others
                log.warning("inventory of cluster %s not published: %s", name, exc)
        return sent

    async def run(self, stop: asyncio.Event, interval: float = 1.0) -> None:
        try:
            while not stop.is_set():
                try:
                    await asyncio.to_thread(self.refresh)
                    self.start_watchers()
                except Exception:
                    log.exception("real fleet refresh failed")
                await loops.sleep_or_stop(stop, interval)
        finally:
            await self.close()

    async def close(self) -> None:
        for watcher, task in self.watchers.values():
            watcher.stop()
            task.cancel()
        for _, task in self.watchers.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for watcher, _ in self.watchers.values():
            watcher.close()
        self.watchers.clear()
        for cluster in self.clusters.values():
            cluster.close()
        self.clusters.clear()


def _from_kubeconfig(text: str) -> tuple[str, str, str]:
    """(server, bearer token, CA data) of a stored user kubeconfig's current context (token users only)."""
    document = validate_user_kubeconfig(text)
    contexts = {c.get("name"): c.get("context") or {} for c in document.get("contexts") or []}
    clusters = {c.get("name"): c.get("cluster") or {} for c in document.get("clusters") or []}
    users = {u.get("name"): u.get("user") or {} for u in document.get("users") or []}
    context = contexts.get(document.get("current-context")) or next(iter(contexts.values()), {})
    cluster = clusters.get(context.get("cluster")) or next(iter(clusters.values()))
    user = users.get(context.get("user")) or next(iter(users.values()), {})
    token = user.get("token")
    if not isinstance(token, str) or not token:
        raise UnsafeKubeconfig("kubeconfig user has no bearer token (client certificates are not supported)")
    return str(cluster["server"]), token, str(cluster.get("certificate-authority-data") or "")


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
        extra = [*(extra or []), *(await _serve_auth_callout(settings, secrets, wiring, stop))]
    nc = await connect(
        settings.nats_url,
        name,
        user=secrets.control_user if secrets else None,
        password=secrets.control_password if secrets else None,
    )
    js = nc.jetstream()
    await ensure_topology(js, prefix, settings.nats_replicas)
    publisher = JetStreamPublisher(js)
    inbound_publisher = JetStreamPublisher(js, id_header=INBOUND_ID_HEADER)  # reports as a cluster would send them
    tasks: list[asyncio.Task[None]] = []
    policy = settings.scheduling_policy()
    clock = utc_now
    server: uvicorn.Server | None = None
    registry = new_registry()  # this run's own: two control planes in one process do not mix
    metrics = PrometheusMetrics(registry)
    if "api" in components:  # the API processes export the fleet's SQL gauges (read when scraped)
        registry.register(FleetCollector(SqlFleetGauges(wiring.engine), utc_now, settings.metrics_fleet_interval))
    stop_metrics: Callable[[], None] | None = None
    if "api" in components:
        ctx = ApiContext(
            exposition=lambda: exposition(registry),
            metrics=metrics,
            uow_factory=wiring.uow,
            subject_prefix=prefix,
            readiness={
                "database": wiring.database_ready,
                "nats": lambda: None if nc.is_connected else "not connected to NATS",
                # A dead scheduler or dispatcher means submits are taken but nothing is admitted
                # or dispatched: not ready until some process holds each lease again.
                "scheduler": lambda: lease_gap(wiring.uow, "scheduler", utc_now()),
                "dispatcher": lambda: lease_gap(wiring.uow, DISPATCHER_LEASE, utc_now()),
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
                report_loop(wiring.uow, prefix, clock, stop, lease_ttl=settings.lease_ttl), name="reports"
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
                    wiring.uow, publisher, clock, stop, settings.relay_interval, settings.lease_ttl, metrics=metrics
                ),
                name="relay",
            )
        )
    if "ingest" in components:
        source = JetStreamInbound(js, prefix)
        tasks.append(asyncio.create_task(ingest_loop(source, wiring.uow, prefix, clock, stop, metrics), name="ingest"))
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
                stop_metrics = serve_metrics(registry, settings.metrics_host, settings.metrics_port)
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


async def _serve_auth_callout(
    settings: Settings, secrets: nats_secrets.NatsSecrets, wiring: Wiring, stop: asyncio.Event
) -> list[Awaitable[None]]:
    """Answer the server's authorization requests, and kick connections of revoked credentials."""
    prefix = settings.subject_prefix
    callout = AuthCallout(
        secrets.issuer,
        authorize=lambda secret: nats_identity.grant_for(wiring.uow(), secret, prefix),
        still_valid=lambda ids: nats_identity.still_valid(wiring.uow(), ids),
        ttl=settings.nats_user_ttl,
    )
    auth_nc = await connect(settings.nats_url, "gpufleet-auth-callout", secrets.callout_user, secrets.callout_password)
    system_nc = await connect(settings.nats_url, "gpufleet-revocation", secrets.system_user, secrets.system_password)
    await callout.serve(auth_nc)

    async def sweep() -> None:
        kicked = await callout.sweep(system_nc)
        if kicked:
            log.info("disconnected %d connections of revoked NATS credentials", kicked)

    async def run() -> None:
        try:
            await loops.periodic_loop("nats revocation", sweep, stop, settings.nats_revocation_sweep)
        finally:
            await auth_nc.close()
            await system_nc.close()

    return [run()]


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


def write_secret(path: Path, value: str) -> None:
    """A token file: 0600 in a 0700 directory, also when an older one was readable by others."""
    write_private(path, value + "\n")
