"""Revocation, connection caps and failed-authentication limits against a real nats-server.

The control plane here runs only ingest (which answers auth callout and disconnects revoked
credentials); revocations go through the test's own API app, another process as far as the
ingest is concerned: the two share nothing but SQL. The backstop sweep (the servers' connection
listings) is set to a minute, so whatever closes a connection within these tests is the fast
path: the SQL poll over the connections the server reported.

Each test runs on SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import nats
import nats.errors
import pytest
from fastapi.testclient import TestClient
from nats.aio.client import Client
from sqlalchemy import select

from adapters.nats import secrets as nats_secrets
from adapters.nats.topology import INBOUND_STREAM
from adapters.sql.tables import WorkloadRow
from controlplane.bootstrap import Wiring, run_components
from controlplane.config import Settings
from controlplane.service import auth
from tests.integration.fleet import Tenant, add_tenant, gang, h100_cluster
from tests.integration.nats_clients import connect_as, refused, until

pytestmark = pytest.mark.timeout(120)

JS_ACK_TIMEOUT = 10.0
TEAM_CAP, CLUSTER_CAP = 3, 2
FAILURES, FAILURE_WINDOW = 5, 4.0


@dataclass
class Plane:
    settings: Settings
    client: TestClient
    admin: dict[str, str]
    llm: Tenant
    ads: Tenant
    clusters: dict[str, str]  # name -> NATS credential

    @property
    def prefix(self) -> str:
        return self.settings.subject_prefix


def _register(client: TestClient, admin: dict[str, str], name: str) -> str:
    r = client.post("/v1/clusters", json=h100_cluster(name, nodes=1), headers=admin)
    assert r.status_code == 201, r.text
    return str(r.json()["nats_credential"])


@pytest.fixture
async def plane(
    secure_settings: Settings, wiring: Wiring, client: TestClient, admin: dict[str, str]
) -> AsyncIterator[Plane]:
    settings = secure_settings.model_copy(
        update={
            "nats_revocation_sweep": 60.0,  # the backstop stays out of these tests
            "nats_max_connections_per_identity": TEAM_CAP,
            "nats_max_connections_per_cluster": CLUSTER_CAP,
            "nats_auth_failures_per_host": FAILURES,
            "nats_auth_failure_window": FAILURE_WINDOW,
        }  # type: ignore[attr-defined]
    )
    clusters = {name: _register(client, admin, name) for name in ("c1", "c2", "c3")}
    r = client.post("/v1/priority-classes", json={"name": "batch", "value": 100, "is_default": True}, headers=admin)
    assert r.status_code == 201, r.text
    llm = add_tenant(client, admin, "llm", "llm-train")
    ads = add_tenant(client, admin, "ads", "ads-q")
    stop = asyncio.Event()
    task = asyncio.create_task(run_components(settings, ("ingest",), stop))
    secrets = nats_secrets.load(settings.nats_secrets_file)  # type: ignore[arg-type]
    control: Client | None = None
    for _ in range(100):  # ingest creates the streams (and answers the callout) once it runs
        try:
            control = control or await nats.connect(
                settings.nats_url, user=secrets.control_user, password=secrets.control_password
            )
            await control.jetstream().stream_info(INBOUND_STREAM)
            break
        except Exception:
            await asyncio.sleep(0.1)
    assert control is not None
    await control.close()
    try:
        yield Plane(settings, client, admin, llm, ads, clusters)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def _connect(plane: Plane, token: str, inbox: str, closed: list[float]) -> Client:
    """A client that does not reconnect, and notes when it was closed."""

    async def on_closed() -> None:
        closed.append(time.monotonic())

    async def on_error(exc: Exception) -> None:
        pass

    return await nats.connect(
        plane.settings.nats_url,
        token=token,
        inbox_prefix=inbox,
        allow_reconnect=False,
        connect_timeout=3,
        closed_cb=on_closed,
        error_cb=on_error,
    )


def _token_id(plane: Plane, wiring: Wiring, token: str) -> str:
    principal = auth.authenticate(wiring.uow(), token)
    assert principal is not None
    return principal.token_id


def _is_refused(answer: str) -> bool:
    return "authorization violation" in answer.lower()


async def test_every_route_of_revocation_closes_open_connections(plane: Plane, wiring: Wiring) -> None:
    """A token revoked, a cluster credential rotated or revoked, a team or a cluster deleted: their
    open connections are closed by the server, and the old secrets cannot connect again."""
    client, admin = plane.client, plane.admin
    assert client.post("/v1/teams", json={"name": "gone"}, headers=admin).status_code == 201
    r = client.post("/v1/tokens", json={"name": "gone-ci", "team": "gone"}, headers=admin)
    assert r.status_code == 201, r.text
    gone_token = r.json()["token"]
    secrets = {
        "token": (plane.llm.token, "_INBOX.team-llm"),
        "rotated": (plane.clusters["c1"], "_INBOX.cluster-c1"),
        "revoked": (plane.clusters["c2"], "_INBOX.cluster-c2"),
        "cluster deleted": (plane.clusters["c3"], "_INBOX.cluster-c3"),
        "team deleted": (gone_token, "_INBOX.team-gone"),
    }
    closed: dict[str, list[float]] = {what: [] for what in secrets}
    connections = {what: await _connect(plane, *secrets[what], closed[what]) for what in secrets}
    bystander = await connect_as(plane.settings, plane.ads.token, "_INBOX.team-ads")
    try:
        llm_token_id = _token_id(plane, wiring, plane.llm.token)
        answers = [
            client.delete(f"/v1/tokens/{llm_token_id}", headers=admin),
            client.post("/v1/clusters/c1/credentials/rotate", headers=admin),
            client.delete("/v1/clusters/c2/credentials", headers=admin),
            client.delete("/v1/clusters/c3", headers=admin),
            client.delete("/v1/teams/gone", headers=admin),
        ]
        assert [a.status_code for a in answers] == [204, 201, 204, 204, 204], [a.text for a in answers]

        async def all_closed() -> bool:
            return all(closed.values())

        await until(all_closed, 10)  # without the fast path, not before the one-minute backstop
        assert all(nc.is_closed for nc in connections.values())
        # the rotated cluster's new credential works; the bystander was never touched
        fresh = answers[1].json()["credential"]
        again = await connect_as(plane.settings, fresh, "_INBOX.cluster-c1")
        await again.close()
        assert bystander.is_connected
        # (five failures from this host: it is blocked afterwards, so this comes last)
        for what, (secret, _) in secrets.items():
            assert _is_refused(await refused(plane.settings, token=secret)), what
    finally:
        for nc in [*connections.values(), bystander]:
            await nc.close()


@dataclass
class Figures:
    sent: dict[str, float] = field(default_factory=dict)  # message name -> when it was sent
    acked: dict[str, float] = field(default_factory=dict)  # of those, acknowledged by the server


async def _publish_until_cut(nc: Client, subject: str, body: bytes, figures: Figures, budget: float) -> None:
    """Publish one message every ~20 ms until the client is closed (or `budget` seconds pass)."""
    js = nc.jetstream(timeout=JS_ACK_TIMEOUT)
    deadline = time.monotonic() + budget
    i = 0
    while not nc.is_closed and time.monotonic() < deadline:
        name = f"m{i}"
        sent = figures.sent[name] = time.monotonic()
        try:
            await js.publish(subject, body.replace(b"NAME", name.encode()), headers={"Gpufleet-Msg-Id": name})
            figures.acked[name] = sent
        except Exception:  # the kick: its acknowledgement was lost, or it was never taken
            pass
        i += 1
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("identity", ["team", "cluster"])
async def test_a_client_publishing_through_its_revocation_is_cut_off(
    plane: Plane, wiring: Wiring, identity: str
) -> None:
    """An open connection keeps publishing while its credential is revoked through the API (a team
    token deleted; a cluster credential rotated): the server closes it, nothing sent after that is
    taken, and every submit that was acknowledged was created."""
    p = plane.prefix
    if identity == "team":
        secret, inbox = plane.llm.token, "_INBOX.team-llm"
        subject = f"{p}.submit.llm.llm-train"
        body = json.dumps(gang("NAME", "llm-train", replicas=1)).encode()
        token_id = _token_id(plane, wiring, secret)

        def revoke() -> int:
            return plane.client.delete(f"/v1/tokens/{token_id}", headers=plane.admin).status_code

    else:
        secret, inbox = plane.clusters["c1"], "_INBOX.cluster-c1"
        subject = f"{p}.cluster.c1.inventory"
        body = b'{"observed_at": "2026-01-01T00:00:00Z", "nodes": [], "note": "NAME"}'

        def revoke() -> int:
            return plane.client.post("/v1/clusters/c1/credentials/rotate", headers=plane.admin).status_code

    closed: list[float] = []
    nc = await _connect(plane, secret, inbox, closed)
    figures = Figures()
    publisher = asyncio.create_task(_publish_until_cut(nc, subject, body, figures, budget=20))
    try:
        await until(lambda: _some(figures), 10)  # it works before the revocation
        assert await asyncio.to_thread(revoke) in (201, 204)
        revoked = time.monotonic()  # the revocation call returned

        async def cut() -> bool:
            return bool(closed)

        await until(cut, 10)
        await asyncio.wait_for(publisher, 30)
        assert nc.is_closed  # closed by the server: this client never closes itself before here
        with pytest.raises(nats.errors.ConnectionClosedError):
            await nc.publish(subject, body)
        assert _is_refused(await refused(plane.settings, token=secret))  # and it cannot come back
        last = max(figures.acked.values())
        print(
            f"\n{identity}: revocation returned -> connection closed {closed[0] - revoked:.3f} s; "
            f"-> last message accepted (sent at) {last - revoked:+.3f} s; "
            f"{len([t for t in figures.acked.values() if t > revoked])} accepted after the call returned"
        )
        assert all(sent < closed[0] for sent in figures.acked.values())
    finally:
        publisher.cancel()
        await nc.close()
    if identity == "team":

        def created() -> set[str]:
            with wiring.uow() as uow:
                return set(uow.session.scalars(select(WorkloadRow.name)))  # type: ignore[attr-defined]

        async def all_applied() -> bool:
            return created() >= set(figures.acked)

        await until(all_applied, 15)  # nothing acknowledged was lost ...
        await asyncio.sleep(0.5)
        # ... and what was created beyond it was in flight at the kick (taken, its ack lost), never later
        assert all(figures.sent[name] < closed[0] for name in created())


async def _some(figures: Figures) -> bool:
    return bool(figures.acked)


async def test_a_credential_holds_at_most_its_cap_of_connections(plane: Plane) -> None:
    team: list[Client] = []
    clusters: list[Client] = []
    try:
        for _ in range(TEAM_CAP):
            team.append(await connect_as(plane.settings, plane.llm.token, "_INBOX.team-llm"))
        for _ in range(CLUSTER_CAP):
            clusters.append(await connect_as(plane.settings, plane.clusters["c1"], "_INBOX.cluster-c1"))
        assert _is_refused(await refused(plane.settings, token=plane.llm.token))
        assert _is_refused(await refused(plane.settings, token=plane.clusters["c1"]))
        # the cap is per credential: another team and another cluster connect
        other = await connect_as(plane.settings, plane.ads.token, "_INBOX.team-ads")
        await other.close()
        other = await connect_as(plane.settings, plane.clusters["c2"], "_INBOX.cluster-c2")
        await other.close()
        # one closed: its place is free again once the server has told the control plane
        await team.pop().close()

        async def admitted() -> bool:
            try:
                team.append(await connect_as(plane.settings, plane.llm.token, "_INBOX.team-llm"))
                return True
            except Exception:
                return False

        await until(admitted, 10)
        assert _is_refused(await refused(plane.settings, token=plane.llm.token))
    finally:
        for nc in [*team, *clusters]:
            await nc.close()


async def test_a_host_that_fails_too_often_is_refused_for_a_while(plane: Plane) -> None:
    """After FAILURES bad secrets from one host within the window, that host is refused even with
    a good credential it never used; a credential that authenticated here before still gets in
    (a known agent next to the guesser); once the failures age out, the good one is admitted."""
    known = await connect_as(plane.settings, plane.clusters["c1"], "_INBOX.cluster-c1")
    await known.close()
    for i in range(FAILURES):
        assert _is_refused(await refused(plane.settings, token=f"gpf_guess-{i}"))
    failed_at = time.monotonic()
    assert _is_refused(await refused(plane.settings, token=plane.ads.token))  # good, but from this host
    again = await connect_as(plane.settings, plane.clusters["c1"], "_INBOX.cluster-c1")
    await again.close()
    assert time.monotonic() - failed_at < FAILURE_WINDOW  # all of the above happened inside the window
    await asyncio.sleep(max(0.0, FAILURE_WINDOW - (time.monotonic() - failed_at)) + 0.2)
    admitted = await connect_as(plane.settings, plane.ads.token, "_INBOX.team-ads")
    await admitted.close()
