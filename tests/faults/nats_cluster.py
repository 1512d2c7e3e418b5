"""A JetStream cluster of real nats-servers on this machine, for the scale-out tests.

Each member is a `NatsServerProcess` with a `NatsClusterMember` config (its own client and route
port, every member's route), with gpufleet's authentication (fixed users and auth callout) when
`auth` is given: the same accounts and callout issuer on every server, as in production.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import nats
import nats.errors

from adapters.nats.server import NatsClusterMember, NatsServerAuth, NatsServerProcess, free_port


class NatsCluster:
    def __init__(self, workdir: Path, size: int = 3, auth: NatsServerAuth | None = None) -> None:
        route_ports = [free_port() for _ in range(size)]
        routes = tuple(f"nats-route://127.0.0.1:{p}" for p in route_ports)
        self.auth = auth
        self.servers = {
            f"n{i}": NatsServerProcess(
                free_port(),
                workdir / f"n{i}",
                log_file=workdir / f"n{i}.log",
                auth=auth,
                member=NatsClusterMember(f"n{i}", route_ports[i], routes, cluster="faults"),
            )
            for i in range(size)
        }

    @property
    def url(self) -> str:
        """Every member, comma-separated, as `GPUFLEET_NATS_URL` takes them."""
        return ",".join(s.url for s in self.servers.values())

    def start(self, timeout: float = 60.0) -> None:
        for server in self.servers.values():
            server.start()
        self.wait_for_jetstream(timeout)

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop(kill=True)

    def kill(self, name: str) -> None:
        server = self.servers[name]
        server.stop(kill=True)
        assert server.process is not None
        server.process.wait(10)

    def live(self) -> list[str]:
        return [n for n, s in self.servers.items() if s.process is not None and s.process.poll() is None]

    def credentials(self) -> dict[str, str]:
        """The control plane's user on an authenticated cluster (it alone may use the JetStream API)."""
        if self.auth is None:
            return {}
        return {"user": self.auth.control_user, "password": self.auth.control_password}

    def live_url(self) -> str:
        return ",".join(self.servers[n].url for n in self.live())

    def wait_for_jetstream(self, timeout: float) -> None:
        """Until the JetStream meta group has a leader (the cluster can create streams)."""

        async def ready() -> bool:
            nc = await nats.connect(self.live_url().split(","), connect_timeout=2, **self.credentials())
            try:
                await nc.jetstream().account_info()
                return True
            except nats.errors.Error:
                return False
            finally:
                with contextlib.suppress(Exception):
                    await nc.close()

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                if asyncio.run(ready()):
                    return
            time.sleep(0.3)
        raise AssertionError(f"the JetStream cluster had no meta leader within {timeout:.0f} s")
