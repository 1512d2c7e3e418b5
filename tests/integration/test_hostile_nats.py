"""Issue 21's attacks on the event path, against a real nats-server configured as `gpufleet up` runs
it (auth callout) and the control plane's own components, on SQLite and PostgreSQL:

- no message of any size on any subject a team or a cluster may publish takes the control plane
  off NATS, stops a consumer or the relay, or makes `/readyz` lose NATS (a body just under 1 MiB
  used to come back as a dead letter above the server's limit, and the server closed the control
  plane's connection for good);
- an event the server can never take is dead-lettered and the events behind it go out;
- a sender cannot have an acknowledgement written onto another identity's subjects by naming
  them as its reply subject;
- a sender cannot have another's message dropped by using its message id first.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta

import httpx
import nats
import nats.errors
import nats.js.errors
import pytest
from fastapi.testclient import TestClient
from nats.aio.client import Client
from nats.aio.msg import Msg

from adapters.nats import secrets as nats_secrets
from adapters.nats.connection import JetStreamPublisher, connect
from adapters.nats.server import NatsServerProcess, free_port
from adapters.nats.sizes import header_bytes, inbound_limit
from adapters.nats.topology import DLQ_STREAM, EVENTS_STREAM, INBOUND_STREAM, TELEMETRY_STREAM, ensure_topology
from adapters.sql.tables import OutboxRow
from controlplane.bootstrap import Wiring, run_components, utc_now
from controlplane.config import Settings
from controlplane.service.events import MAX_EVENT_BYTES
from controlplane.service.relay import relay_gap, relay_once
from tests.integration.fleet import Tenant, add_tenant, gang, h100_cluster
from tests.integration.nats_clients import until

pytestmark = pytest.mark.timeout(180)


@dataclass
class Plane:
    settings: Settings
    control: Client
    llm: Tenant
    ads: Tenant
    clusters: dict[str, str]  # name -> NATS credential
    api: str  # the api component's own address (its /readyz reads this process's NATS connection)

    @property
    def prefix(self) -> str:
        return self.settings.subject_prefix

    async def team(self, tenant: Tenant) -> Client:
        return await nats.connect(
            self.settings.nats_url, token=tenant.token, inbox_prefix=f"_INBOX.team-{tenant.team}", connect_timeout=5
        )

    async def cluster(self, name: str) -> Client:
        return await nats.connect(
            self.settings.nats_url, token=self.clusters[name], inbox_prefix=f"_INBOX.cluster-{name}", connect_timeout=5
        )

    async def stored(self, stream: str, subject: str) -> int:
        info = await self.control.jetstream().stream_info(stream, subjects_filter=subject)
        return sum((info.state.subjects or {}).values())


@pytest.fixture
async def plane(
    secure_settings: Settings, wiring: Wiring, client: TestClient, admin: dict[str, str]
) -> AsyncIterator[Plane]:
    clusters = {}
    for name in ("c1", "c2"):
        r = client.post("/v1/clusters", json=h100_cluster(name, nodes=2), headers=admin)
        assert r.status_code == 201, r.text
        clusters[name] = r.json()["nats_credential"]
    r = client.post("/v1/priority-classes", json={"name": "batch", "value": 100, "is_default": True}, headers=admin)
    assert r.status_code == 201, r.text
    llm = add_tenant(client, admin, "llm", "llm-train")
    ads = add_tenant(client, admin, "ads", "ads-q")
    settings = secure_settings.model_copy(update={"api_port": free_port()})
    stop = asyncio.Event()
    # No dispatcher: it would rotate the simulated clusters' credentials the test holds.
    task = asyncio.create_task(run_components(settings, ("api", "ingest", "relay", "scheduler"), stop))
    secrets = nats_secrets.load(settings.nats_secrets_file)  # type: ignore[arg-type]
    control: Client | None = None
    for _ in range(200):  # the control plane creates the streams and starts the gateway
        try:
            control = control or await nats.connect(
                settings.nats_url, user=secrets.control_user, password=secrets.control_password
            )
            await control.jetstream().stream_info(INBOUND_STREAM)
            async with httpx.AsyncClient() as http:
                await http.get(f"http://127.0.0.1:{settings.api_port}/healthz")
            break
        except Exception:
            await asyncio.sleep(0.1)
    assert control is not None
    try:
        yield Plane(settings, control, llm, ads, clusters, f"http://127.0.0.1:{settings.api_port}")
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await control.close()


async def _dead_letters(plane: Plane, subject: str) -> list[Msg]:
    sub = await plane.control.jetstream().pull_subscribe(subject, stream=DLQ_STREAM)
    found: list[Msg] = []
    while True:
        try:
            found.extend(await sub.fetch(100, timeout=1))
        except (TimeoutError, nats.errors.TimeoutError):
            await sub.unsubscribe()
            return found


def _oversized_submit(queue: str, size: int) -> bytes:
    """A JSON submit of `size` bytes whose every pod set is invalid: one error each, so a
    rejection that named them all would be larger than the submit itself."""
    count = max(1, size // 50)
    while True:
        pod_sets = [{"name": f"p{i}", "replicas": -1, "gpus": 1} for i in range(count)]
        body = json.dumps({"name": "storm", "queue": queue, "pod_sets": pod_sets}).encode()
        if len(body) <= size:
            return body + b" " * (size - len(body))  # JSON allows the trailing blanks
        count = count * 9 // 10


async def test_no_message_of_any_size_on_any_senders_subject_stops_the_control_plane(
    plane: Plane, client: TestClient
) -> None:
    p = plane.prefix
    team, cluster = await plane.team(plane.llm), await plane.cluster("c1")
    events: list[Msg] = []

    async def on_event(msg: Msg) -> None:
        events.append(msg)

    await team.subscribe(f"{p}.events.workload.llm.>", cb=on_event)
    nats_checks: list[str] = []

    async def watch_readiness() -> None:
        async with httpx.AsyncClient() as http:
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    # (a 503 names only the failing checks: no scheduler lease here, as no dispatcher runs)
                    nats_checks.append((await http.get(f"{plane.api}/readyz")).json()["checks"].get("nats", "ok"))
                await asyncio.sleep(0.2)

    watcher = asyncio.create_task(watch_readiness())
    limit = inbound_limit(team.max_payload)
    headers = {"Gpufleet-Msg-Id": "storm-00"}
    largest = team.max_payload - header_bytes(headers)  # the largest message the server takes from a client
    sizes = (0, 1, 65_537, 700_007, limit, limit + 1, largest)
    sent = 0
    try:
        for sender, subjects in (
            (team, (f"{p}.submit.llm.llm-train", f"{p}.cancel.llm")),
            (
                cluster,
                (
                    f"{p}.cluster.c1.pods",
                    f"{p}.cluster.c1.inventory",
                    f"{p}.telemetry.c1.dcgm",
                    f"{p}.cluster.c1.pods.x",
                ),
            ),
        ):
            for subject in subjects:
                for size in sizes:
                    for body in (b"x" * size, _oversized_submit("llm-train", size) if size > 1000 else b"{}"):
                        sent += 1
                        await sender.publish(subject, body, headers={"Gpufleet-Msg-Id": f"storm-{sent:02d}"})
            await sender.flush()
        # a client's js.publish of a body above the limit raises with the gateway's sentence
        with pytest.raises(nats.js.errors.APIError) as refused:
            await team.jetstream().publish(f"{p}.submit.llm.llm-train", b"x" * (limit + 1), timeout=15)
        assert refused.value.code == 413
        assert "above the limit" in str(refused.value.description)
        sent += 1
        # after the storm: the team's next submit is created and announced, and the gateway answers
        after = json.dumps(gang("after-the-storm", "llm-train", replicas=1, gpus=1)).encode()
        ack = await team.jetstream().publish(
            f"{p}.submit.llm.llm-train", after, headers={"Gpufleet-Msg-Id": "after"}, timeout=15
        )
        assert ack.stream == INBOUND_STREAM

        async def created() -> bool:
            names = [w["name"] for w in client.get("/v1/workloads", headers=plane.llm.headers).json()["items"]]
            return "after-the-storm" in names and any(b"after-the-storm" in m.data for m in events)

        await until(created, timeout=90)
        # every refused or unusable message is a dead letter no larger than the server takes
        dead = await _dead_letters(plane, f"{p}.dlq.>")
        assert len(dead) >= sent - 10  # JSON objects on the team's subjects are rejections, not dead letters
        assert all(len(m.data) + header_bytes(m.headers) <= team.max_payload for m in dead)
        excerpts = [m for m in dead if m.headers and "Gpufleet-Original-Sha256" in m.headers]
        assert excerpts
        assert all(len(m.data) <= 4096 for m in excerpts)
        too_large = [m for m in dead if "above the limit" in (m.headers or {}).get("Gpufleet-Dlq-Reason", "")]
        assert {m.headers["Gpufleet-Original-Subject"] for m in too_large if m.headers} >= {
            f"{p}.submit.llm.llm-train",
            f"{p}.telemetry.c1.dcgm",
        }
        # the rejection of the 700,007-byte submit is a bounded event that reached the team
        rejections = [m for m in events if m.subject.endswith(".rejected")]
        assert rejections
        assert all(len(m.data) <= MAX_EVENT_BYTES for m in rejections)
        assert len(rejections) >= 5  # the JSON objects of every size the gateway let through
    finally:
        watcher.cancel()
        await team.close()
        await cluster.close()
    # the control plane's connection never dropped: readiness saw NATS throughout
    assert nats_checks
    assert set(nats_checks) == {"ok"}, sorted(set(nats_checks))


async def test_an_event_the_server_can_never_take_is_dead_lettered_and_the_rest_go_out(
    running_nats: NatsServerProcess, wiring: Wiring
) -> None:
    prefix = wiring.settings.subject_prefix
    nc = await connect(running_nats.url, "relay-test", resilient=True)
    js = nc.jetstream()
    for name in (INBOUND_STREAM, EVENTS_STREAM, DLQ_STREAM, TELEMETRY_STREAM):
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await js.delete_stream(name)
    await ensure_topology(js, prefix)
    now = utc_now() - timedelta(seconds=90)  # written a while ago: readiness says events are stuck
    huge = json.dumps({"type": "workload.rejected", "data": {"reason": "x" * 2_100_000}})
    with wiring.uow() as uow:
        uow.outbox.add(f"{prefix}.events.workload.llm.q.rejected", "evt-huge", huge, now)
        uow.outbox.add(f"{prefix}.events.workload.llm.q.queued", "evt-after", '{"type": "workload.queued"}', now)
        uow.commit()
    publisher = JetStreamPublisher(js)
    gap = relay_gap(wiring.uow, utc_now(), patience=60)
    assert gap is not None
    assert "the oldest unpublished event was written 9" in gap
    try:
        assert await relay_once(wiring.uow, publisher, utc_now, dead_letters=publisher) == 2
        assert relay_gap(wiring.uow, utc_now(), patience=60) is None
        info = await js.stream_info(EVENTS_STREAM)
        assert info.state.messages == 1  # the event behind the huge one went out
        [dead] = await (await js.pull_subscribe(f"{prefix}.dlq.>", stream=DLQ_STREAM)).fetch(1, timeout=5)
        assert dead.headers is not None
        assert dead.headers["Gpufleet-Original-Bytes"] == str(len(huge))
        assert "above the server's limit" in dead.headers["Gpufleet-Dlq-Reason"]
        assert len(dead.data) == 4096
        assert nc.is_connected
        with wiring.uow() as uow:
            row = uow.session.query(OutboxRow).filter_by(id="evt-huge").one()  # type: ignore[attr-defined]
            assert row.published_at is not None
            assert row.last_error.startswith("dead-lettered")
        assert await relay_once(wiring.uow, publisher, utc_now, dead_letters=publisher) == 0  # nothing left
    finally:
        await nc.close()


async def test_a_server_error_reopens_the_control_planes_connection(running_nats: NatsServerProcess) -> None:
    """The server closes a connection that sends more than its limit; nats-py would then close
    for good. The control plane's own connections reopen and work again."""
    resilient = await connect(running_nats.url, "resilient-test", resilient=True)
    plain = await nats.connect(running_nats.url, allow_reconnect=True, max_reconnect_attempts=-1)
    try:
        for nc in (resilient, plain):
            headers = {"X-Pad": "p" * 200}
            # nats-py checks the body alone: headers and body together pass the server's limit
            await nc.publish("hostile.oversize", b"x" * (nc.max_payload - 100), headers=headers)
            with contextlib.suppress(Exception):
                await nc.flush(timeout=2)
        await until(lambda: asyncio.sleep(0, plain.is_closed), timeout=10)

        async def reopened() -> bool:
            if not resilient.is_connected:
                return False
            with contextlib.suppress(Exception):
                await resilient.flush(timeout=1)
                return True
            return False

        await until(reopened, timeout=20)
        assert resilient.stats["reconnects"] >= 1
    finally:
        await resilient.close()
        await plain.close()


async def test_reply_subjects_outside_the_senders_own_inbox_are_refused(plane: Plane, client: TestClient) -> None:
    p = plane.prefix
    llm, ads, c1, c2 = (
        await plane.team(plane.llm),
        await plane.team(plane.ads),
        await plane.cluster("c1"),
        await plane.cluster("c2"),
    )
    received: list[str] = []

    async def saw(msg: Msg) -> None:
        received.append(msg.subject)

    try:
        # what the victims may read: a team its events and inbox, clusters their inboxes
        await llm.subscribe(f"{p}.events.workload.llm.>", cb=saw)
        await llm.subscribe("_INBOX.team-llm.>", cb=saw)
        await ads.subscribe(f"{p}.events.workload.ads.>", cb=saw)
        await c1.subscribe("_INBOX.cluster-c1.>", cb=saw)
        await c2.subscribe("_INBOX.cluster-c2.>", cb=saw)
        for nc in (llm, ads, c1, c2):
            await nc.flush()
        before = {s: await plane.stored(INBOUND_STREAM, s) for s in (f"{p}.in.cluster.c2.>", f"{p}.in.submit.llm.>")}
        before_telemetry = await plane.stored(TELEMETRY_STREAM, f"{p}.in.telemetry.c2.>")
        victims = (
            f"{p}.events.workload.llm.llm-train.succeeded",
            f"{p}.events.workload.ads.ads-q.succeeded",
            "_INBOX.team-llm.stolen",
            "_INBOX.cluster-c1.stolen",
            "_INBOX.cluster-c2.stolen",
            f"{p}.cluster.c2.pods",
            f"{p}.telemetry.c2.dcgm",
            f"{p}.submit.llm.llm-train",
            f"{p}.in.cluster.c2.pods",
            f"{p}.events.workload.llm.llm-train.queued",
        )
        attempts = 0
        for sender, subject, own in (
            (ads, f"{p}.submit.ads.ads-q", "_INBOX.team-ads"),
            (ads, f"{p}.cancel.ads", "_INBOX.team-ads"),
            (c1, f"{p}.cluster.c1.pods", "_INBOX.cluster-c1"),
            (c1, f"{p}.telemetry.c1.dcgm", "_INBOX.cluster-c1"),
        ):
            for target in victims:
                if target.startswith(own + "."):
                    continue
                attempts += 1
                body = json.dumps(gang(f"reflect-{attempts}", "ads-q", replicas=1, gpus=1)).encode()
                await sender.publish(subject, body, reply=target, headers={"Gpufleet-Msg-Id": f"reflect-{attempts}"})
            await sender.flush()
        # the sender's own inbox still gets its acknowledgement
        ack = await ads.jetstream().publish(
            f"{p}.submit.ads.ads-q", json.dumps(gang("own", "ads-q", replicas=1, gpus=1)).encode(), timeout=15
        )
        assert ack.stream == INBOUND_STREAM
        dead = await _dead_letters(plane, f"{p}.dlq.>")
        refused = [m for m in dead if "reply subject" in (m.headers or {}).get("Gpufleet-Dlq-Reason", "")]
        assert len(refused) == attempts  # each refused, kept with the reason, none lost silently
        await asyncio.sleep(1.0)
        # nothing reached a victim but the events of the team's own accepted submit
        assert [s for s in received if not s.startswith(f"{p}.events.workload.ads.")] == []
        assert {s: await plane.stored(INBOUND_STREAM, s) for s in before} == before
        assert await plane.stored(TELEMETRY_STREAM, f"{p}.in.telemetry.c2.>") == before_telemetry
        assert [w["name"] for w in client.get("/v1/workloads", headers=plane.ads.headers).json()["items"]] == ["own"]
    finally:
        for nc in (llm, ads, c1, c2):
            await nc.close()


async def test_a_message_id_is_scoped_to_its_sender(plane: Plane, client: TestClient) -> None:
    """JetStream drops a second message with the same Nats-Msg-Id within its window, whoever sent it.
    The attacker sends the victim's id just before the victim, inside the window."""
    p = plane.prefix
    attacker, victim = await plane.team(plane.ads), await plane.team(plane.llm)
    try:
        squat = json.dumps(gang("squatter", "ads-q", replicas=1, gpus=1)).encode()
        body = json.dumps(gang("nightly", "llm-train", replicas=1, gpus=1)).encode()
        first = asyncio.create_task(
            attacker.jetstream().publish(
                f"{p}.submit.ads.ads-q", squat, headers={"Nats-Msg-Id": "nightly-7"}, timeout=15
            )
        )
        second = asyncio.create_task(
            victim.jetstream().publish(
                f"{p}.submit.llm.llm-train", body, headers={"Nats-Msg-Id": "nightly-7"}, timeout=15
            )
        )
        acks = await asyncio.gather(first, second)
        assert [bool(a.duplicate) for a in acks] == [False, False]  # both stored
    finally:
        await attacker.close()
        await victim.close()

    async def both_exist() -> bool:
        mine = [w["name"] for w in client.get("/v1/workloads", headers=plane.llm.headers).json()["items"]]
        theirs = [w["name"] for w in client.get("/v1/workloads", headers=plane.ads.headers).json()["items"]]
        return mine == ["nightly"] and theirs == ["squatter"]

    await until(both_exist)
