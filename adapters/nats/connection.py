"""NATS connections that reconnect forever and JetStream publishing with de-duplication ids."""

from __future__ import annotations

import logging

import nats
from nats.aio.client import Client
from nats.js import JetStreamContext

log = logging.getLogger(__name__)


async def connect(url: str, name: str) -> Client:
    async def on_error(exc: Exception) -> None:
        log.warning("nats %s: %s", name, exc)

    async def on_disconnect() -> None:
        log.warning("nats %s: disconnected", name)

    async def on_reconnect() -> None:
        log.info("nats %s: reconnected", name)

    return await nats.connect(
        url,
        name=name,
        max_reconnect_attempts=-1,  # the default gives up after 60 tries and closes for good
        reconnect_time_wait=1,
        connect_timeout=5,
        error_cb=on_error,
        disconnected_cb=on_disconnect,
        reconnected_cb=on_reconnect,
    )


class JetStreamPublisher:
    """`EventPublisher` over JetStream. A timeout means "unknown": callers retry with the same id."""

    def __init__(self, js: JetStreamContext, timeout: float = 5.0) -> None:
        self.js = js
        self.timeout = timeout

    async def publish(self, subject: str, payload: bytes, msg_id: str) -> None:
        await self.js.publish(subject, payload, timeout=self.timeout, headers={"Nats-Msg-Id": msg_id})
