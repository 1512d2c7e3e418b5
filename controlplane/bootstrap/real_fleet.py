"""Kubernetes drivers and pod watchers for the registered real clusters (`RealFleet`), with the
cloud credentials they renew and the stored kubeconfigs they read."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import hashlib
import logging
import threading
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from adapters.clouds import build_provider
from adapters.kubernetes import (
    KubernetesCluster,
    KubeSettings,
    ManifestError,
    PodStatusWatcher,
    configuration_for,
)
from adapters.kubernetes.cluster_reads import list_live_pod_objects, list_node_objects
from adapters.kubernetes.nodes import observe_node
from adapters.kubernetes.reserved import non_gpu_pods_by_node, reserved_by_node
from controlplane.bootstrap.wiring import Wiring, utc_now
from controlplane.service.cloud_ports import CloudProvider, ClusterLocator, UnsafeKubeconfig, validate_user_kubeconfig
from controlplane.service.cloud_state import CloudClusterRecord
from controlplane.service.cluster_status import PodReport
from controlplane.service.fleet_sync import locator_of
from controlplane.service.inventory import InventoryNode, InventoryReport, inventory_msg_id, inventory_subject
from controlplane.service.inventory_node import NonGpuPods
from controlplane.service.kubeconfigs import FileKubeconfigStore
from controlplane.service.metered_cloud import metered
from controlplane.service.metrics import NO_METRICS, Metrics
from controlplane.service.ports import ClusterDriver, EventPublisher, PermanentDispatchError, RunOrder
from controlplane.workers import loops

log = logging.getLogger(__name__)


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
            pods = await list_live_pod_objects(api)
        except Exception as exc:
            log.warning(
                "cluster %s: pods not listed (%s); its pools are planned without what other pods request", name, exc
            )
            return nodes
        reserved = reserved_by_node(pods)
        gpu_names = {r for n in nodes for r in n.gpu_resources.values()}
        foreign = non_gpu_pods_by_node(pods, gpu_names)
        return [
            n.model_copy(
                update={
                    "reserved": reserved.get(n.name, {}),
                    "non_gpu_pods": _non_gpu_pods(foreign.get(n.name)) if n.has_gpus else None,
                }
            )
            for n in nodes
        ]

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


def _non_gpu_pods(found: tuple[int, tuple[str, ...]] | None) -> NonGpuPods:
    count, sample = found or (0, ())
    return NonGpuPods(count=count, sample=[name[:317] for name in sample])


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
