"""The ingest component's NATS authorization: it answers auth callout, caps connections per
credential, limits failed authentications per host, and disconnects revoked credentials
(docs/nats-security.md)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable

from adapters.nats import secrets as nats_secrets
from adapters.nats.callout import AuthCallout
from adapters.nats.callout_limits import CalloutLimits, ConnectionTable
from adapters.nats.connection import connect
from adapters.nats.revoker import ConnectionWatch
from controlplane.bootstrap.wiring import Wiring
from controlplane.config import Settings
from controlplane.service import nats_identity
from controlplane.workers import loops

log = logging.getLogger(__name__)


async def serve_auth_callout(
    settings: Settings, secrets: nats_secrets.NatsSecrets, wiring: Wiring, stop: asyncio.Event
) -> list[Awaitable[None]]:
    """Answer the server's authorization requests, and kick connections of revoked credentials."""
    prefix = settings.subject_prefix
    table = ConnectionTable()
    watch = ConnectionWatch(table, still_valid=lambda ids: nats_identity.still_valid(wiring.uow(), ids))
    callout = AuthCallout(
        secrets.issuer,
        authorize=lambda secret: nats_identity.grant_for(wiring.uow(), secret, prefix),
        table=table,
        limits=CalloutLimits(
            per_identity=settings.nats_max_connections_per_identity,
            per_cluster=settings.nats_max_connections_per_cluster,
            failures_per_host=settings.nats_auth_failures_per_host,
            failure_window=settings.nats_auth_failure_window,
        ),
        ttl=settings.nats_user_ttl,
    )
    auth_nc = await connect(
        settings.nats_url, "gpufleet-auth-callout", secrets.callout_user, secrets.callout_password, resilient=True
    )
    system_nc = await connect(
        settings.nats_url, "gpufleet-revocation", secrets.system_user, secrets.system_password, resilient=True
    )
    await watch.start(system_nc)  # the connections open now count against their caps from the first answer
    await callout.serve(auth_nc)

    failing = False

    async def revoke() -> None:
        nonlocal failing
        try:
            kicked = await watch.revoke(system_nc)
        except Exception:
            if not failing:  # every quarter second: said once, until it works again
                log.exception("revocation check failed (SQL or NATS); retrying quietly")
            failing = True
            return
        if failing:
            log.info("revocation check works again")
        failing = False
        if kicked:
            log.info("disconnected %d connections of revoked NATS credentials", kicked)

    async def sweep() -> None:
        await watch.resync(system_nc)
        await revoke()

    async def run() -> None:
        try:
            await asyncio.gather(
                loops.periodic_loop("nats revocation", revoke, stop, settings.nats_revocation_poll),
                loops.periodic_loop("nats connection listing", sweep, stop, settings.nats_revocation_sweep),
            )
        finally:
            await auth_nc.close()
            await system_nc.close()

    return [run()]
