"""`gpufleet dev bench reads`: how long the workload reads take, and how large they are, with big gangs.

A real `gpufleet server serve` process on a real database (a new SQLite file, or `--database-url`), a
synthetic fleet of `--clusters` clusters, and `--gangs` gangs of `--pods` pods each submitted by
REST. Scheduling cycles (run here, in this process, before any read is timed) admit every gang that
fits; the rest stay queued with a reason. Then each read is timed from the client `--repeat` times:
the REST list (`?limit=50` and `?limit=5`), one admitted and one queued workload, the dashboard's
workload list and page, and `gpufleet workload list` and `gpufleet workload show` (run in this process). The client
and the server share this machine's cores: the figures are what this machine does, reported, never
asserted.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

import click
import httpx
from click.testing import CliRunner

from adapters.nats.server import free_port
from controlplane.bootstrap import Wiring, utc_now
from controlplane.cli import client_commands
from controlplane.cli.bench_submit import PREFIX, QUEUE, _env, _spawn, _stop, _wait_ready, bench_environment
from controlplane.core.snapshot import Policy
from controlplane.service import admin
from controlplane.service.auth import issue_token
from controlplane.service.cluster_specs import ClusterSpec
from controlplane.service.commands import PriorityClassSpec, QueueSpec, TeamSpec, TokenSpec
from controlplane.service.scheduling import acquire_leadership, release_leadership, run_cycle

TEAM = "bench"


def _register(wiring: Wiring, clusters: int, nodes_per_cluster: int) -> str:
    """The fleet, one team with one unbounded queue, and the team's token (returned)."""
    now = utc_now()
    for i in range(clusters):
        pool = {
            "name": "h100",
            "gpu_model": "H100-80GB",
            "gpus_per_node": 8,
            "cpu_millis": 192_000,
            "memory_mib": 2_000_000,
            "node_count": nodes_per_cluster,
        }
        admin.create_cluster(wiring.uow(), ClusterSpec.model_validate({"name": f"big-{i}", "pools": [pool]}), "b", now)
    admin.put_priority_class(wiring.uow(), PriorityClassSpec(name="batch", value=100, is_default=True), "b", now)
    admin.create_tree_node(wiring.uow(), "team", TeamSpec(name=TEAM), "b", now)
    admin.create_tree_node(wiring.uow(), "queue", QueueSpec(name=QUEUE, team=TEAM), "b", now)
    _, token = issue_token(wiring.uow(), TokenSpec(name="bench", team=TEAM), "b", now)
    return token


def _schedule(wiring: Wiring) -> tuple[int, float]:
    """Cycles until one admits nothing: (gangs admitted, seconds spent)."""
    started = time.perf_counter()
    epoch = acquire_leadership(wiring.uow, "bench-reads", utc_now(), 600)
    assert epoch is not None, "a scheduler lease is held in this database: use an empty one"
    admitted = 0
    try:
        while True:
            result = run_cycle(wiring.uow, "bench-reads", epoch, Policy(), PREFIX, utc_now(), 600)
            admitted += result.admitted
            if not result.admitted:
                break
    finally:
        release_leadership(wiring.uow, "bench-reads", epoch)
    return admitted, time.perf_counter() - started


def _timed(http: httpx.Client, path: str, repeat: int) -> dict[str, Any]:
    seconds: list[float] = []
    size = 0
    status = 0
    for _ in range(repeat):
        started = time.perf_counter()
        r = http.get(path)
        seconds.append(time.perf_counter() - started)
        size, status = len(r.content), r.status_code
    return {
        "status": status,
        "bytes": size,
        "median_s": round(statistics.median(seconds), 4),
        "max_s": round(max(seconds), 4),
    }


def _cli_timed(command: click.Command, args: list[str], repeat: int) -> dict[str, Any]:
    """A client command run in this process (no interpreter start), as a user's `gpufleet ...` would."""
    seconds: list[float] = []
    lines = 0
    for _ in range(repeat):
        started = time.perf_counter()
        result = CliRunner().invoke(command, args, catch_exceptions=False)
        seconds.append(time.perf_counter() - started)
        if result.exit_code != 0:
            raise click.ClickException(f"{command.name} {' '.join(args[:1])} failed: {result.output[-300:]}")
        lines = len(result.output.splitlines())
    return {"lines": lines, "median_s": round(statistics.median(seconds), 4), "max_s": round(max(seconds), 4)}


def _items(body: Any) -> list[dict[str, Any]]:
    return list(body["items"])


def _submit(base: str, token: str, gangs: int, pods: int, gpus: int) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=base, headers=headers, timeout=600) as http:
        for i in range(gangs):
            pod_set = {"name": "workers", "replicas": pods, "gpus": gpus}
            r = http.post("/v1/workloads", json={"name": f"gang-{i}", "queue": QUEUE, "pod_sets": [pod_set]})
            if r.status_code != 201:
                raise click.ClickException(f"submit {i} answered {r.status_code}: {r.text[:300]}")


def _measure(base: str, token: str, repeat: int) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=base, headers=headers, timeout=600) as http:
        listed = _items(http.get("/v1/workloads", params={"limit": 1000}).json())
        admitted = next((w["id"] for w in listed if w["state"] != "queued"), None)
        queued = next((w["id"] for w in listed if w["state"] == "queued"), None)
        figures: dict[str, Any] = {
            "states": {s: sum(1 for w in listed if w["state"] == s) for s in sorted({w["state"] for w in listed})}
        }
        http.get("/v1/workloads?limit=50")  # warm: connections, caches
        figures["list_limit_50"] = _timed(http, "/v1/workloads?limit=50", repeat)
        figures["list_limit_5"] = _timed(http, "/v1/workloads?limit=5", repeat)
        if admitted:
            figures["view_admitted"] = _timed(http, f"/v1/workloads/{admitted}", repeat)
        if queued:
            figures["view_queued"] = _timed(http, f"/v1/workloads/{queued}", repeat)
        figures["ui_list"] = _timed(http, "/ui/workloads", repeat)
        if admitted:
            figures["ui_view_admitted"] = _timed(http, f"/ui/workloads/{admitted}", repeat)
    options = ["--api", base, "--token", token]
    figures["cli_list"] = _cli_timed(client_commands.list_workloads, [*options, "--limit", "50"], repeat)
    if admitted:
        figures["cli_show_admitted"] = _cli_timed(client_commands.show, [*options, admitted], repeat)
    return figures


@click.command("reads")
@click.option("--gangs", default=10, show_default=True, type=click.IntRange(min=1, max=1000))
@click.option("--pods", default=5000, show_default=True, type=click.IntRange(min=1, max=5000), help="pods per gang")
@click.option("--gpus", default=8, show_default=True, type=click.IntRange(min=0, max=8), help="GPUs per pod")
@click.option("--clusters", default=3, show_default=True, type=click.IntRange(min=1, max=100))
@click.option("--nodes-per-cluster", default=10_000, show_default=True, type=click.IntRange(min=1, max=20_000))
@click.option("--repeat", default=5, show_default=True, type=click.IntRange(min=1, max=100), help="times per read")
@click.option("--database-url", default=None, help="an empty database (default: a new SQLite file)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def bench_reads(
    gangs: int,
    pods: int,
    gpus: int,
    clusters: int,
    nodes_per_cluster: int,
    repeat: int,
    database_url: str | None,
    as_json: bool,
) -> None:
    """Time and size the workload reads (REST and dashboard) with big gangs admitted and queued."""
    with bench_environment("reads", database_url) as env:
        url, wiring = env.url, env.wiring
        port = free_port()
        server = _spawn(["serve"], _env(url, env.nats.url, env.workdir, port), env.workdir / "api.log")
        try:
            token = _register(wiring, clusters, nodes_per_cluster)
            base = f"http://127.0.0.1:{port}"
            _wait_ready(base, [server])
            _submit(base, token, gangs, pods, gpus)
            admitted, scheduling_seconds = _schedule(wiring)
            figures = {"admitted": admitted, "scheduling_seconds": round(scheduling_seconds, 2)}
            figures.update(_measure(base, token, repeat))
        finally:
            _stop([server])
    result = {
        "database": url.split(":", 1)[0].split("+", 1)[0],
        "gangs": gangs,
        "pods_per_gang": pods,
        "gpus_per_pod": gpus,
        "nodes": clusters * nodes_per_cluster,
        **figures,
    }
    if as_json:
        click.echo(json.dumps(result))
        return
    for key, value in result.items():
        click.echo(f"{key:>20}: {value}")
