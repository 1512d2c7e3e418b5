"""`gpufleet bench dashboard`: how long each dashboard page takes with 100,000 workloads.

A synthetic installation is written straight into SQL (as `gpufleet bench metrics` writes it:
clusters, pools and nodes, teams and queues with quotas, queued gangs with pending reasons, running
gangs with pod assignments, idle findings and a telemetry window per GPU), plus finished workloads
up to `--workloads`, a pod set for every workload and a backlog of workload events. Then every page
is fetched `--repeat` times through the real app (FastAPI, the templates, and the gauge reader
`serve` gives the dashboard), as an admin and as one team, and the time of each is reported (the
median and the slowest; client and server share the process). Figures are printed, never asserted.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import click
from fastapi.testclient import TestClient
from sqlalchemy import Engine, func, insert, select

from adapters.sql.engine import make_engine, make_session_factory
from adapters.sql.gauges_repo import SqlFleetGauges
from adapters.sql.migrate import upgrade_to_head
from adapters.sql.tables import OutboxRow, PodSetRow, WorkloadRow
from adapters.sql.uow import SqlUnitOfWork
from controlplane.api.app import create_app
from controlplane.api.context import ApiContext
from controlplane.bootstrap import utc_now
from controlplane.cli.bench_metrics import populate
from controlplane.service.auth import issue_token
from controlplane.service.commands import TokenSpec
from controlplane.service.events import envelope
from controlplane.service.ports import UnitOfWork

PREFIX = "gpufleet"
BATCH = 5_000
# The pages a person opens, and the heavier variants of the workload list (a deep page, a sort
# without an index, grouping with counts).
PAGES = (
    "/ui/fleet",
    "/ui/fleet/cluster-0/h100",
    "/ui/queues",
    "/ui/workloads",
    "/ui/workloads?state=queued&sort=priority",
    "/ui/workloads?group=queue",
    "/ui/workloads?sort=name&offset=5000",
    "/ui/workloads/{workload}",
    "/ui/idle",
    "/ui/utilization",
    "/ui/utilization?range=7d",
    "/ui/audit",
    "/ui/events",
    "/ui/events?family=workload&workload=live-1",
)


def _more(engine: Engine, finished: int, events: int) -> None:
    """Finished workloads after those `populate` wrote, a pod set for every workload, and workload
    events of team-0 in the outbox."""
    now = utc_now()
    with engine.begin() as conn:
        existing = int(conn.scalar(select(func.max(WorkloadRow.created_seq))) or 0)
        rows = [
            {
                "id": f"wf{i}",
                "team_id": "t0",
                "queue_id": f"q{(i * 5) % 50}",
                "name": f"done-{i}",
                "priority_class": "bench",
                "priority": i % 3,
                "kind": "training",
                "min_available": 2,
                "state": "succeeded" if i % 10 else "failed",
                "reason": "all pods succeeded",
                "created_seq": existing + 1 + i,
                "created_at": now,
                "updated_at": now,
                "finished_at": now,
            }
            for i in range(finished)
        ]
        for start in range(0, len(rows), BATCH):
            conn.execute(insert(WorkloadRow), rows[start : start + BATCH])
        ids = list(conn.scalars(select(WorkloadRow.id)))
        pod_sets = [
            {
                "workload_id": workload_id,
                "ordinal": 0,
                "name": "workers",
                "replicas": 2,
                "gpus": 8,
                "cpu_millis": 8000,
                "memory_mib": 64_000,
                "gpu_models": ["H100-80GB"] if n % 2 else [],
            }
            for n, workload_id in enumerate(ids)
        ]
        for start in range(0, len(pod_sets), BATCH):
            conn.execute(insert(PodSetRow), pod_sets[start : start + BATCH])
        outbox = []
        for i in range(events):
            data = {
                "workload_id": f"wl{i % 4000}",
                "workload": f"live-{i % 4000}",
                "team": "team-0",
                "state": "running",
            }
            event_id, payload = envelope("workload.running", data, now)
            outbox.append(
                {
                    "id": event_id,
                    "subject": f"{PREFIX}.events.workload.team-0.queue-0.running",
                    "payload": payload,
                    "created_at": now,
                }
            )
        for start in range(0, len(outbox), BATCH):
            conn.execute(insert(OutboxRow), outbox[start : start + BATCH])


def _timed(http: TestClient, path: str, headers: dict[str, str], repeat: int) -> dict[str, Any]:
    seconds: list[float] = []
    status, size = 0, 0
    for _ in range(repeat):
        started = time.perf_counter()
        r = http.get(path, headers=headers)
        seconds.append(time.perf_counter() - started)
        status, size = r.status_code, len(r.content)
    if status != 200:
        raise click.ClickException(f"{path} answered {status}")
    return {
        "median_ms": round(statistics.median(seconds) * 1000, 1),
        "max_ms": round(max(seconds) * 1000, 1),
        "kb": round(size / 1024, 1),
    }


def run_bench(database_url: str | None, workloads: int, queued: int, live: int, repeat: int) -> dict[str, Any]:
    finished = workloads - queued - live
    if finished < 0:
        raise click.BadParameter("--workloads must be at least --queued plus --live")
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-dashboard-") as workdir:
        url = database_url or f"sqlite:///{Path(workdir) / 'bench.db'}"
        upgrade_to_head(url)
        engine = make_engine(url)
        try:
            started = time.perf_counter()
            populate(engine, clusters=4, nodes=2000, queues=50, queued=queued, live=live, seed=0)
            _more(engine, finished, events=5000)
            populate_seconds = time.perf_counter() - started
            sessions = make_session_factory(engine)

            def uow() -> UnitOfWork:
                return SqlUnitOfWork(sessions)

            now = utc_now()
            _, admin_token = issue_token(uow(), TokenSpec(name="bench-admin", role="admin"), "bench", now)
            _, team_token = issue_token(uow(), TokenSpec(name="bench-team", team="team-0"), "bench", now)
            app = create_app(
                ApiContext(uow_factory=uow, subject_prefix=PREFIX, gauges=SqlFleetGauges(engine, slo=False))
            )
            figures: dict[str, Any] = {}
            with TestClient(app, base_url="http://bench") as http:
                for who, token in (("admin", admin_token), ("team", team_token)):
                    headers = {"Authorization": f"Bearer {token}"}
                    http.get("/ui/fleet", headers=headers)  # warm: imports, templates, connections
                    for path in PAGES:
                        figures[f"{who} {path}"] = _timed(http, path.format(workload="wl0"), headers, repeat)
        finally:
            engine.dispose()
    return {
        "database": url.split(":", 1)[0].split("+", 1)[0],
        "workloads": workloads,
        "queued": queued,
        "running": live,
        "finished": finished,
        "nodes": 2000,
        "populate_seconds": round(populate_seconds, 1),
        "repeat": repeat,
        "pages": figures,
    }


@click.command("dashboard")
@click.option(
    "--database-url", default=None, help="a migrated, EMPTY PostgreSQL/SQLite database (default: temp SQLite)"
)
@click.option("--workloads", default=100_000, show_default=True, type=click.IntRange(min=1, max=1_000_000))
@click.option("--queued", default=20_000, show_default=True, type=click.IntRange(min=0))
@click.option(
    "--live", default=4_000, show_default=True, type=click.IntRange(min=0), help="running gangs of 2 x 8 GPUs"
)
@click.option("--repeat", default=5, show_default=True, type=click.IntRange(min=1, max=100), help="fetches per page")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def bench_dashboard(
    database_url: str | None, workloads: int, queued: int, live: int, repeat: int, as_json: bool
) -> None:
    """Time every dashboard page (admin and team views) with 100,000 workloads in the database."""
    result = run_bench(database_url, workloads, queued, live, repeat)
    if as_json:
        click.echo(json.dumps(result))
        return
    pages = result.pop("pages")
    for key, value in result.items():
        click.echo(f"{key:>18}: {value}")
    for page, timing in pages.items():
        click.echo(
            f"{page:<56} median {timing['median_ms']:>8} ms  max {timing['max_ms']:>8} ms  {timing['kb']:>7} KiB"
        )
