"""Which clients are connected, and disconnecting those whose credential is no longer valid.

Through the system account (user `gpufleet-sys`) the control plane
- follows the server's connect and disconnect events of the GPUFLEET account
  (`$SYS.ACCOUNT.GPUFLEET.CONNECT` / `.DISCONNECT`), so the connection table holds every open
  connection of every server, also those another ingest replica authorized;
- re-reads the servers' connection listings (`$SYS.REQ.SERVER.PING.CONNZ`, every server answers)
  at start and every sweep, which adopts connections made before this process started and drops
  any it missed the end of;
- `revoke`: asks SQL which of the connected credentials are still valid and kicks
  (`$SYS.REQ.SERVER.<id>.KICK`) the connections of the others. Run often (a fraction of a second):
  SQL is the one truth every API process writes revocations to, so a token revoked, a cluster
  credential rotated or revoked, or a team or cluster deleted through any process is noticed here.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Sequence

from nats.aio.client import Client
from nats.aio.msg import Msg

from adapters.nats.callout_limits import Connection, ConnectionTable, credential_of
from adapters.nats.server import APP_ACCOUNT

log = logging.getLogger(__name__)
LISTING_TIMEOUT = 2.0  # for the first server's connection listing
LISTING_SETTLE = 0.3  # after it, for the other servers of a cluster
KICK_TIMEOUT = 2.0


class ConnectionWatch:
    def __init__(
        self, table: ConnectionTable, still_valid: Callable[[Sequence[str]], set[str]], account: str = APP_ACCOUNT
    ) -> None:
        self.table = table
        self.still_valid = still_valid
        self.account = account

    async def start(self, system: Client) -> None:
        """Follow connect and disconnect events, then learn what is connected already."""
        await system.subscribe(f"$SYS.ACCOUNT.{self.account}.CONNECT", cb=self._connected)
        await system.subscribe(f"$SYS.ACCOUNT.{self.account}.DISCONNECT", cb=self._disconnected)
        await system.flush()
        await self.resync(system)

    @staticmethod
    def _event(msg: Msg) -> tuple[str, Connection] | None:
        """(credential id, connection) of a connect or disconnect event of a callout user."""
        try:
            event = json.loads(msg.data)
            client, server = event["client"], event["server"]
            credential_id = credential_of(str(client.get("user") or ""))
            if credential_id is None or not isinstance(client.get("id"), int):
                return None
            return credential_id, (str(server["id"]), int(client["id"]))
        except (ValueError, KeyError, TypeError, AttributeError):
            return None

    async def _connected(self, msg: Msg) -> None:
        found = self._event(msg)
        if found is not None:
            self.table.add(*found)

    async def _disconnected(self, msg: Msg) -> None:
        found = self._event(msg)
        if found is not None:
            self.table.remove(found[1])

    async def resync(self, system: Client) -> bool:
        """Replace the table by the servers' connection listings; False if no server answered."""
        since = self.table.clock()
        inbox = system.new_inbox()
        sub = await system.subscribe(inbox)
        listed: dict[Connection, str] = {}
        answers = 0
        try:
            request = {"account": self.account, "auth": True, "limit": 100_000}
            await system.publish("$SYS.REQ.SERVER.PING.CONNZ", json.dumps(request).encode(), reply=inbox)
            timeout = LISTING_TIMEOUT
            while True:
                try:
                    answer = await sub.next_msg(timeout=timeout)
                except Exception:  # nats' timeout: every server that will answer has
                    break
                timeout = LISTING_SETTLE
                try:
                    data = json.loads(answer.data)["data"]
                    server_id, connections = str(data["server_id"]), data.get("connections") or []
                except (ValueError, KeyError, TypeError) as exc:
                    log.info("unreadable connection listing: %s", exc)
                    continue
                answers += 1
                for connection in connections:
                    credential_id = credential_of(str(connection.get("authorized_user") or ""))
                    if credential_id is not None and isinstance(connection.get("cid"), int):
                        listed[(server_id, connection["cid"])] = credential_id
        finally:
            await sub.unsubscribe()
        if answers:
            self.table.replace(listed, since)
        else:
            log.info("no server answered the connection listing; keeping what the events told")
        return answers > 0

    async def revoke(self, system: Client) -> int:
        """Kick the connections of credentials revoked or deleted since they connected; how many."""
        credentials = self.table.credentials()
        if not credentials:
            return 0
        valid = await asyncio.to_thread(self.still_valid, credentials)
        doomed = [
            c
            for credential_id in credentials
            if credential_id not in valid
            for c in self.table.connections(credential_id)
        ]
        if not doomed:
            return 0
        kicked = await asyncio.gather(*(self._kick(system, connection) for connection in doomed))
        return sum(kicked)

    async def _kick(self, system: Client, connection: Connection) -> bool:
        server_id, cid = connection
        try:
            answer = await system.request(
                f"$SYS.REQ.SERVER.{server_id}.KICK", json.dumps({"cid": cid}).encode(), timeout=KICK_TIMEOUT
            )
        except Exception as exc:  # a server that is gone or does not answer: its clients are gone too
            log.info("kick of client %s on %s: %s", cid, server_id, exc)
            self.table.remove(connection)
            return False
        self.table.remove(connection)
        return b'"error"' not in answer.data  # a client that is gone already is not counted

    async def sweep(self, system: Client) -> int:
        """The backstop: re-read the listings (events may have been missed), then revoke."""
        await self.resync(system)
        return await self.revoke(system)
