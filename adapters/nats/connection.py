"""NATS connections that reconnect forever and JetStream publishing with de-duplication ids."""

from __future__ import annotations

import logging

import nats
from nats.aio.client import Client
from nats.js import JetStreamContext

log = logging.getLogger(__name__)
# Inbound messages (agents, submitters) carry their id here, not in Nats-Msg-Id: JetStream would
# de-duplicate Nats-Msg-Id across all senders of the stream, so one sender could make the server
# drop another's message by using its id first. The ingest inbox de-duplicates per sender instead.
INBOUND_ID_HEADER = "Gpufleet-Msg-Id"


async def connect(
    url: str,
    name: str,
    user: str | None = None,
    password: str | None = None,
    token: str | None = None,
    inbox_prefix: str = "_INBOX",
) -> Client:
    """`url`: one server, or the servers of a cluster separated by commas. `token` is a gpufleet
    credential (auth callout); `inbox_prefix` must then be the identity's own
    (`_INBOX.<kind>-<name>`), the only inboxes it may subscribe to."""

    async def on_error(exc: Exception) -> None:
        log.warning("nats %s: %s", name, exc)

    async def on_disconnect() -> None:
        log.warning("nats %s: disconnected", name)

    async def on_reconnect() -> None:
        log.info("nats %s: reconnected", name)

    return await nats.connect(
        server_list(url),
        name=name,
        max_reconnect_attempts=-1,  # the default gives up after 60 tries and closes for good
        reconnect_time_wait=1,
        connect_timeout=5,
        error_cb=on_error,
        disconnected_cb=on_disconnect,
        reconnected_cb=on_reconnect,
        user=user,
        password=password,
        token=token,
        inbox_prefix=inbox_prefix,
    )


def server_list(url: str) -> list[str]:
    """The servers of `GPUFLEET_NATS_URL`: nats-py takes a list, not a comma-separated string."""
    servers = [part.strip() for part in url.split(",") if part.strip()]
    if not servers:
        raise ValueError("no NATS server URL given")
    return servers


class JetStreamPublisher:
    """`EventPublisher` over JetStream. A timeout means "unknown": callers retry with the same id."""

    def __init__(self, js: JetStreamContext, timeout: float = 5.0, id_header: str = "Nats-Msg-Id") -> None:
        self.js = js
        self.timeout = timeout
        self.id_header = id_header

    async def publish(self, subject: str, payload: bytes, msg_id: str) -> None:
        await self.js.publish(subject, payload, timeout=self.timeout, headers={self.id_header: msg_id})
