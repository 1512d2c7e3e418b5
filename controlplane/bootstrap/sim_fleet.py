"""The simulated clusters a dispatcher drives (`SimFleet`) and the per-cluster NATS connection a
simulated cluster agent publishes with (`ClusterConnection`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from adapters.nats.connection import INBOUND_ID_HEADER, JetStreamPublisher, connect
from adapters.sim.cluster import SimCluster
from controlplane.bootstrap.wiring import Wiring, utc_now, write_secret
from controlplane.service import admin, nats_identity
from controlplane.service.ports import ClusterDriver, EventPublisher
from controlplane.workers import loops

log = logging.getLogger(__name__)


# Seconds between looks at which `sim` clusters are registered (and the longest the loop sleeps).
REFRESH_SECONDS = 1.0


class SimFleet:
    """Simulated clusters for every registered `sim` cluster, created as clusters appear. Each
    publishes DCGM telemetry every `telemetry_interval` seconds (None: none), except while the file
    `<state dir>/sim/<cluster>.telemetry-off` exists (its agent is "down").

    The loop reacts to events: it sleeps until the first cluster has something due (`next_due`) or
    the dispatcher creates or deletes a run (`on_change`), not on a fixed tick; so a pod report
    leaves when the pods change phase."""

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
        self._woken = asyncio.Event()

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
                    on_change=self._woken.set,
                )

    def drivers(self) -> Mapping[str, ClusterDriver]:
        return self.clusters

    async def _step(self, cluster: SimCluster) -> float:
        """Send what `cluster` has due; returns the seconds until it next has something due. One
        cluster whose reports fail (its credential revoked, say) stops no other."""
        try:
            await cluster.tick()
            await cluster.emit_telemetry()
            await cluster.emit_inventory()
            return cluster.next_due() - cluster.clock()
        except Exception:
            log.exception("simulated cluster %s tick failed", cluster.name)
            return REFRESH_SECONDS

    async def _wait(self, stop: asyncio.Event) -> None:
        woken, stopped = asyncio.ensure_future(self._woken.wait()), asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait((woken, stopped), return_when=asyncio.FIRST_COMPLETED)
        finally:
            woken.cancel()
            stopped.cancel()

    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        next_refresh = loop.time()
        while not stop.is_set():
            try:
                if not self.active:
                    await loops.sleep_or_stop(stop, 0.2)
                    continue
                if loop.time() >= next_refresh:
                    next_refresh = loop.time() + REFRESH_SECONDS
                    names = await asyncio.to_thread(self._sim_cluster_names)
                    if self.active:  # the lease may have moved while the database was read
                        self._adopt(names)
            except Exception:
                log.exception("simulated fleet refresh failed")
            self._woken.clear()
            due = [await self._step(cluster) for cluster in list(self.clusters.values())]
            # Until the first cluster has something due, a run is created or deleted, or the refresh.
            pause = min([next_refresh - loop.time(), *due])
            if pause > 0 and not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wait(stop), timeout=pause)
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
