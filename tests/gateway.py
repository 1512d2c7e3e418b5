"""The inbound gateway for tests that publish as a sender would over the control plane's own
connection and run ingest by itself (without `run_components`, which starts the gateway)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import nats
from nats.aio.client import Client

from adapters.nats.gateway import InboundGateway


@asynccontextmanager
async def inbound_gateway(nc: Client, prefix: str) -> AsyncIterator[InboundGateway]:
    """Without NATS authentication (these tests' server), so replies are not confined."""
    gateway = InboundGateway(nc, prefix, confine_replies=False)
    await gateway.start()
    try:
        yield gateway
    finally:
        await gateway.stop()


@contextmanager
def inbound_gateway_thread(url: str, prefix: str) -> Iterator[None]:
    """The gateway on its own connection and event loop in a thread, for tests that run a
    synchronous command (a CLI) that publishes as a sender."""
    ready, stop = threading.Event(), threading.Event()
    failure: list[BaseException] = []

    async def serve() -> None:
        nc = await nats.connect(url)
        try:
            async with inbound_gateway(nc, prefix):
                ready.set()
                while not stop.is_set():
                    await asyncio.sleep(0.05)
        finally:
            await nc.close()

    def run() -> None:
        try:
            asyncio.run(serve())
        except BaseException as exc:  # reported to the test below
            failure.append(exc)
            ready.set()

    thread = threading.Thread(target=run, name="inbound-gateway", daemon=True)
    thread.start()
    ready.wait(30)
    if failure:
        raise failure[0]
    try:
        yield
    finally:
        stop.set()
        thread.join(30)
