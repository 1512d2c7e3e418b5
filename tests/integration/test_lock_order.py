"""One lock order for every writer of workloads and runs (docs/concepts/reliability-security.md, "One
lock order"), proven on PostgreSQL: the writers run at once, each in its own thread on its own
connection, over the same workloads and runs, round after round, and the server records no
deadlock (`pg_stat_database.deadlocks` of the test database) while no writer meets or retries one.

The writers are the production code paths: the scheduler's decision apply (evictions, idle
reclaims, admissions, pending reasons), the dispatcher (`dispatch_once` over a driver that answers
at once), ingest (`handle_batch` of pod reports and cancels in any order), the API's cancel, and the
gang start timeout's requeue. The control test adds a writer that takes the opposite order (a run,
then its workload, ids descending) and sees the same measurement catch its deadlocks, so the zero
above is a measurement and not an absence of concurrency.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, create_engine, select, text

from adapters.sql.engine import make_engine, make_session_factory
from adapters.sql.tables import ClusterRow, NodeRow, RunRow, WorkloadRow
from adapters.sql.uow import SqlUnitOfWork
from controlplane.bootstrap import Wiring, utc_now
from controlplane.core.decision import Admission, Decision, EndCause, Eviction, EvictionKind
from controlplane.domain.model import PodAssignment
from controlplane.service import ingest
from controlplane.service import workloads as workload_service
from controlplane.service.cloud_state import StalledRun
from controlplane.service.dispatch import dispatch_once
from controlplane.service.errors import ServiceError, TransactionConflict
from controlplane.service.gang_timeout import requeue_run
from controlplane.service.ingest_messages import InboundMessage
from controlplane.service.ingest_submits import team_principal
from controlplane.service.metrics import NoMetrics, RetryCause, Writer
from controlplane.service.ports import PendingRecord, RunOrder, UnitOfWork
from controlplane.service.retries import retrying
from controlplane.service.scheduling import LIVE_RUN_STATES, apply_decision
from tests.integration.fleet import Tenant, gang

WRITERS_APP = "gpufleet-lock-order-writers"  # application_name of the writers' connections
CLUSTER = "sim-h100"
EPOCH = 1
WORKLOADS_PER_ROUND = 16
ROUNDS = 8
OPERATIONS = 6  # per writer and round
LIVE_WORKLOAD_STATES = ("admitted", "dispatching", "running")


@pytest.fixture
def database_url(empty_postgresql: str) -> str:
    """PostgreSQL only: SQLite has one writer at a time, nothing to order."""
    return empty_postgresql


class RecordedRetries(NoMetrics):
    def __init__(self) -> None:
        self.retries: list[tuple[Writer, RetryCause]] = []
        self.lock = threading.Lock()

    def db_retry(self, writer: Writer, cause: RetryCause) -> None:
        with self.lock:
            self.retries.append((writer, cause))


class InstantDriver:
    """A cluster that takes every order at once: the dispatcher's writes are all that is measured."""

    async def apply(self, order: RunOrder) -> bool:
        return True

    async def delete(self, run_id: str) -> bool:
        return True

    async def list_owned(self) -> set[str]:
        return set()


@dataclass
class Fleet:
    uow: Callable[[], UnitOfWork]
    prefix: str
    team: str
    queue: str
    cluster_id: str
    node_ids: list[str]
    metrics: RecordedRetries = field(default_factory=RecordedRetries)
    conflicts: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def live_runs(self) -> list[tuple[str, str]]:
        with self.uow() as uow:
            rows = uow.session.execute(  # type: ignore[attr-defined]
                select(RunRow.id, RunRow.workload_id).where(RunRow.state.in_(LIVE_RUN_STATES))
            ).all()
        return [(run_id, workload_id) for run_id, workload_id in rows]

    def queued(self) -> list[str]:
        with self.uow() as uow:
            return list(uow.session.scalars(select(WorkloadRow.id).where(WorkloadRow.state == "queued")))  # type: ignore[attr-defined]

    def admission(self, workload_id: str, rng: random.Random) -> Admission:
        node = rng.choice(self.node_ids)
        return Admission(workload_id, self.cluster_id, (PodAssignment("workers", 0, node, {"gpu": 1}),))


# -- the writers: one operation each, on what the store holds now -----------------------------------


def schedule(fleet: Fleet, rng: random.Random) -> None:
    """Evict (preempt or reclaim idle) some live runs and admit some queued workloads in one
    transaction, with the pending reasons of the rest: the scheduler's apply."""
    live, queued = fleet.live_runs(), fleet.queued()
    victims = rng.sample(live, min(len(live), rng.randint(1, 4)))
    admitted = rng.sample(queued, min(len(queued), rng.randint(1, 4)))
    evictions = tuple(
        Eviction(workload_id, run_id, rng.choice((EvictionKind.PREEMPT, EvictionKind.IDLE)), "wl-beneficiary")
        for run_id, workload_id in victims
    )
    decision = Decision(admissions=tuple(fleet.admission(w, rng) for w in admitted), evictions=evictions)
    waiting = [PendingRecord(w, f"no fit ({rng.randint(0, 3)})", "no-fit", {}) for w in queued if w not in admitted]

    def write() -> None:
        with fleet.uow() as uow:
            apply_decision(uow, decision, EPOCH, fleet.prefix, utc_now())
            uow.workloads.record_pending(waiting)
            uow.commit()

    retrying(Writer.SCHEDULER, write, fleet.metrics)


def dispatch(fleet: Fleet, rng: random.Random) -> None:
    drivers = {CLUSTER: InstantDriver()}
    retrying(
        Writer.DISPATCHER,
        lambda: asyncio.run(dispatch_once(fleet.uow, drivers, fleet.prefix, utc_now, batch=rng.randint(2, 8))),  # type: ignore[arg-type]
        fleet.metrics,
    )


def report(fleet: Fleet, rng: random.Random) -> None:
    """A batch of pod reports (running, succeeded, failed) and a cancel, in any order: ingest."""
    live = fleet.live_runs()
    messages = []
    for run_id, _ in rng.sample(live, min(len(live), rng.randint(2, 8))):
        phase = rng.choice(("Running", "Running", "Succeeded", "Failed"))
        body = {"run_id": run_id, "epoch": EPOCH, "pods": [{"pod_set": "workers", "index": 0, "phase": phase}]}
        messages.append(_message(f"{fleet.prefix}.cluster.{CLUSTER}.pods", body))
    if live and rng.random() < 0.5:
        _, workload_id = rng.choice(live)
        messages.append(_message(f"{fleet.prefix}.cancel.{fleet.team}", {"workload_id": workload_id}))
    rng.shuffle(messages)
    retrying(
        Writer.INGEST,
        lambda: ingest.handle_batch(fleet.uow(), messages, fleet.prefix, utc_now()),
        fleet.metrics,
    )


def cancel(fleet: Fleet, rng: random.Random) -> None:
    live = fleet.live_runs()
    if not live:
        return
    _, workload_id = rng.choice(live)
    with fleet.uow() as uow:
        principal = team_principal(uow, fleet.team)
    assert principal is not None

    def write() -> None:
        with contextlib.suppress(ServiceError):  # finished meanwhile: a 409, as the API answers
            workload_service.cancel(fleet.uow(), principal, workload_id, "test", fleet.prefix, utc_now())

    retrying(Writer.API, write, fleet.metrics)


def rescue(fleet: Fleet, rng: random.Random) -> None:
    """End live runs whose pods did not all start in time and requeue them: the gang start timeout."""
    for run_id, workload_id in _some(fleet.live_runs(), rng, 3):
        run = StalledRun(run_id, workload_id, fleet.queue, CLUSTER, utc_now())
        retrying(
            Writer.DISPATCHER,
            lambda run=run: requeue_run(
                fleet.uow, fleet.prefix, run, "too slow", EndCause.GANG_START_TIMEOUT, utc_now(), running_too=True
            ),
            fleet.metrics,
        )


WRITERS: dict[str, Callable[[Fleet, random.Random], None]] = {
    "scheduler": schedule,
    "dispatcher": dispatch,
    "ingest": report,
    "api-cancel": cancel,
    "gang-timeout": rescue,
}


def _some(items: list[tuple[str, str]], rng: random.Random, most: int) -> list[tuple[str, str]]:
    return rng.sample(items, min(len(items), rng.randint(1, most)))


def _message(subject: str, body: dict[str, object]) -> InboundMessage:
    return InboundMessage(subject, json.dumps(body).encode(), {}, uuid.uuid4().hex)


# -- running them --------------------------------------------------------------------------------


@pytest.fixture
def fleet(wiring: Wiring, client: TestClient, tenant: Tenant) -> Iterator[Fleet]:
    engine = make_engine(wiring.settings.database_url, connect_args={"application_name": WRITERS_APP})
    sessions = make_session_factory(engine)
    with wiring.uow() as uow:
        cluster_id = uow.session.scalar(select(ClusterRow.id).where(ClusterRow.name == CLUSTER))  # type: ignore[attr-defined]
        node_ids = list(uow.session.scalars(select(NodeRow.id).where(NodeRow.cluster_id == cluster_id)))  # type: ignore[attr-defined]
    assert cluster_id is not None
    assert node_ids
    yield Fleet(
        lambda: SqlUnitOfWork(sessions), wiring.settings.subject_prefix, tenant.team, tenant.queue, cluster_id, node_ids
    )
    engine.dispose()


def _submit(client: TestClient, tenant: Tenant, count: int) -> None:
    for _ in range(count):
        body = gang(f"g-{uuid.uuid4().hex[:8]}", tenant.queue, replicas=1, gpus=1)
        response = client.post("/v1/workloads", json=body, headers=tenant.headers)
        assert response.status_code in (200, 201), response.text


def _round(fleet: Fleet, writers: dict[str, Callable[[Fleet, random.Random], None]], seed: int) -> None:
    """Every writer at once, `OPERATIONS` operations each; a conflict that survives the retries, or
    any other failure, is recorded (the test fails on both)."""
    start = threading.Barrier(len(writers))

    def work(name: str, writer: Callable[[Fleet, random.Random], None], rng: random.Random) -> None:
        start.wait()
        for _ in range(OPERATIONS):
            try:
                writer(fleet, rng)
            except TransactionConflict as exc:
                fleet.conflicts.append(f"{name}: {exc.cause}")
            except Exception as exc:  # a failure of the test's premise: reported, never swallowed
                fleet.failures.append(f"{name}: {type(exc).__name__}: {exc}")

    threads = [
        threading.Thread(target=work, args=(name, writer, random.Random(seed * 100 + i)))
        for i, (name, writer) in enumerate(writers.items())
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
        assert not thread.is_alive(), "a writer hangs"


def _deadlocks(admin: Engine, database: str) -> int:
    """The server's count of deadlocks in `database`, once every writer's connection has ended (a
    backend reports its statistics when it exits at the latest)."""
    with admin.connect() as conn:
        for _ in range(100):
            writers = conn.execute(
                text("SELECT count(*) FROM pg_stat_activity WHERE datname = :db AND application_name = :app"),
                {"db": database, "app": WRITERS_APP},
            ).scalar_one()
            if writers == 0:
                break
            time.sleep(0.05)
        conn.execute(text("SELECT pg_stat_clear_snapshot()"))
        return int(
            conn.execute(
                text("SELECT deadlocks FROM pg_stat_database WHERE datname = :db"), {"db": database}
            ).scalar_one()
        )


@pytest.fixture
def admin_engine(database_url: str) -> Iterator[tuple[Engine, str]]:
    engine = create_engine(database_url.rsplit("/", 1)[0] + "/postgres", isolation_level="AUTOCOMMIT")
    yield engine, database_url.rsplit("/", 1)[1]
    engine.dispose()


def _consistency_errors(fleet: Fleet) -> list[str]:
    """A live workload has exactly one live run, and a live run belongs to a live workload."""
    with fleet.uow() as uow:
        rows = uow.session.execute(  # type: ignore[attr-defined]
            text(
                "SELECT w.id, w.state, count(r.id) FROM workloads w"
                " LEFT JOIN runs r ON r.workload_id = w.id AND r.state IN ('admitted', 'dispatching', 'running')"
                " GROUP BY w.id, w.state"
            )
        ).all()
    return [
        f"{workload_id} is {state} with {live} live runs"
        for workload_id, state, live in rows
        if (state in LIVE_WORKLOAD_STATES) != (live == 1) or live > 1
    ]


def _play(
    fleet: Fleet,
    client: TestClient,
    tenant: Tenant,
    writers: dict[str, Callable[[Fleet, random.Random], None]],
    rounds: int,
    until: Callable[[], bool] = lambda: False,
) -> None:
    rng = random.Random(7)
    for number in range(rounds):
        _submit(client, tenant, WORKLOADS_PER_ROUND)
        # Every new workload admitted first, so the writers find live runs to fight over.
        with fleet.uow() as uow:
            queued = fleet.queued()
            apply_decision(
                uow, Decision(admissions=tuple(fleet.admission(w, rng) for w in queued)), EPOCH, fleet.prefix, utc_now()
            )
            uow.commit()
        _round(fleet, writers, number)
        if until():
            return


def _deadlocks_met(fleet: Fleet) -> list[str]:
    """Deadlocks the writers met: those retried, and those that survived the retries."""
    retried = [f"{writer}: retried" for writer, cause in fleet.metrics.retries if cause is RetryCause.DEADLOCK]
    return retried + [c for c in fleet.conflicts if c.endswith("deadlock")]


def test_the_writers_never_deadlock(
    fleet: Fleet, client: TestClient, tenant: Tenant, admin_engine: tuple[Engine, str]
) -> None:
    engine, database = admin_engine
    before = _deadlocks(engine, database)
    _play(fleet, client, tenant, WRITERS, ROUNDS)
    deadlocks = _deadlocks(engine, database) - before
    print(  # the figures, for `pytest -s`
        f"lock order: {ROUNDS} rounds x {len(WRITERS)} writers x {OPERATIONS} operations;"
        f" deadlocks {deadlocks}, deadlock retries {len(_deadlocks_met(fleet))}, conflicts left {len(fleet.conflicts)}"
    )
    assert not fleet.failures, fleet.failures[:5]
    assert deadlocks == 0, f"{deadlocks} deadlocks; met by the writers: {_deadlocks_met(fleet)[:10]}"
    assert _deadlocks_met(fleet) == []
    assert not fleet.conflicts
    assert _consistency_errors(fleet) == []
    with fleet.uow() as uow:  # the writers did write: every kind of end happened, and runs started
        states = dict(
            uow.session.execute(text("SELECT state, count(*) FROM runs GROUP BY state")).all()  # type: ignore[attr-defined]
        )
        started = uow.session.scalar(text("SELECT count(*) FROM runs WHERE started_at IS NOT NULL"))  # type: ignore[attr-defined]
    assert {"preempted", "succeeded", "failed", "cancelled"} <= set(states), states
    assert started


def opposite_order(fleet: Fleet, rng: random.Random) -> None:
    """A writer that breaks the order: each run before its workload, ids descending."""
    pairs = sorted(_some(fleet.live_runs(), rng, 6), reverse=True)
    with fleet.uow() as uow:
        for run_id, workload_id in pairs:
            uow.session.execute(text("UPDATE runs SET message = message WHERE id = :id"), {"id": run_id})  # type: ignore[attr-defined]
            uow.session.execute(text("SELECT pg_sleep(0.002)"))  # type: ignore[attr-defined]
            uow.session.execute(text("UPDATE workloads SET reason = reason WHERE id = :id"), {"id": workload_id})  # type: ignore[attr-defined]
        uow.commit()


def test_a_writer_taking_the_opposite_order_is_caught(
    fleet: Fleet, client: TestClient, tenant: Tenant, admin_engine: tuple[Engine, str]
) -> None:
    """The control: the same measurement sees deadlocks once one writer takes the opposite order."""
    engine, database = admin_engine
    before = _deadlocks(engine, database)
    writers = {**WRITERS, "opposite": opposite_order, "opposite-2": opposite_order}
    _play(fleet, client, tenant, writers, ROUNDS, until=lambda: bool(_deadlocks_met(fleet)))
    assert _deadlocks_met(fleet), "no writer met a deadlock"
    assert _deadlocks(engine, database) - before >= 1
