"""`gpufleet dev bench submit`: the submit path end to end, on a real nats-server and a real database.

`--via rest`: `--api-processes` real `gpufleet server serve` processes share one port (SO_REUSEPORT, as
replicas behind a Service would) and `--clients` concurrent clients POST gangs to them; latency is
measured per request, from the client. `--via nats`: one `gpufleet server run ingest` process is
started and warmed up with one submit, then paused while `--count` submits are stored in the inbound
stream (as the gateway stores them, as fast as one client can), and timed from its resumption until
every one is a workload in SQL. The fleet is synthetic (`--clusters` x one pool, `--nodes` in all),
so the submit-time fleet check works at fleet scale. The client and the servers share this machine's
cores: the figures are what this machine does, reported hit or miss, never asserted.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import click
import httpx
from sqlalchemy import Engine, func, select, text

from adapters.nats.connection import INBOUND_ID_HEADER, connect
from adapters.nats.server import NatsServerProcess, free_port
from adapters.nats.topology import ensure_topology, stored_subject
from adapters.sql.migrate import upgrade_to_head
from adapters.sql.tables import WorkloadRow
from controlplane.bootstrap import Wiring, utc_now
from controlplane.config import Settings
from controlplane.service import admin
from controlplane.service.auth import issue_token
from controlplane.service.cluster_specs import ClusterSpec
from controlplane.service.commands import PriorityClassSpec, QueueSpec, TeamSpec, TokenSpec

PREFIX = "bench"


@dataclass(frozen=True)
class BenchEnvironment:
    workdir: Path
    url: str
    nats: NatsServerProcess
    wiring: Wiring


@contextmanager
def bench_environment(name: str, database_url: str | None) -> Iterator[BenchEnvironment]:
    """A scratch directory, a migrated database (a new SQLite file unless `database_url` names one)
    and a nats-server of its own, torn down after the bench."""
    with tempfile.TemporaryDirectory(prefix=f"gpufleet-bench-{name}-") as tmp:
        workdir = Path(tmp)
        url = database_url or f"sqlite:///{workdir / 'bench.db'}"
        upgrade_to_head(url)
        nats = NatsServerProcess(free_port(), workdir / "nats")
        nats.start()
        wiring = Wiring(Settings(database_url=url, nats_url=nats.url, state_dir=workdir, subject_prefix=PREFIX))
        try:
            yield BenchEnvironment(workdir, url, nats, wiring)
        finally:
            wiring.close()
            nats.stop()


TEAM, QUEUE = "bench", "bench-train"


def _percentile(values: Sequence[float], q: int) -> float | None:
    if len(values) < 2:
        return round(values[0] * 1000, 1) if values else None
    return round(statistics.quantiles(values, n=100, method="inclusive")[q - 1] * 1000, 1)


def _register(wiring: Wiring, clusters: int, nodes: int) -> str:
    """The synthetic fleet, one team with one queue, and the team's token (returned)."""
    now = utc_now()
    per_cluster = max(1, nodes // clusters)
    for i in range(clusters):
        spec = ClusterSpec.model_validate(
            {
                "name": f"bench-{i:03d}",
                "pools": [
                    {
                        "name": "h100",
                        "gpu_model": "H100-80GB",
                        "gpus_per_node": 8,
                        "cpu_millis": 192_000,
                        "memory_mib": 2_000_000,
                        "node_count": per_cluster,
                    }
                ],
            }
        )
        admin.create_cluster(wiring.uow(), spec, "bench", now)
    admin.put_priority_class(wiring.uow(), PriorityClassSpec(name="batch", value=100, is_default=True), "bench", now)
    admin.create_tree_node(wiring.uow(), "team", TeamSpec(name=TEAM), "bench", now)
    admin.create_tree_node(wiring.uow(), "queue", QueueSpec(name=QUEUE, team=TEAM), "bench", now)
    _, token = issue_token(wiring.uow(), TokenSpec(name="bench", team=TEAM), "bench", now)
    return token


def _body(i: int) -> dict[str, Any]:
    # Three shapes, as a real mix would repeat a few: 1 x 8, 2 x 8 and 4 x 8 GPUs.
    return {
        "name": f"g{i}",
        "queue": QUEUE,
        "duration_seconds": 600,
        "pod_sets": [{"name": "workers", "replicas": (1, 2, 4)[i % 3], "gpus": 8}],
    }


def _env(url: str, nats_url: str, workdir: Path, port: int) -> dict[str, str]:
    return {
        **os.environ,
        "GPUFLEET_DATABASE_URL": url,
        "GPUFLEET_NATS_URL": nats_url,
        "GPUFLEET_SUBJECT_PREFIX": PREFIX,
        "GPUFLEET_STATE_DIR": str(workdir / "state"),
        "GPUFLEET_API_PORT": str(port),
        "GPUFLEET_API_REUSE_PORT": "true",
    }


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "controlplane.cli.main", *args], env=env, stdout=out, stderr=out)


def _stop(processes: Sequence[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()


async def _rest_load(
    base: str, token: str, count: int, clients: int, tag: str
) -> tuple[list[float], dict[str, int], float]:
    """`clients` keep-alive connections, each posting one submit at a time. The client is aiohttp (its
    HTTP parser is in C): it shares this machine's two cores with the servers, and httpx spent more CPU
    per request than a `gpufleet server serve` process did, so the figure measured the client as much as the API."""
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    next_index = iter(range(count))
    url = f"{base}/v1/workloads"

    async def client(http: aiohttp.ClientSession) -> None:
        for i in next_index:
            started = time.perf_counter()
            try:
                body = json.dumps(_body(i)).encode()
                async with http.post(url, data=body, headers={**headers, "Idempotency-Key": f"{tag}{i}"}) as r:
                    await r.read()
                    outcome = str(r.status)
            except (aiohttp.ClientError, TimeoutError) as exc:  # counted, not fatal: a slow server is a figure too
                outcome = type(exc).__name__
            latencies.append(time.perf_counter() - started)
            statuses[outcome] = statuses.get(outcome, 0) + 1

    connector = aiohttp.TCPConnector(limit=clients, limit_per_host=clients)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        started = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        return latencies, statuses, time.perf_counter() - started


def _cpu_seconds(pid: int) -> float | None:
    """User plus system CPU seconds a process has used (Linux /proc), None elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _servers_cpu(processes: Sequence[subprocess.Popen[bytes]]) -> float | None:
    seconds = [_cpu_seconds(p.pid) for p in processes]
    return None if any(s is None for s in seconds) else sum(s for s in seconds if s is not None)


def _database_backends(engine: Engine) -> list[int]:
    """The PostgreSQL backends serving the bench's database (its servers' pooled connections, after
    the warm-up), to count the database's CPU per submit too; none on SQLite (it runs in the servers)."""
    if engine.dialect.name != "postgresql":
        return []
    with engine.connect() as conn:
        return list(
            conn.scalars(
                text("SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
            )
        )


def _backends_cpu(pids: Sequence[int]) -> dict[int, float]:
    """Their CPU seconds, for those this machine shows (a database elsewhere shows none)."""
    return {pid: seconds for pid in pids if (seconds := _cpu_seconds(pid)) is not None}


def _database_cpu(before: dict[int, float], after: dict[int, float], count: int) -> float | None:
    """PostgreSQL's CPU per submit, over the backends of the servers' connections open after the
    warm-up and still open at the end (one the pool opened meanwhile is missed); None on SQLite."""
    kept = before.keys() & after.keys()
    return round(sum(after[pid] - before[pid] for pid in kept) / count * 1000, 2) if kept else None


def _wait_ready(base: str, processes: Sequence[subprocess.Popen[bytes]], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in processes):
            raise click.ClickException("an API process exited while starting; see its log in the work directory")
        try:
            if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise click.ClickException(f"the API did not answer within {timeout:.0f} s")


def _bench_rest(
    url: str,
    nats: NatsServerProcess,
    workdir: Path,
    engine: Engine,
    token: str,
    count: int,
    clients: int,
    processes: int,
) -> dict[str, Any]:
    port = free_port()
    env = _env(url, nats.url, workdir, port)
    servers = [_spawn(["serve"], env, workdir / f"api-{i}.log") for i in range(processes)]
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_ready(base, servers)
        time.sleep(2.0)  # every process listening, not only the first
        warm = min(200, count)
        asyncio.run(
            _rest_load(base, token, warm, clients, "warm-")
        )  # connections, caches, the fleet check's first read
        # CPU per submit, of the servers and of this client: on 2 cores what one costs bounds the rate.
        backends = _database_backends(engine)
        servers_before, client_before = _servers_cpu(servers), time.process_time()
        database_before = _backends_cpu(backends)
        latencies, statuses, elapsed = asyncio.run(_rest_load(base, token, count, clients, "k"))
        servers_after, client_after = _servers_cpu(servers), time.process_time()
        database_after = _backends_cpu(backends)
    finally:
        _stop(servers)
    server_cpu = (
        round((servers_after - servers_before) / count * 1000, 2)
        if servers_before is not None and servers_after is not None
        else None
    )
    return {
        "submits": count,
        "clients": clients,
        "api_processes": processes,
        "seconds": round(elapsed, 3),
        "submits_per_second": round(count / elapsed, 1) if elapsed else 0.0,
        "p50_ms": _percentile(latencies, 50),
        "p95_ms": _percentile(latencies, 95),
        "p99_ms": _percentile(latencies, 99),
        "server_cpu_ms_per_submit": server_cpu,
        "client_cpu_ms_per_submit": round((client_after - client_before) / count * 1000, 2),
        "database_cpu_ms_per_submit": _database_cpu(database_before, database_after, count),
        "outcomes": dict(sorted(statuses.items())),
    }


async def _publish_submits(nats_url: str, count: int, tag: str = "m") -> float:
    """Store `count` submits in the inbound stream as the gateway would (on `<p>.in.submit…`, the id in
    its header): the ingest process, whose gateway takes the senders' subjects, may be paused."""
    nc = await connect(nats_url, "bench-submitter")
    try:
        js = nc.jetstream()
        await ensure_topology(js, PREFIX)
        subject = stored_subject(PREFIX, f"{PREFIX}.submit.{TEAM}.{QUEUE}")
        started = time.perf_counter()
        window = 256  # publishes in flight, each acknowledged by JetStream
        for first in range(0, count, window):
            await asyncio.gather(
                *(
                    js.publish(subject, json.dumps(_body(i)).encode(), headers={INBOUND_ID_HEADER: f"{tag}{i}"})
                    for i in range(first, min(first + window, count))
                )
            )
        return time.perf_counter() - started
    finally:
        await nc.close()


def _wait_landed(wiring: Wiring, want: int, ingest: subprocess.Popen[bytes], timeout: float) -> tuple[int, float]:
    """Poll until `want` workloads are in SQL (or the ingest process ended, or `timeout`): how many
    landed, and when the last count was read (perf_counter)."""
    started = time.perf_counter()
    while True:
        with wiring.engine.connect() as conn:
            landed = conn.scalar(select(func.count()).select_from(WorkloadRow)) or 0
        now = time.perf_counter()
        if landed >= want or ingest.poll() is not None or now - started >= timeout:
            return landed, now
        time.sleep(0.02)


def _bench_nats(
    url: str, nats: NatsServerProcess, workdir: Path, wiring: Wiring, count: int, timeout: float
) -> dict[str, Any]:
    """One warm-up submit brings the ingest process up (imports, connections, the fleet read of the
    submit-time check); the process is then paused (SIGSTOP) while the `count` submits are published,
    and timed from its resumption until every one is in SQL: a warm process on a backlog."""
    asyncio.run(_publish_submits(nats.url, 1, "warm-"))
    env = _env(url, nats.url, workdir, free_port())
    ingest = _spawn(["run", "ingest"], env, workdir / "ingest.log")
    try:
        spawned = time.perf_counter()
        warm, warm_at = _wait_landed(wiring, 1, ingest, timeout)
        if warm < 1:
            raise click.ClickException("the ingest process did not take the warm-up submit; see ingest.log")
        ingest.send_signal(signal.SIGSTOP)
        try:
            published = asyncio.run(_publish_submits(nats.url, count))
        finally:
            cpu_before = _cpu_seconds(ingest.pid)
            resumed = time.perf_counter()
            ingest.send_signal(signal.SIGCONT)
        landed, done_at = _wait_landed(wiring, count + warm, ingest, timeout)
        cpu_after = _cpu_seconds(ingest.pid)
        landed -= warm
    finally:
        _stop([ingest])
    elapsed = done_at - resumed
    # The machine's other work takes cores from the ingest process: its own CPU per submit says
    # what the code costs, whatever the wall clock shared with others says.
    cpu = cpu_after - cpu_before if cpu_before is not None and cpu_after is not None else None
    return {
        "submits": count,
        "published_seconds": round(published, 3),
        "landed": landed,
        "ingest_start_seconds": round(warm_at - spawned, 3),
        "seconds_to_sql": round(elapsed, 3),
        "submits_per_second_into_sql": round(landed / elapsed, 1) if elapsed > 0 else 0.0,
        "ingest_cpu_ms_per_submit": round(cpu * 1000 / landed, 3) if cpu is not None and landed else None,
        "complete": landed >= count,
    }


@click.command("submit")
@click.option("--via", type=click.Choice(["rest", "nats"]), default="rest", show_default=True)
@click.option("--count", default=5000, show_default=True, type=click.IntRange(min=1, max=1_000_000))
@click.option("--clients", default=32, show_default=True, type=click.IntRange(min=1, max=1024), help="REST only")
@click.option("--api-processes", default=2, show_default=True, type=click.IntRange(min=1, max=64), help="REST only")
@click.option("--clusters", default=20, show_default=True, type=click.IntRange(min=1))
@click.option("--nodes", default=10_000, show_default=True, type=click.IntRange(min=1), help="nodes in the fleet")
@click.option("--database-url", default=None, help="an empty database (default: a new SQLite file)")
@click.option("--timeout", default=900.0, show_default=True, type=click.FloatRange(min=1.0), help="NATS: give up after")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def bench_submit(
    via: str,
    count: int,
    clients: int,
    api_processes: int,
    clusters: int,
    nodes: int,
    database_url: str | None,
    timeout: float,
    as_json: bool,
) -> None:
    """Submits per second and their latency, by REST or NATS, into a real database."""
    with bench_environment("submit", database_url) as env:
        url, nats, workdir, wiring = env.url, env.nats, env.workdir, env.wiring
        token = _register(wiring, clusters, nodes)
        if via == "rest":
            figures = _bench_rest(url, nats, workdir, wiring.engine, token, count, clients, api_processes)
        else:
            figures = _bench_nats(url, nats, workdir, wiring, count, timeout)
    result = {
        "via": via,
        "database": url.split(":", 1)[0].split("+", 1)[0],
        "clusters": clusters,
        "nodes": nodes,
        **figures,
    }
    if as_json:
        click.echo(json.dumps(result))
        return
    for key, value in result.items():
        click.echo(f"{key:>28}: {value}")
