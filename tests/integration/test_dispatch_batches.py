"""Dispatch in batches: one pass applies every admitted run, each cluster's in one transaction, and a
failing cluster holds up no other. The simulated clusters react to events (a run created, pods due
to change phase), not to a fixed tick."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from adapters.sim.cluster import SimCluster
from controlplane.bootstrap import Wiring, utc_now
from controlplane.bootstrap import sim_fleet as sim_fleet_module
from controlplane.bootstrap.sim_fleet import SimFleet
from controlplane.core.decision import EndCause
from controlplane.core.snapshot import Policy
from controlplane.service.dispatch import InFlight, dispatch_once, dispatch_pending, tear_down_ended
from controlplane.service.ports import PodOrder, RunOrder
from controlplane.service.scheduling import acquire_leadership, run_cycle
from tests.integration.fleet import add_tenant, gang, h100_cluster, setup_fleet


class Recorder:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, object], str]] = []
        self.arrived = asyncio.Event()

    async def publish(self, subject: str, payload: bytes, msg_id: str) -> None:
        self.sent.append((subject, json.loads(payload), msg_id))
        self.arrived.set()


class Refusing:
    """A cluster whose API server is down: every call fails (transiently)."""

    async def apply(self, order: RunOrder) -> bool:
        raise ConnectionError("cluster unreachable")

    async def delete(self, run_id: str) -> bool:
        raise ConnectionError("cluster unreachable")

    async def list_owned(self) -> set[str]:
        raise ConnectionError("cluster unreachable")


def _admit(wiring: Wiring) -> None:
    epoch = acquire_leadership(wiring.uow, "s", utc_now(), 15)
    assert epoch is not None
    run_cycle(wiring.uow, "s", epoch, Policy(), wiring.settings.subject_prefix, utc_now(), 15, True)


def _states(client: TestClient, headers: dict[str, str], ids: list[str]) -> list[str]:
    return [client.get(f"/v1/workloads/{wid}", headers=headers).json()["state"] for wid in ids]


@pytest.fixture
def two_clusters(client: TestClient, admin: dict[str, str]) -> dict[str, str]:
    setup_fleet(client, admin, h100_cluster("sim-a", nodes=2), h100_cluster("sim-b", nodes=2))
    return add_tenant(client, admin, "vision", "vision-train").headers


async def test_one_pass_applies_every_admitted_run_on_every_cluster(
    wiring: Wiring, client: TestClient, two_clusters: dict[str, str], tmp_path: Path
) -> None:
    # Four whole-node gangs on two clusters of two nodes: both clusters get runs.
    ids = [
        client.post("/v1/workloads", json=gang(f"g{i}", "vision-train", replicas=1), headers=two_clusters).json()["id"]
        for i in range(4)
    ]
    _admit(wiring)
    recorder = Recorder()
    sims = {name: SimCluster(name, recorder.publish, "p", tmp_path / f"{name}.json") for name in ("sim-a", "sim-b")}
    stats = await dispatch_once(wiring.uow, sims, wiring.settings.subject_prefix, utc_now)
    assert (stats.applied, stats.errors, stats.full) == (4, [], False)
    assert sorted(len(sim.runs) for sim in sims.values()) == [2, 2]
    assert _states(client, two_clusters, ids) == ["dispatching"] * 4
    with wiring.uow() as uow:
        assert uow.runs.to_dispatch(10) == []  # every run recorded as applied


async def test_a_failing_cluster_holds_up_no_other_and_its_runs_wait_for_the_next_pass(
    wiring: Wiring, client: TestClient, two_clusters: dict[str, str], tmp_path: Path
) -> None:
    for i in range(4):
        client.post("/v1/workloads", json=gang(f"g{i}", "vision-train", replicas=1), headers=two_clusters)
    _admit(wiring)
    recorder = Recorder()
    sim_a = SimCluster("sim-a", recorder.publish, "p", tmp_path / "sim-a.json")
    stats = await dispatch_once(wiring.uow, {"sim-a": sim_a, "sim-b": Refusing()}, "p", utc_now)
    assert stats.applied == 2
    assert len(stats.errors) == 2
    with wiring.uow() as uow:
        waiting = uow.runs.to_dispatch(10)
    assert {order.cluster for order in waiting} == {"sim-b"}
    assert len(waiting) == 2
    sim_b = SimCluster("sim-b", recorder.publish, "p", tmp_path / "sim-b.json")
    again = await dispatch_once(wiring.uow, {"sim-a": sim_a, "sim-b": sim_b}, "p", utc_now)
    assert (again.applied, again.already_present, again.errors) == (2, 0, [])


async def test_a_full_batch_says_more_is_waiting(
    wiring: Wiring, client: TestClient, two_clusters: dict[str, str], tmp_path: Path
) -> None:
    for i in range(3):
        client.post("/v1/workloads", json=gang(f"g{i}", "vision-train", replicas=1), headers=two_clusters)
    _admit(wiring)
    recorder = Recorder()
    sims = {name: SimCluster(name, recorder.publish, "p", tmp_path / f"{name}.json") for name in ("sim-a", "sim-b")}
    first = await dispatch_once(wiring.uow, sims, "p", utc_now, batch=2)
    assert (first.applied, first.full) == (2, True)
    second = await dispatch_once(wiring.uow, sims, "p", utc_now, batch=2)
    assert (second.applied, second.full) == (1, False)


def _order(run_id: str, duration: float = 30) -> RunOrder:
    return RunOrder(
        run_id, "wl-a", "a", "t", "q", "sim-h100", 1, 1, "batch", 1,
        (PodOrder("w", 0, "sim-h100-h100-0", "h100", {"gpu": 1}),), duration,
    )  # fmt: skip


class Clock:
    def __init__(self) -> None:
        self.t = 1_000.0

    def __call__(self) -> float:
        return self.t


async def test_a_simulated_cluster_says_when_its_pods_next_change_and_when_a_run_came_or_went(tmp_path: Path) -> None:
    recorder, clock, changes = Recorder(), Clock(), []
    sim = SimCluster(
        "sim-h100", recorder.publish, "p", tmp_path / "sim.json", start_delay=1.0, clock=clock, resync_seconds=60
    )
    sim.on_change = lambda: changes.append(1)
    assert sim.next_due() == float("inf")  # nothing runs, no telemetry: nothing is ever due
    await sim.apply(_order("run-a-1", duration=5))
    assert changes == [1]
    assert sim.next_due() == 1_000.0  # the run's Pending report is owed now
    await sim.tick()
    assert sim.next_due() == 0.0  # the first inventory of the node it now knows is due at once
    assert await sim.emit_inventory() is True
    assert sim.next_due() == 1_001.0  # its pods start
    clock.t = 1_001.0
    await sim.tick()
    assert sim.next_due() == 1_006.0  # its pods end
    phases = [body["pods"][0]["phase"] for subject, body, _ in recorder.sent if subject.endswith(".pods")]  # type: ignore[index]
    assert phases == ["Pending", "Running"]
    assert await sim.delete("run-a-1") is True
    assert changes == [1, 1]


async def test_a_cluster_reads_its_file_again_only_after_another_process_wrote_it(tmp_path: Path) -> None:
    recorder, clock = Recorder(), Clock()
    mine = SimCluster("sim-h100", recorder.publish, "p", tmp_path / "sim.json", clock=clock)
    other = SimCluster("sim-h100", recorder.publish, "p", tmp_path / "sim.json", clock=clock)
    await mine.apply(_order("run-a-1"))
    await other.apply(_order("run-b-1"))  # written behind `mine`'s back
    assert await mine.list_owned() == {"run-a-1", "run-b-1"}
    assert await other.delete("run-a-1") is True
    assert await mine.list_owned() == {"run-b-1"}
    assert json.loads((tmp_path / "sim.json").read_text())["generation"] == 3


async def test_a_state_file_written_before_generations_is_read(tmp_path: Path) -> None:
    recorder = Recorder()
    first = SimCluster("sim-h100", recorder.publish, "p", tmp_path / "sim.json")
    await first.apply(_order("run-a-1"))
    data = json.loads((tmp_path / "sim.json").read_text())
    del data["generation"]
    (tmp_path / "sim.json").write_text(json.dumps(data))
    later = SimCluster("sim-h100", recorder.publish, "p", tmp_path / "sim.json")
    assert await later.list_owned() == {"run-a-1"}
    assert await later.apply(_order("run-a-1")) is False


async def test_the_simulated_fleet_wakes_when_a_run_is_created_not_on_a_tick(
    wiring: Wiring, client: TestClient, admin: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    setup_fleet(client, admin, h100_cluster("sim-h100", nodes=1))
    # Without the wake-up the loop would sleep an hour: nothing is due on an empty cluster.
    monkeypatch.setattr(sim_fleet_module, "REFRESH_SECONDS", 3600.0)
    recorder = Recorder()
    fleet = SimFleet(wiring, recorder, "p", start_delay=0.0)  # type: ignore[arg-type]
    fleet.set_active(True)
    stop = asyncio.Event()
    loop = asyncio.create_task(fleet.run(stop))
    try:
        await asyncio.sleep(0.3)  # the loop has refreshed and sleeps
        assert recorder.sent == []
        await fleet.clusters["sim-h100"].apply(_order("run-a-1"))
        await asyncio.wait_for(recorder.arrived.wait(), timeout=30)  # a bound for a hung loop only
        subject, body, _ = recorder.sent[0]
        assert (subject, body["pods"][0]["phase"]) == ("p.cluster.sim-h100.pods", "Running")  # type: ignore[index]
    finally:
        stop.set()
        await loop


class Held:
    """A cluster whose apply waits until released; deletes are recorded."""

    def __init__(self) -> None:
        self.applying = asyncio.Event()
        self.release = asyncio.Event()
        self.objects: set[str] = set()
        self.created = 0
        self.deleted: list[str] = []

    async def apply(self, order: RunOrder) -> bool:
        self.applying.set()
        await self.release.wait()
        if order.run_id in self.objects:
            return False
        self.objects.add(order.run_id)
        self.created += 1
        return True

    async def delete(self, run_id: str) -> bool:
        self.deleted.append(run_id)
        found = run_id in self.objects
        self.objects.discard(run_id)
        return found

    async def list_owned(self) -> set[str]:
        return set(self.objects)


async def test_a_run_that_ends_while_a_pass_applies_it_is_not_torn_down_before_the_apply(
    wiring: Wiring, client: TestClient, two_clusters: dict[str, str]
) -> None:
    """The race the separate teardown task opened: a pass loads a run as live (its earlier apply's
    record was lost, its pods already done), the run ends, a teardown deletes its objects, then the
    pass's apply creates them a second time. Teardowns leave the runs a pass has in flight alone."""
    client.post("/v1/workloads", json=gang("g0", "vision-train", replicas=1), headers=two_clusters)
    _admit(wiring)
    with wiring.uow() as uow:
        (order,) = uow.runs.to_dispatch(10)
    cluster = Held()
    cluster.objects.add(order.run_id)  # applied before, its record lost
    cluster.created = 1
    drivers = {order.cluster: cluster}
    prefix = wiring.settings.subject_prefix
    in_flight = InFlight()
    dispatching = asyncio.create_task(dispatch_pending(wiring.uow, drivers, prefix, utc_now, in_flight=in_flight))
    await asyncio.wait_for(cluster.applying.wait(), 10)
    with wiring.uow() as uow:  # the run ends while the pass is applying it
        uow.runs.end_all(
            [(order.run_id, "all pods succeeded", EndCause.SUCCEEDED)],
            ("admitted", "dispatching", "running"),
            "succeeded",
            utc_now(),
        )
        uow.commit()
    await tear_down_ended(wiring.uow, drivers, utc_now, in_flight=in_flight)
    assert cluster.deleted == []  # in flight: left for the next teardown pass
    cluster.release.set()
    await asyncio.wait_for(dispatching, 10)
    await tear_down_ended(wiring.uow, drivers, utc_now, in_flight=in_flight)
    assert (cluster.created, cluster.deleted, cluster.objects) == (1, [order.run_id], set())
