"""NATS connections that reconnect forever and JetStream publishing with de-duplication ids."""

from __future__ import annotations

import logging
from collections.abc import Callable

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext

from adapters.nats.dead_letters import max_payload_of, publish_dead_letter
from adapters.nats.sizes import MessageTooLarge, check_fits
from controlplane.service.messaging_ports import Undeliverable

log = logging.getLogger(__name__)
# Inbound messages (agents, submitters) carry their id here. The control plane's inbound gateway
# scopes it to the sender before JetStream sees it (`Nats-Msg-Id: <sender>/<id>`), and the ingest
# inbox de-duplicates per sender too, so no sender can have another's message dropped.
INBOUND_ID_HEADER = "Gpufleet-Msg-Id"


class ResilientClient(Client):
    """The control plane's own connections: an error the server sends (`-ERR`) reopens the
    connection instead of closing it for good.

    nats-py closes a connection for ever on any `-ERR` but a stale connection or a permission
    error (a maximum payload violation, a slow consumer, an authorization error while the
    server's config is being replaced), and the control plane would then stay off NATS until it
    is restarted. Its connections must come back like after any network fault: the reconnect
    loop retries for ever, restores the subscriptions, and `is_connected` (readiness) is false
    meanwhile."""

    async def _process_err(self, err_msg: str) -> None:
        if "permissions violation" in err_msg.lower():
            await super()._process_err(err_msg)  # the server keeps the connection open
            return
        log.warning("nats server error %s: reopening the connection", err_msg.strip())
        await self._process_op_err(nats.errors.Error(f"nats: {err_msg.strip()}"))


async def connect(
    url: str,
    name: str,
    user: str | None = None,
    password: str | None = None,
    token: str | None = None,
    inbox_prefix: str = "_INBOX",
    resilient: bool = False,
) -> Client:
    """`url`: one server, or the servers of a cluster separated by commas. `token` is a gpufleet
    credential (auth callout); `inbox_prefix` must then be the identity's own
    (`_INBOX.<kind>-<name>`), the only inboxes it may subscribe to. `resilient`: reopen the
    connection on a server error too (the control plane's own users; see `ResilientClient`)."""

    async def on_error(exc: Exception) -> None:
        log.warning("nats %s: %s", name, exc)

    async def on_disconnect() -> None:
        # nats-py calls this on our own close() too: only a lost connection is worth a warning.
        if client.is_closed:
            log.debug("nats %s: closed", name)
        else:
            log.warning("nats %s: disconnected", name)

    async def on_reconnect() -> None:
        log.info("nats %s: reconnected", name)

    client = ResilientClient() if resilient else Client()
    await client.connect(
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
    return client


def server_list(url: str) -> list[str]:
    """The servers of `GPUFLEET_NATS_URL`: nats-py takes a list, not a comma-separated string."""
    servers = [part.strip() for part in url.split(",") if part.strip()]
    if not servers:
        raise ValueError("no NATS server URL given")
    return servers


class JetStreamPublisher:
    """`EventPublisher` (and `DeadLetters`) over JetStream. A timeout means "unknown": callers retry
    with the same id. A message the server can never take raises `Undeliverable`: one larger than
    its limit is never sent (the server would close the connection), and JetStream's refusal of a
    malformed or oversized message is final. `subject_map` turns the subject the caller names into
    the one to publish on."""

    def __init__(
        self,
        js: JetStreamContext,
        timeout: float = 5.0,
        id_header: str = "Nats-Msg-Id",
        subject_map: Callable[[str], str] | None = None,
    ) -> None:
        self.js = js
        self.timeout = timeout
        self.id_header = id_header
        self.subject_map = subject_map

    async def publish(self, subject: str, payload: bytes, msg_id: str) -> None:
        headers = {self.id_header: msg_id}
        target = self.subject_map(subject) if self.subject_map else subject
        try:
            check_fits(payload, headers, max_payload_of(self.js))
            await self.js.publish(target, payload, timeout=self.timeout, headers=headers)
        except (MessageTooLarge, nats.errors.MaxPayloadError, nats.errors.BadSubjectError) as exc:
            raise Undeliverable(str(exc) or type(exc).__name__) from exc
        except nats.js.errors.APIError as exc:
            if exc.code in _FINAL_REFUSALS:
                raise Undeliverable(f"JetStream refused it: {exc.description} ({exc.code})") from exc
            raise

    async def dead_letter(self, subject: str, payload: bytes, msg_id: str, reason: str) -> None:
        prefix = subject.split(".", 1)[0]
        await publish_dead_letter(self.js, prefix, subject, payload, msg_id, reason)


# JetStream's answers that no retry can change: a bad request (e.g. a message above the stream's
# maximum size) and a payload too large. 503 (no stream leader) or a timeout are transient.
_FINAL_REFUSALS = (400, 413)
