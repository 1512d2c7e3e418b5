"""What `gpufleet up` seeds, and the `--demo` workload generator."""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections import Counter
from pathlib import Path
from typing import Any

from controlplane import bootstrap
from controlplane.config import Settings
from controlplane.service import admin, auth, workloads
from controlplane.service.commands import QueueSpec, TeamSpec, TokenSpec
from controlplane.service.ports import WorkloadFilter
from controlplane.service.views import Principal

log = logging.getLogger("gpufleet.demo")


def ensure_demo_team(wiring: bootstrap.Wiring, token_path: Path) -> str:
    now = bootstrap.utc_now()
    if not admin.list_tree_nodes(wiring.uow(), "team"):
        admin.create_tree_node(wiring.uow(), "team", TeamSpec(name="demo", limit={"gpu-eq": 160}), "up", now)
        for name, limit in (("research", 128.0), ("serving", 24.0)):
            admin.create_tree_node(
                wiring.uow(), "queue", QueueSpec(name=name, team="demo", limit={"gpu-eq": limit}), "up", now
            )
    if token_path.exists():
        return token_path.read_text().strip()
    _, raw = auth.issue_token(wiring.uow(), TokenSpec(name="demo", team="demo"), "up", now)
    bootstrap.write_secret(token_path, raw)
    return raw


def _random_workload(rng: random.Random, n: int) -> tuple[str, dict[str, Any]]:
    shapes: list[tuple[str, dict[str, Any]]] = [
        (
            "research",
            {
                "kind": "training",
                "pod_sets": [{"name": "workers", "replicas": 4, "gpus": 8, "gpu_models": ["H100-80GB"]}],
            },
        ),
        (
            "research",
            {
                "kind": "training",
                "pod_sets": [
                    {"name": "launcher", "replicas": 1, "cpu_millis": 2000},
                    {"name": "workers", "replicas": 2, "gpus": 8, "gpu_models": ["A100-80GB", "A100-40GB"]},
                ],
            },
        ),
        ("research", {"kind": "batch", "pod_sets": [{"name": "workers", "replicas": 2, "gpus": 4}]}),
        ("serving", {"kind": "inference", "pod_sets": [{"name": "server", "replicas": 2, "mig_profile": "3g.40gb"}]}),
        (
            "research",
            {
                "kind": "interactive",
                "requires_isolation": False,
                "pod_sets": [{"name": "notebook", "replicas": 1, "gpu_fraction": 0.25}],
            },
        ),
    ]
    queue, body = rng.choice(shapes)
    body = dict(body, name=f"demo-{n}", queue=queue, duration_seconds=rng.choice([15, 30, 45, 60]))
    return queue, body


async def generate(settings: Settings, team_token: str, stop: asyncio.Event) -> None:
    """Submit a gang every few seconds over NATS, as another system would."""
    nc = await bootstrap.connect(settings.nats_url, "gpufleet-demo")
    js = nc.jetstream()
    rng = random.Random(7)
    n = 0
    try:
        while not stop.is_set():
            n += 1
            queue, body = _random_workload(rng, n)
            try:
                await js.publish(
                    f"{settings.subject_prefix}.submit.{queue}",
                    json.dumps(body).encode(),
                    timeout=5,
                    headers={"Authorization": f"Bearer {team_token}", "Nats-Msg-Id": f"demo-{rng.getrandbits(64):x}"},
                )
            except Exception as exc:
                log.warning("demo submit failed: %s", exc)
            await bootstrap.loops.sleep_or_stop(stop, rng.uniform(1.5, 4.0))
    finally:
        await nc.close()


async def report_progress(wiring: bootstrap.Wiring, stop: asyncio.Event, every: float = 5.0) -> None:
    """Print what the fleet is doing, so `gpufleet up` shows gangs flowing."""
    system = Principal("up", "admin", None)
    last = ""
    while not stop.is_set():
        await bootstrap.loops.sleep_or_stop(stop, every)
        try:
            views = await asyncio.to_thread(workloads.list_workloads, wiring.uow(), system, WorkloadFilter(limit=1000))
        except Exception as exc:
            log.warning("progress report failed: %s", exc)
            continue
        states = Counter(v.state for v in views)
        running = Counter(v.cluster for v in views if v.state in ("admitted", "dispatching", "running"))
        line = "workloads: " + ", ".join(f"{s} {c}" for s, c in sorted(states.items()))
        if running:
            line += " | live per cluster: " + ", ".join(f"{k} {c}" for k, c in sorted(running.items()))
        if line != last:
            print(line, flush=True)
            last = line
