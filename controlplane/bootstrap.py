"""The composition root: the only module that picks adapters and wires them to the service layer."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import uvicorn
from sqlalchemy import Engine, text

from adapters.nats.connection import JetStreamPublisher, connect
from adapters.nats.inbound import JetStreamInbound
from adapters.nats.server import NatsServerProcess
from adapters.nats.topology import as_json as topology_json
from adapters.nats.topology import ensure_topology
from adapters.sim.cluster import SimCluster
from adapters.sim.fleet import default_fleet
from adapters.sql.engine import make_engine, make_session_factory
from adapters.sql.migrate import upgrade_to_head
from adapters.sql.uow import SqlUnitOfWork
from controlplane.api.app import create_app
from controlplane.api.context import ApiContext
from controlplane.config import Settings
from controlplane.service import admin
from controlplane.service.commands import ClusterSpec
from controlplane.service.ports import ClusterDriver, UnitOfWork
from controlplane.workers import loops

log = logging.getLogger(__name__)
COMPONENTS = ("api", "scheduler", "dispatcher", "ingest", "relay")

__all__ = [
    "NatsServerProcess",
    "Settings",
    "Wiring",
    "connect",
    "loops",
    "migrate",
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
            self.settings.state_dir.mkdir(parents=True, exist_ok=True)
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
        settings.state_dir.mkdir(parents=True, exist_ok=True)
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
    """Simulated clusters for every registered `sim` cluster, created as clusters appear."""

    def __init__(self, wiring: Wiring, publisher: JetStreamPublisher, prefix: str, start_delay: float) -> None:
        self.wiring = wiring
        self.publisher = publisher
        self.prefix = prefix
        self.start_delay = start_delay
        self.clusters: dict[str, SimCluster] = {}

    def refresh(self) -> None:
        for view in admin.list_clusters(self.wiring.uow()):
            if view.provider == "sim" and view.name not in self.clusters:
                self.clusters[view.name] = SimCluster(
                    name=view.name,
                    publish=self.publisher.publish,
                    prefix=self.prefix,
                    state_file=self.wiring.settings.state_dir / "sim" / f"{view.name}.json",
                    start_delay=self.start_delay,
                )

    def drivers(self) -> Mapping[str, ClusterDriver]:
        return self.clusters

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await asyncio.to_thread(self.refresh)
                for cluster in list(self.clusters.values()):
                    await cluster.tick()
            except Exception:
                log.exception("simulated fleet tick failed")
            await loops.sleep_or_stop(stop, 0.2)


async def run_components(
    settings: Settings,
    components: tuple[str, ...],
    stop: asyncio.Event,
    extra: list[Any] | None = None,
) -> None:
    """Run the named components in this event loop until `stop` is set."""
    wiring = Wiring(settings)
    prefix = settings.subject_prefix
    nc = await connect(settings.nats_url, f"gpufleet-{'+'.join(components)}")
    js = nc.jetstream()
    await ensure_topology(js, prefix)
    publisher = JetStreamPublisher(js)
    tasks: list[asyncio.Task[None]] = []
    policy = settings.scheduling_policy()
    clock = utc_now
    server: uvicorn.Server | None = None
    if "api" in components:
        ctx = ApiContext(
            uow_factory=wiring.uow,
            subject_prefix=prefix,
            readiness={
                "database": wiring.database_ready,
                "nats": lambda: None if nc.is_connected else "not connected to NATS",
            },
        )
        config = uvicorn.Config(
            create_app(ctx), host=settings.api_host, port=settings.api_port, log_level="warning", lifespan="off"
        )
        server = _EmbeddedServer(config)
        tasks.append(asyncio.create_task(server.serve(), name="api"))
    if "scheduler" in components:
        tasks.append(
            asyncio.create_task(
                loops.scheduler_loop(
                    wiring.uow,
                    policy,
                    prefix,
                    clock,
                    stop,
                    settings.scheduler_interval,
                    settings.lease_ttl,
                    settings.check_invariants,
                ),
                name="scheduler",
            )
        )
    if "dispatcher" in components:
        fleet = SimFleet(wiring, publisher, prefix, settings.sim_start_delay)
        await asyncio.to_thread(fleet.refresh)
        tasks.append(asyncio.create_task(fleet.run(stop), name="sim-fleet"))
        tasks.append(
            asyncio.create_task(
                loops.dispatcher_loop(
                    wiring.uow,
                    fleet.drivers,
                    prefix,
                    clock,
                    stop,
                    settings.dispatcher_interval,
                    settings.orphan_gc_interval,
                ),
                name="dispatcher",
            )
        )
    if "relay" in components:
        tasks.append(
            asyncio.create_task(
                loops.relay_loop(wiring.uow, publisher, clock, stop, settings.relay_interval), name="relay"
            )
        )
    if "ingest" in components:
        source = JetStreamInbound(js, prefix)
        tasks.append(asyncio.create_task(loops.ingest_loop(source, wiring.uow, prefix, clock, stop), name="ingest"))
    for coroutine in extra or []:
        tasks.append(asyncio.create_task(coroutine))
    try:
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
        wiring.close()


def write_secret(path: Path, value: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600, exist_ok=True)
    path.write_text(value + "\n")
