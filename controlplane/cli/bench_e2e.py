"""`gpufleet dev bench e2e`: a burst of short gangs through the whole live path, to `succeeded`.

The parts run as in production, each in its own process (`gpufleet server run scheduler`,
`dispatcher` with the simulated clusters, `ingest`, `relay`, and `api` for `--via rest`), on
PostgreSQL and a nats-server of the bench's own. The bench registers a fleet of simulated clusters,
a queue tree of cohorts, teams and tens of queues, and priority classes; then submits gangs of mixed
sizes and classes at a fixed rate (by REST or NATS), watches the clusters' pod reports go by on NATS,
and waits until every gang has ended. The figures come from SQL (`bench_e2e_figures`), the CPU time
from /proc. Figures are measured, never asserted: the command reports what it saw, hit or miss.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import click
from nats.aio.msg import Msg
from sqlalchemy import func, select

from adapters.nats.connection import connect
from adapters.nats.server import free_port
from adapters.nats.topology import STORED
from adapters.sql.tables import WorkloadRow
from controlplane.bootstrap import Wiring, utc_now
from controlplane.cli.bench_e2e_figures import burst_figures, deadlocks, percentile
from controlplane.cli.bench_submit import PREFIX, _env, _spawn, _stop, _wait_ready, bench_environment
from controlplane.service import admin
from controlplane.service.auth import issue_token
from controlplane.service.cluster_specs import ClusterSpec
from controlplane.service.commands import CohortSpec, PriorityClassSpec, QueueSpec, TeamSpec, TokenSpec
from controlplane.service.scheduling import lease_gap
from controlplane.workers.dispatch_loop import DISPATCHER_LEASE

GPU_MODEL = "H100-80GB"
GPUS_PER_NODE = 8
TEAMS_PER_COHORT = 2
# (name, value, preemptible, share of the gangs): most work is batch; some may be preempted cheaply,
# some must not be.
CLASSES = (("low", 10, True, 0.3), ("batch", 100, True, 0.55), ("high", 1000, False, 0.15))
# (replicas, GPUs per pod, share of the gangs): many small gangs, a few whole-node and multi-node ones.
SHAPES = ((1, 1, 0.3), (1, 2, 0.2), (1, 4, 0.15), (1, 8, 0.15), (2, 8, 0.12), (4, 8, 0.08))
FINISHED = ("succeeded", "failed", "cancelled")
POLL = 0.5  # seconds between looks at the database while the burst runs
PUBLISH_TIMEOUT = 30.0  # seconds a NATS submit waits for its acknowledgement


@dataclass(frozen=True)
class BurstShape:
    gangs: int
    queues: int
    cohorts: int
    clusters: int
    nodes_per_cluster: int
    rate: float  # submits per second
    min_seconds: float
    max_seconds: float
    seed: int

    @property
    def fleet_gpus(self) -> int:
        return self.clusters * self.nodes_per_cluster * GPUS_PER_NODE

    @property
    def teams(self) -> int:
        return self.cohorts * TEAMS_PER_COHORT

    @property
    def team_share(self) -> int:
        return self.fleet_gpus // self.teams

    @property
    def queue_share(self) -> int:
        """Each queue's guarantee: its team's share split evenly (non-preemptible work runs only within it)."""
        return self.team_share // max(1, -(-self.queues // self.teams))


@dataclass(frozen=True)
class Gang:
    index: int
    team: str
    queue: str
    priority_class: str
    replicas: int
    gpus: int
    seconds: float
    at: float  # seconds after the burst's start the submit is due

    def body(self) -> dict[str, Any]:
        return {
            "name": f"e2e-{self.index}",
            "queue": self.queue,
            "priority_class": self.priority_class,
            "duration_seconds": self.seconds,
            "pod_sets": [{"name": "workers", "replicas": self.replicas, "gpus": self.gpus}],
        }


def _queue_name(i: int) -> str:
    return f"q{i:03d}"


def _team_of_queue(shape: BurstShape, i: int) -> str:
    return f"team{i % shape.teams:02d}"


def plan(shape: BurstShape) -> list[Gang]:
    """The burst: `gangs` gangs, due one every 1/rate seconds, each in a random queue with a random
    class, shape and duration (seeded: the same burst every run)."""
    rng = random.Random(shape.seed)
    per_cluster = shape.nodes_per_cluster * GPUS_PER_NODE
    shapes = [s for s in SHAPES if s[0] * s[1] <= per_cluster]  # a gang runs on one cluster
    gangs = []
    for i in range(shape.gangs):
        queue = rng.randrange(shape.queues)
        replicas, gpus, _ = rng.choices(shapes, weights=[s[2] for s in shapes])[0]
        # A non-preemptible gang bigger than its queue's guarantee could never run.
        classes = [c for c in CLASSES if c[2] or replicas * gpus <= shape.queue_share]
        cls = rng.choices([c[0] for c in classes], weights=[c[3] for c in classes])[0]
        seconds = round(rng.uniform(shape.min_seconds, shape.max_seconds), 1)
        gangs.append(
            Gang(i, _team_of_queue(shape, queue), _queue_name(queue), cls, replicas, gpus, seconds, i / shape.rate)
        )
    return gangs


def register(wiring: Wiring, shape: BurstShape) -> dict[str, str]:
    """The simulated clusters, the priority classes, the cohorts, teams (each guaranteed an equal share
    of the fleet, which it lends while it does not use it) and queues. Returns each team's token."""
    now = utc_now()
    for i in range(shape.clusters):
        pool = {
            "name": "h100",
            "gpu_model": GPU_MODEL,
            "gpus_per_node": GPUS_PER_NODE,
            "cpu_millis": 192_000,
            "memory_mib": 2_000_000,
            "node_count": shape.nodes_per_cluster,
        }
        admin.create_cluster(
            wiring.uow(), ClusterSpec.model_validate({"name": f"sim-{i:02d}", "pools": [pool]}), "bench", now
        )
    for name, value, preemptible, _ in CLASSES:
        cls = PriorityClassSpec(name=name, value=value, preemptible=preemptible, is_default=name == "batch")
        admin.put_priority_class(wiring.uow(), cls, "bench", now)
    for c in range(shape.cohorts):
        admin.create_tree_node(wiring.uow(), "cohort", CohortSpec(name=f"cohort{c}"), "bench", now)
    tokens: dict[str, str] = {}
    for t in range(shape.teams):
        team = f"team{t:02d}"
        team_guarantee: dict[str, float] = {GPU_MODEL: shape.team_share}
        spec = TeamSpec(name=team, cohort=f"cohort{t % shape.cohorts}", guaranteed=team_guarantee)
        admin.create_tree_node(wiring.uow(), "team", spec, "bench", now)
        _, tokens[team] = issue_token(wiring.uow(), TokenSpec(name=f"bench-{team}", team=team), "bench", now)
    for q in range(shape.queues):
        guaranteed: dict[str, float] = {GPU_MODEL: shape.queue_share}
        spec_q = QueueSpec(name=_queue_name(q), team=_team_of_queue(shape, q), guaranteed=guaranteed)
        admin.create_tree_node(wiring.uow(), "queue", spec_q, "bench", now)
    return tokens


class PodReports:
    """When the bench first saw each run's cluster report its pods running (a core NATS subscription
    beside the ingest's durable consumer: the reports as the clusters sent them)."""

    def __init__(self) -> None:
        self.running: dict[str, datetime] = {}

    def seen(self, payload: bytes) -> None:
        try:
            report = json.loads(payload)
            if any(pod.get("phase") == "Running" for pod in report["pods"]):
                self.running.setdefault(str(report["run_id"]), datetime.now(UTC))
        except (ValueError, KeyError, TypeError, AttributeError):
            pass  # not a pod report the simulator wrote; ingest judges those


@dataclass
class Submits:
    """How late each submit was sent after its due time, and the outcome of each (HTTP status, or
    `published` for NATS)."""

    lateness: list[float] = field(default_factory=list)
    outcomes: dict[str, int] = field(default_factory=dict)

    def count(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    @property
    def accepted(self) -> int:
        return self.outcomes.get("201", 0) + self.outcomes.get("published", 0)


async def _submit_rest(
    base: str, tokens: dict[str, str], gangs: Sequence[Gang], clients: int, t0: float, submits: Submits
) -> None:
    """Each gang POSTed at its due time by one of `clients` keep-alive connections."""
    pending = iter(gangs)

    async def client(http: aiohttp.ClientSession) -> None:
        for gang in pending:
            await asyncio.sleep(max(0.0, t0 + gang.at - time.monotonic()))
            submits.lateness.append(time.monotonic() - t0 - gang.at)
            headers = {"Authorization": f"Bearer {tokens[gang.team]}", "Idempotency-Key": f"e2e-{gang.index}"}
            try:
                async with http.post(f"{base}/v1/workloads", json=gang.body(), headers=headers) as response:
                    await response.read()
                    submits.count(str(response.status))
            except (aiohttp.ClientError, TimeoutError) as exc:  # counted: a refused submit is a figure too
                submits.count(type(exc).__name__)

    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as http:
        await asyncio.gather(*(client(http) for _ in range(clients)))


async def _submit_nats(nats_url: str, gangs: Sequence[Gang], t0: float, submits: Submits) -> None:
    """Each gang published to JetStream at its due time (acknowledged concurrently, so a slow
    acknowledgement delays no later submit). Whether ingest accepted it shows in SQL only."""
    nc = await connect(nats_url, "bench-e2e-submitter")
    js = nc.jetstream()

    async def publish(gang: Gang) -> None:
        subject = f"{PREFIX}.submit.{gang.team}.{gang.queue}"
        try:
            body, headers = json.dumps(gang.body()).encode(), {"Gpufleet-Msg-Id": f"e2e-{gang.index}"}
            # The inbound gateway (in the busy ingest process) answers for the stream: wait for it as a
            # patient client would, rather than count a slow answer as a lost submit.
            await js.publish(subject, body, headers=headers, timeout=PUBLISH_TIMEOUT)
            submits.count("published")
        except Exception as exc:  # counted: a lost publish is a figure too
            submits.count(type(exc).__name__)

    acks: list[asyncio.Task[None]] = []
    try:
        for gang in gangs:
            await asyncio.sleep(max(0.0, t0 + gang.at - time.monotonic()))
            submits.lateness.append(time.monotonic() - t0 - gang.at)
            acks.append(asyncio.create_task(publish(gang)))
        await asyncio.gather(*acks)
    finally:
        await nc.close()


def _cpu_seconds(processes: Sequence[subprocess.Popen[bytes]]) -> list[float]:
    """User and system CPU time each process has used so far (Linux /proc; 0 once it has gone)."""
    ticks = os.sysconf("SC_CLK_TCK")
    used = []
    for process in processes:
        try:
            fields = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            used.append(0.0)
            continue
        used.append((int(fields[11]) + int(fields[12])) / ticks)  # utime, stime (fields 14 and 15 of stat)
    return used


def _wait_for_leases(wiring: Wiring, processes: Sequence[subprocess.Popen[bytes]], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in processes):
            raise click.ClickException("a gpufleet process exited while starting; see its log in the work directory")
        if all(lease_gap(wiring.uow, lease, utc_now()) is None for lease in ("scheduler", DISPATCHER_LEASE)):
            return
        time.sleep(0.2)
    raise click.ClickException(f"no scheduler and dispatcher held their leases within {timeout:.0f} s")


def _in_flight(wiring: Wiring) -> dict[str, int]:
    with wiring.engine.connect() as conn:
        return dict(conn.execute(select(WorkloadRow.state, func.count()).group_by(WorkloadRow.state)).all())


async def _burst(
    wiring: Wiring,
    submit: Callable[[float], Coroutine[Any, Any, None]],
    submits: Submits,
    nats_url: str,
    timeout: float,
) -> dict[str, Any]:
    """Submit the burst while the pod reports are watched and the states sampled; until every
    accepted submit is a workload that has ended, or `timeout` has passed since the first submit."""
    reports = PodReports()
    nc = await connect(nats_url, "bench-e2e-watcher")

    async def seen(msg: Msg) -> None:
        reports.seen(msg.data)

    await nc.subscribe(f"{PREFIX}.{STORED}.cluster.*.pods", cb=seen)
    peaks: dict[str, int] = {}
    t0 = time.monotonic()
    started = datetime.now(UTC)
    submitting = asyncio.create_task(submit(t0))
    try:
        while time.monotonic() - t0 < timeout:
            await asyncio.sleep(POLL)
            counts = await asyncio.to_thread(_in_flight, wiring)
            for state, count in counts.items():
                peaks[state] = max(peaks.get(state, 0), count)
            live = sum(n for s, n in counts.items() if s not in FINISHED)
            peaks["in_flight"] = max(peaks.get("in_flight", 0), live)
            if submitting.done() and sum(counts.get(s, 0) for s in FINISHED) >= submits.accepted:
                break
        await submitting
    finally:
        submitting.cancel()
        await nc.close()
    return {"started": started, "running_seen": reports.running, "peaks": peaks}


def run_e2e(
    shape: BurstShape, via: str, clients: int, database_url: str, start_delay: float, timeout: float
) -> dict[str, Any]:
    gangs = plan(shape)
    with bench_environment("e2e", database_url) as env:
        if env.wiring.engine.dialect.name != "postgresql":
            raise click.ClickException("bench e2e runs on PostgreSQL: give --database-url postgresql://…")
        tokens = register(env.wiring, shape)
        port = free_port()
        child_env = {**_env(env.url, env.nats.url, env.workdir, port), "GPUFLEET_SIM_START_DELAY": str(start_delay)}
        components = ["scheduler", "dispatcher", "ingest", "relay"] + (["api"] if via == "rest" else [])
        processes = [_spawn(["server", "run", c], child_env, env.workdir / f"{c}.log") for c in components]
        try:
            if via == "rest":
                _wait_ready(f"http://127.0.0.1:{port}", processes)
            _wait_for_leases(env.wiring, processes)
            deadlocks_before, cpu_before = deadlocks(env.wiring.engine), _cpu_seconds(processes)

            submits = Submits()

            async def submit(t0: float) -> None:
                if via == "rest":
                    await _submit_rest(f"http://127.0.0.1:{port}", tokens, gangs, clients, t0, submits)
                else:
                    await _submit_nats(env.nats.url, gangs, t0, submits)

            seen = asyncio.run(_burst(env.wiring, submit, submits, env.nats.url, timeout))
            cpu_by_process = [after - before for after, before in zip(_cpu_seconds(processes), cpu_before, strict=True)]
            cpu = sum(cpu_by_process)
            time.sleep(1.5)  # PostgreSQL publishes a backend's statistics within a second of its transaction
            deadlock_count = deadlocks(env.wiring.engine) - deadlocks_before
            figures = burst_figures(env.wiring.engine, seen["started"], seen["running_seen"])
        finally:
            _stop(processes)
    work = sum(g.replicas * g.gpus * g.seconds for g in gangs)
    lateness = submits.lateness
    return {
        "via": via,
        "gangs": shape.gangs,
        "queues": shape.queues,
        "cohorts": shape.cohorts,
        "clusters": shape.clusters,
        "fleet_gpus": shape.fleet_gpus,
        "submit_rate": shape.rate,
        "sim_start_delay_seconds": start_delay,
        "floor_seconds": round(work / shape.fleet_gpus, 2),
        "wall_seconds": figures.pop("wall_seconds"),
        "complete": sum(figures["states"].get(s, 0) for s in FINISHED) >= shape.gangs,
        "submit_outcomes": dict(sorted(submits.outcomes.items())),
        "submit_lateness_seconds": {"p50": percentile(lateness, 50), "p95": percentile(lateness, 95)},
        **figures,
        "peaks": seen["peaks"],
        "deadlocks": deadlock_count,
        "cpu_seconds": round(cpu, 1),
        "cpu_seconds_per_workload": round(cpu / shape.gangs, 4),
        "gpu_seconds_of_work": round(work, 1),
        "cpu_seconds_by_process": {c: round(t, 1) for c, t in zip(components, cpu_by_process, strict=True)},
    }


@click.command("e2e")
@click.option("--via", type=click.Choice(["rest", "nats"]), default="rest", show_default=True)
@click.option("--database-url", required=True, help="an empty PostgreSQL database (migrated by the bench)")
@click.option("--gangs", default=1000, show_default=True, type=click.IntRange(1, 200_000))
@click.option("--queues", default=30, show_default=True, type=click.IntRange(1, 1000))
@click.option("--cohorts", default=3, show_default=True, type=click.IntRange(1, 100))
@click.option("--clusters", default=4, show_default=True, type=click.IntRange(1, 100))
@click.option("--nodes-per-cluster", default=16, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--rate", default=50.0, show_default=True, type=click.FloatRange(0.1, 100_000), help="submits/s")
@click.option("--clients", default=16, show_default=True, type=click.IntRange(1, 1024), help="REST connections")
@click.option("--min-seconds", default=1.0, show_default=True, type=click.FloatRange(0.1, 3600), help="gang work")
@click.option("--max-seconds", default=3.0, show_default=True, type=click.FloatRange(0.1, 3600), help="gang work")
@click.option("--start-delay", default=0.2, show_default=True, type=click.FloatRange(0, 60), help="sim pod start")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--timeout", default=600.0, show_default=True, type=click.FloatRange(1.0), help="give up after")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def bench_e2e(
    via: str,
    database_url: str,
    gangs: int,
    queues: int,
    cohorts: int,
    clusters: int,
    nodes_per_cluster: int,
    rate: float,
    clients: int,
    min_seconds: float,
    max_seconds: float,
    start_delay: float,
    seed: int,
    timeout: float,
    as_json: bool,
) -> None:
    """A burst of short gangs through submit, scheduler, dispatcher, simulated clusters and ingest."""
    if max_seconds < min_seconds:
        raise click.BadParameter("below --min-seconds", param_hint="--max-seconds")
    shape = BurstShape(gangs, queues, cohorts, clusters, nodes_per_cluster, rate, min_seconds, max_seconds, seed)
    result = run_e2e(shape, via, clients, database_url, start_delay, timeout)
    if as_json:
        click.echo(json.dumps(result))
        return
    for key, value in result.items():
        click.echo(f"{key:>32}: {value}")
