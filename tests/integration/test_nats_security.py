"""The attacks of issue 11 on NATS, performed against a real nats-server configured as `gpufleet up`
runs it (fixed control-plane users, everyone else through auth callout answered by the control
plane), each failing: anonymous and revoked clients are refused, a team cannot read the inbound
stream, touch the JetStream API, publish for another team, read another team's events or forge
events, a cluster cannot publish for another, a pod report from the wrong cluster or epoch does
not change the run, and a squatted message id does not drop the victim's submit.

Each test starts the control plane's ingest and relay (about a second) and runs on SQLite and
PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import nats
import nats.errors
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from sqlalchemy import select

from adapters.nats import secrets as nats_secrets
from adapters.nats.server import find_binary, free_port
from adapters.nats.topology import DLQ_STREAM, EVENTS_STREAM, INBOUND_STREAM, INGEST_CONSUMERS, SUBMIT_CONSUMER
from adapters.sql.tables import RunRow, WorkloadRow
from controlplane.bootstrap import Wiring, run_components, utc_now
from controlplane.cli.main import main
from controlplane.config import Settings
from controlplane.service import auth, nats_identity, telemetry
from controlplane.service.telemetry import WindowQuery
from controlplane.service.telemetry_wire import GpuSample, encode_batch, telemetry_subject
from tests.integration.fleet import Tenant, add_tenant, gang, h100_cluster
from tests.integration.nats_clients import Watch
from tests.integration.nats_clients import connect_as as _as
from tests.integration.nats_clients import refused as _refused
from tests.integration.nats_clients import until as _until

pytestmark = pytest.mark.timeout(90)

# Publishes the server must accept: their ack may be slow on a loaded 2-core machine (seen at 2 s).
JS_ACK_TIMEOUT = 10.0


@dataclass
class Plane:
    settings: Settings
    control: Client  # the control plane's own user: sees everything, to check what happened
    llm: Tenant
    ads: Tenant
    clusters: dict[str, str]  # cluster name -> its NATS credential

    @property
    def prefix(self) -> str:
        return self.settings.subject_prefix


def _register(client: TestClient, admin: dict[str, str], name: str) -> str:
    r = client.post("/v1/clusters", json=h100_cluster(name, nodes=2), headers=admin)
    assert r.status_code == 201, r.text
    assert r.headers["cache-control"] == "no-store"
    credential: str = r.json()["nats_credential"]
    assert credential.startswith("gpc_")
    return credential


@pytest.fixture
async def plane(
    secure_settings: Settings, wiring: Wiring, client: TestClient, admin: dict[str, str]
) -> AsyncIterator[Plane]:
    clusters = {name: _register(client, admin, name) for name in ("c1", "c2")}
    r = client.post("/v1/priority-classes", json={"name": "batch", "value": 100, "is_default": True}, headers=admin)
    assert r.status_code == 201, r.text
    llm = add_tenant(client, admin, "llm", "llm-train")
    ads = add_tenant(client, admin, "ads", "ads-q")
    stop = asyncio.Event()
    task = asyncio.create_task(run_components(secure_settings, ("ingest", "relay", "scheduler"), stop))
    secrets = nats_secrets.load(secure_settings.nats_secrets_file)  # type: ignore[arg-type]
    control: Client | None = None
    for _ in range(100):  # the control plane creates the streams; wait until they are there
        try:
            control = control or await nats.connect(
                secure_settings.nats_url, user=secrets.control_user, password=secrets.control_password
            )
            await control.jetstream().stream_info(INBOUND_STREAM)
            break
        except Exception:
            await asyncio.sleep(0.1)
    assert control is not None
    try:
        yield Plane(secure_settings, control, llm, ads, clusters)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await control.close()


async def _until_true(count: Callable[[], Awaitable[int]], want: int, timeout: float = 15.0) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        if await count() == want:
            return True
        await asyncio.sleep(0.1)
    return False


async def _count(plane: Plane, stream: str, subject: str) -> int:
    info = await plane.control.jetstream().stream_info(stream, subjects_filter=subject)
    return sum((info.state.subjects or {}).values())


async def test_anonymous_wrong_and_fake_credentials_are_refused(plane: Plane) -> None:
    assert "authorization violation" in (await _refused(plane.settings)).lower()
    assert "authorization violation" in (await _refused(plane.settings, token="gpf_not-a-token")).lower()
    assert "authorization violation" in (await _refused(plane.settings, token="gpc_not-a-credential")).lower()
    # a control-plane user name with a guessed password does not get past the fixed users
    assert "authorization violation" in (await _refused(plane.settings, user="gpufleet", password="guess")).lower()


async def _pull(js: JetStreamContext, durable: str) -> list[Msg]:
    sub = await js.pull_subscribe_bind(durable=durable, stream=INBOUND_STREAM)
    return await sub.fetch(1, timeout=1.0)


async def test_a_team_cannot_read_the_inbound_stream_or_touch_the_jetstream_api(plane: Plane) -> None:
    p = plane.prefix
    watch = Watch()
    nc = await _as(plane.settings, plane.llm.token, "_INBOX.team-llm", watch)
    try:
        js = nc.jetstream(timeout=1.0)
        body = json.dumps(gang("mine", "llm-train")).encode()
        for _ in range(50):  # the plane's streams exist before its inbound gateway has subscribed
            try:
                ack = await js.publish(f"{p}.submit.llm.llm-train", body)
                break
            except nats.js.errors.NoStreamResponseError:  # no responder yet: nothing was stored
                await asyncio.sleep(0.1)
        assert ack.stream == INBOUND_STREAM
        for attack in (
            lambda: js.stream_info(INBOUND_STREAM),
            lambda: js.get_msg(INBOUND_STREAM, 1),
            lambda: js.delete_msg(INBOUND_STREAM, 1),
            lambda: js.delete_stream(INBOUND_STREAM),
            lambda: js.purge_stream(EVENTS_STREAM),
            lambda: js.pull_subscribe(f"{p}.submit.>", durable="spy", stream=INBOUND_STREAM),
            # pulling (and so acking away) another sender's messages from any ingest consumer
            *(lambda durable=durable: _pull(js, durable) for durable in INGEST_CONSUMERS.values()),
        ):
            with pytest.raises((nats.errors.TimeoutError, nats.errors.Error, TimeoutError)):
                await attack()
        assert await watch.saw('permissions violation for publish to "$js.api.')
        for durable in INGEST_CONSUMERS.values():
            assert await watch.saw(f'"$js.api.consumer.msg.next.{INBOUND_STREAM.lower()}.{durable}"')
        # a plain subscription to the inbound subjects, or to everyone's reply inboxes, is refused too
        await nc.subscribe(f"{p}.submit.>")
        await nc.subscribe("_INBOX.>")
        await nc.subscribe(f"{p}.dlq.>")
        await nc.flush()
        assert await watch.saw(f'permissions violation for subscription to "{p}.submit.>"')
        assert await watch.saw('permissions violation for subscription to "_inbox.>"')
        assert await watch.saw(f'permissions violation for subscription to "{p}.dlq.>"')
    finally:
        await nc.close()
    # everything is still there: the stream, with the team's message in it (an interest stream drops a
    # message once ingest acked it, so its last sequence is the proof), and the events stream
    control = plane.control.jetstream()
    assert (await control.stream_info(INBOUND_STREAM)).state.last_seq >= ack.seq
    assert (await control.consumer_info(INBOUND_STREAM, SUBMIT_CONSUMER)).delivered.stream_seq >= ack.seq
    assert (await plane.control.jetstream().stream_info(EVENTS_STREAM)).config.name == EVENTS_STREAM


async def test_a_team_cannot_submit_or_cancel_as_another_team_nor_forge_events(plane: Plane, wiring: Wiring) -> None:
    p = plane.prefix
    watch = Watch()
    nc = await _as(plane.settings, plane.llm.token, "_INBOX.team-llm", watch)
    try:
        await nc.publish(f"{p}.submit.ads.ads-q", json.dumps(gang("as-ads", "ads-q")).encode())
        await nc.publish(f"{p}.cancel.ads", json.dumps({"workload_id": "wl-x", "reason": "mine now"}).encode())
        forged = {"type": "workload.succeeded", "version": 1, "id": "forged", "data": {"team": "llm"}}
        await nc.publish(f"{p}.events.workload.llm.llm-train.succeeded", json.dumps(forged).encode())
        await nc.publish(f"{p}.cluster.c1.pods", b"{}")
        await nc.publish(f"{p}.telemetry.c1.dcgm", b"{}")
        await nc.flush()
        for subject in (
            f"{p}.submit.ads.ads-q",
            f"{p}.cancel.ads",
            f"{p}.events.workload.llm.llm-train.succeeded",
            f"{p}.cluster.c1.pods",
            f"{p}.telemetry.c1.dcgm",
        ):
            assert await watch.saw(f'permissions violation for publish to "{subject}"'), subject
    finally:
        await nc.close()
    assert await _count(plane, INBOUND_STREAM, f"{p}.>") == 0
    assert await _count(plane, EVENTS_STREAM, f"{p}.events.workload.>") == 0
    with wiring.uow() as uow:
        assert uow.session.scalars(select(WorkloadRow)).all() == []  # type: ignore[attr-defined]


async def test_a_team_reads_its_own_events_and_never_another_teams(plane: Plane, client: TestClient) -> None:
    p = plane.prefix
    llm_watch = Watch()
    llm = await _as(plane.settings, plane.llm.token, "_INBOX.team-llm", llm_watch)
    ads = await _as(plane.settings, plane.ads.token, "_INBOX.team-ads")
    seen_by_llm: list[str] = []
    seen_by_ads: list[str] = []

    async def on_llm(msg: nats.aio.msg.Msg) -> None:
        seen_by_llm.append(msg.subject)

    async def on_ads(msg: nats.aio.msg.Msg) -> None:
        seen_by_ads.append(msg.subject)

    try:
        await llm.subscribe(f"{p}.events.workload.ads.>", cb=on_llm)
        await llm.subscribe(f"{p}.events.>", cb=on_llm)
        await llm.subscribe(f"{p}.events.workload.llm.>", cb=on_llm)
        await ads.subscribe(f"{p}.events.workload.ads.>", cb=on_ads)
        await llm.flush()
        await ads.flush()
        assert await llm_watch.saw(f'permissions violation for subscription to "{p}.events.workload.ads.>"')
        assert await llm_watch.saw(f'permissions violation for subscription to "{p}.events.>"')
        r = client.post("/v1/workloads", json=gang("ads-job", "ads-q", replicas=2), headers=plane.ads.headers)
        assert r.status_code == 201, r.text

        async def ads_saw_it() -> bool:
            return f"{p}.events.workload.ads.ads-q.queued" in seen_by_ads

        await _until(ads_saw_it)
        await asyncio.sleep(0.3)
        assert seen_by_llm == []
    finally:
        await llm.close()
        await ads.close()


async def test_a_cluster_publishes_only_for_itself(plane: Plane) -> None:
    p = plane.prefix
    watch = Watch()
    nc = await _as(plane.settings, plane.clusters["c1"], "_INBOX.cluster-c1", watch)
    try:
        js = nc.jetstream(timeout=JS_ACK_TIMEOUT)
        own = await js.publish(f"{p}.cluster.c1.inventory", b'{"observed_at": "2026-01-01T00:00:00Z", "nodes": []}')
        await nc.publish(f"{p}.cluster.c2.pods", json.dumps({"run_id": "r", "epoch": 1, "pods": []}).encode())
        await nc.publish(f"{p}.telemetry.c2.dcgm", b"{}")
        await nc.publish(f"{p}.submit.llm.llm-train", json.dumps(gang("from-a-cluster", "llm-train")).encode())
        await nc.flush()
        assert await watch.saw(f'permissions violation for publish to "{p}.cluster.c2.pods"')
        assert await watch.saw(f'permissions violation for publish to "{p}.telemetry.c2.dcgm"')
        assert await watch.saw(f'permissions violation for publish to "{p}.submit.llm.llm-train"')
    finally:
        await nc.close()
    # its own subject was stored (an interest stream drops it again once ingest acked it) ...
    assert own.stream == INBOUND_STREAM
    # ... and nothing it tried for another cluster or a team ever reached the stream
    assert (await plane.control.jetstream().stream_info(INBOUND_STREAM)).state.last_seq == own.seq
    assert await _count(plane, INBOUND_STREAM, f"{p}.cluster.c2.>") == 0


async def test_pod_reports_from_the_wrong_cluster_or_epoch_do_not_change_the_run(
    plane: Plane, client: TestClient, wiring: Wiring
) -> None:
    p = plane.prefix
    r = client.post("/v1/workloads", json=gang("victim", "llm-train", replicas=2), headers=plane.llm.headers)
    assert r.status_code == 201, r.text
    workload_id = r.json()["id"]

    def run_of_victim() -> tuple[str, str] | None:
        """(run id, state)"""
        with wiring.uow() as uow:
            row = uow.session.execute(  # type: ignore[attr-defined]
                select(RunRow.id, RunRow.state).where(RunRow.workload_id == workload_id)
            ).first()
            return (str(row[0]), str(row[1])) if row else None

    async def admitted() -> bool:
        return run_of_victim() is not None

    await _until(admitted)
    found = run_of_victim()
    assert found is not None
    run_id = found[0]
    with wiring.uow() as uow:
        own = uow.runs.status(run_id)
    assert own is not None
    other = "c2" if own.cluster == "c1" else "c1"
    failed = [{"pod_set": "workers", "index": 0, "phase": "Failed", "message": "forged"}]

    async def report(cluster: str, epoch: int, pods: list[dict[str, object]], msg_id: str) -> None:
        nc = await _as(plane.settings, plane.clusters[cluster], f"_INBOX.cluster-{cluster}")
        try:
            body = json.dumps({"run_id": run_id, "epoch": epoch, "pods": pods}).encode()
            await nc.jetstream(timeout=JS_ACK_TIMEOUT).publish(
                f"{p}.cluster.{cluster}.pods", body, headers={"Gpufleet-Msg-Id": msg_id}
            )
        finally:
            await nc.close()

    await report(other, own.epoch, failed, "wrong-cluster")  # another cluster fails the gang
    await report(own.cluster, 0, failed, "stale-epoch")  # the run's cluster, with an old epoch

    async def both_dead_lettered() -> bool:
        return await _count(plane, DLQ_STREAM, f"{p}.dlq.cluster.>") == 2

    await _until(both_dead_lettered)
    dlq = await plane.control.jetstream().pull_subscribe(f"{p}.dlq.>", durable="dlq-check", stream=DLQ_STREAM)
    reasons = sorted(m.headers["Gpufleet-Dlq-Reason"] for m in await dlq.fetch(2, timeout=2) if m.headers)
    assert any(f"runs on cluster {own.cluster}, not on {other}" in r for r in reasons), reasons
    assert any(f"placed at epoch {own.epoch}; the report carries epoch 0" in r for r in reasons), reasons
    assert run_of_victim() == (run_id, "admitted")
    assert client.get(f"/v1/workloads/{workload_id}", headers=plane.llm.headers).json()["state"] != "failed"

    # the run's own cluster, at the run's epoch, is heard
    running = [{"pod_set": "workers", "index": i, "phase": "Running"} for i in range(2)]
    await report(own.cluster, own.epoch, running, "genuine")

    async def is_running() -> bool:
        return run_of_victim() == (run_id, "running")

    await _until(is_running)


async def test_a_squatted_message_id_does_not_drop_the_victims_submit(plane: Plane, client: TestClient) -> None:
    """JetStream de-duplicates Nats-Msg-Id per stream, across senders; gpufleet's senders use
    Gpufleet-Msg-Id, de-duplicated per sender by the ingest inbox, and the stream's window is the
    server's minimum. The attacker uses the victim's id first, in both headers and as its key."""
    p = plane.prefix
    attacker = await _as(plane.settings, plane.ads.token, "_INBOX.team-ads")
    victim = await _as(plane.settings, plane.llm.token, "_INBOX.team-llm")
    try:
        squat = json.dumps(gang("squatter", "ads-q", replicas=2, idempotency_key="nightly-1")).encode()
        ack = await attacker.jetstream().publish(
            f"{p}.submit.ads.ads-q", squat, headers={"Nats-Msg-Id": "nightly-1", "Gpufleet-Msg-Id": "nightly-1"}
        )
        assert not ack.duplicate
        body = json.dumps(gang("nightly", "llm-train", replicas=2)).encode()
        ack = await victim.jetstream().publish(
            f"{p}.submit.llm.llm-train",
            body,
            headers={"Gpufleet-Msg-Id": "nightly-1", "Authorization": f"Bearer {plane.llm.token}"},
        )
        assert not ack.duplicate  # the server kept it
        # a retry of the victim's own message is still one submission
        await victim.jetstream().publish(f"{p}.submit.llm.llm-train", body, headers={"Gpufleet-Msg-Id": "nightly-1"})
    finally:
        await attacker.close()
        await victim.close()

    async def both_exist() -> bool:
        mine = client.get("/v1/workloads", headers=plane.llm.headers).json()["items"]
        theirs = client.get("/v1/workloads", headers=plane.ads.headers).json()["items"]
        return [w["name"] for w in mine] == ["nightly"] and [w["name"] for w in theirs] == ["squatter"]

    await _until(both_exist)
    await asyncio.sleep(0.5)  # the retry was applied as a duplicate, not as a second workload
    assert [w["name"] for w in client.get("/v1/workloads", headers=plane.llm.headers).json()["items"]] == ["nightly"]


async def test_revoked_credentials_are_refused_and_their_connections_closed(plane: Plane, wiring: Wiring) -> None:
    cluster_watch, team_watch = Watch(), Watch()
    cluster = await _as(plane.settings, plane.clusters["c1"], "_INBOX.cluster-c1", cluster_watch)
    team = await _as(plane.settings, plane.llm.token, "_INBOX.team-llm", team_watch)
    try:
        assert cluster.is_connected
        assert team.is_connected
        nats_identity.revoke_cluster_credentials(wiring.uow(), "c1", "test", utc_now())
        token_id = auth.authenticate(wiring.uow(), plane.llm.token).token_id  # type: ignore[union-attr]
        auth.revoke_token(wiring.uow(), token_id, "test", utc_now())

        async def both_closed() -> bool:
            return not cluster.is_connected and not team.is_connected

        await _until(both_closed, 10)  # kicked by the control plane's revocation sweep
        assert "authorization violation" in (await _refused(plane.settings, token=plane.clusters["c1"])).lower()
        assert "authorization violation" in (await _refused(plane.settings, token=plane.llm.token)).lower()
        # rotation issues a working credential again; the other cluster was never affected
        _, fresh = nats_identity.rotate_cluster_credential(wiring.uow(), "c1", "test", utc_now())
        again = await _as(plane.settings, fresh, "_INBOX.cluster-c1")
        await again.close()
        other = await _as(plane.settings, plane.clusters["c2"], "_INBOX.cluster-c2")
        await other.close()
    finally:
        await cluster.close()
        await team.close()


async def test_telemetry_credits_only_runs_on_the_sending_cluster(
    plane: Plane, client: TestClient, wiring: Wiring
) -> None:
    """Zero-activity samples naming another cluster's run do not make that run look idle."""
    p = plane.prefix
    r = client.post("/v1/workloads", json=gang("busy", "llm-train", replicas=2), headers=plane.llm.headers)
    assert r.status_code == 201, r.text
    workload_id = r.json()["id"]

    def placed() -> tuple[str, str] | None:
        with wiring.uow() as uow:
            row = uow.session.execute(  # type: ignore[attr-defined]
                select(RunRow.id).where(RunRow.workload_id == workload_id)
            ).first()
            if row is None:
                return None
            status = uow.runs.status(str(row[0]))
            return (status.run_id, status.cluster) if status else None

    async def admitted() -> bool:
        return placed() is not None

    await _until(admitted)
    run_id, own = placed()  # type: ignore[misc]
    other = "c2" if own == "c1" else "c1"
    now = utc_now().timestamp()

    async def send(cluster: str, activity: float, msg_id: str) -> None:
        samples = [GpuSample(cluster, "n1", "GPU-0", 0, now, {"sm_active": activity}, run_id=run_id)]
        nc = await _as(plane.settings, plane.clusters[cluster], f"_INBOX.cluster-{cluster}")
        try:
            await nc.jetstream(timeout=JS_ACK_TIMEOUT).publish(
                telemetry_subject(p, cluster), encode_batch(cluster, samples), headers={"Gpufleet-Msg-Id": msg_id}
            )
        finally:
            await nc.close()

    await send(other, 0.0, "same-id")  # the forger
    await send(own, 0.9, "same-id")  # the run's cluster, even with the same message id

    async def own_folded() -> bool:
        return len(telemetry.windows(wiring.uow(), WindowQuery(run_id=run_id))) == 1

    await _until(own_folded)
    # The forger's batch named only a run that is not one of its cluster's runs: refused whole and
    # dead-lettered, so nothing of it reached a window; the run's own cluster's batch did.
    assert await _until_true(lambda: _count(plane, DLQ_STREAM, f"{p}.dlq.telemetry.{other}.>"), 1)
    windows = telemetry.windows(wiring.uow(), WindowQuery())
    assert [(w.cluster, w.run_id) for w in windows] == [(own, run_id)]


async def test_nats_auth_config_secures_an_external_server(tmp_path: Path) -> None:
    """`gpufleet server nats-auth-config` writes what an operator gives their own nats-server."""
    port = free_port()
    secrets_file, config = tmp_path / "secrets.json", tmp_path / "nats.conf"
    args = ["server", "nats-auth-config", "--secrets-file", str(secrets_file), "--out", str(config)]
    args += ["--host", "127.0.0.1", "--port", str(port), "--store-dir", str(tmp_path / "js")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert secrets_file.stat().st_mode & 0o777 == 0o600
    assert config.stat().st_mode & 0o777 == 0o600
    server = subprocess.Popen([find_binary(), "-c", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        secrets = nats_secrets.load(secrets_file)
        control: Client | None = None
        for _ in range(100):
            try:
                control = await nats.connect(
                    f"nats://127.0.0.1:{port}", user=secrets.control_user, password=secrets.control_password
                )
                break
            except Exception:
                await asyncio.sleep(0.1)
        assert control is not None
        assert (await control.jetstream().account_info()).limits is not None  # JetStream for gpufleet's account
        await control.close()
        settings = Settings(nats_url=f"nats://127.0.0.1:{port}")
        # No callout responder runs here, so the server refuses when its callout request times out
        # (2 s); on a loaded machine its authentication timer may fire first or it may just close.
        refusal = (await _refused(settings)).lower()
        assert any(r in refusal for r in ("authorization violation", "authentication timeout", "closed by the server"))
    finally:
        server.terminate()
        server.wait(10)


async def test_revocation_closes_connections_made_before_a_control_plane_restart(
    secure_settings: Settings, client: TestClient, admin: dict[str, str], wiring: Wiring
) -> None:
    """The sweep learns the server's connections from the system account, so a connection
    authorized by an earlier control plane process is closed too when its credential is revoked."""
    credential = _register(client, admin, "c1")

    async def plane() -> tuple[asyncio.Event, asyncio.Task[None]]:
        stop = asyncio.Event()
        return stop, asyncio.create_task(run_components(secure_settings, ("ingest",), stop))

    stop, task = await plane()
    nc: Client | None = None
    try:
        for _ in range(100):
            try:
                nc = await _as(secure_settings, credential, "_INBOX.cluster-c1")
                await nc.flush(timeout=3)  # nats-py returns from connect on a line it did not expect too
                if nc.is_connected:
                    break
            except Exception:
                pass
            if nc is not None:
                await nc.close()
                nc = None
            await asyncio.sleep(0.1)
        assert nc is not None
        assert nc.is_connected
        stop.set()
        await asyncio.wait_for(task, 30)  # the control plane that authorized it is gone
        stop, task = await plane()
        await asyncio.sleep(1.0)
        assert nc.is_connected
        nats_identity.revoke_cluster_credentials(wiring.uow(), "c1", "test", utc_now())

        async def closed() -> bool:
            return not nc.is_connected  # type: ignore[union-attr]

        await _until(closed, 10)
    finally:
        if nc is not None:
            await nc.close()
        stop.set()
        await asyncio.wait_for(task, 30)
