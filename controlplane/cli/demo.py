"""What `gpufleet up` seeds, the `--demo` workload generator, and the story lines `up` prints.

`up` sends the components' log lines to a file (controlplane.logs), so its console holds the banner,
warnings and the story: the fleet's progress, and with --demo the hoarding story's steps and the
idle policy's findings, each a time-stamped line with its topic, in colour on a terminal."""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from controlplane import bootstrap
from controlplane.bootstrap.wiring import write_secret
from controlplane.config import Settings
from controlplane.service import admin, auth, workloads
from controlplane.service.commands import PriorityClassSpec, QueueSpec, TeamSpec, TokenSpec
from controlplane.service.ports import WorkloadFilter
from controlplane.service.views import Principal

log = logging.getLogger("gpufleet.demo")

# The demo's anti-hoarding policy: short windows so the story plays out in a few minutes. Production
# defaults (5-minute windows, 30 minutes of grace, reclaim after 6 idle windows) stay untouched.
DEMO_WINDOW_SECONDS = 30
DEMO_IDLE_POLICY: dict[str, Any] = {
    "default": {"grace_seconds": 30, "notify_after": 2, "deprioritize_after": 3, "reclaim_after": 4},
    "working_hours": None,
}
# The hoarder: a gang on every A100-40GB GPU of the fleet that stops computing after 45 s but keeps
# its GPUs; another team's gang then waits for exactly those GPUs.
HOARDER_WORKLOAD: dict[str, Any] = {
    "name": "demo-hoarder",
    "kind": "training",
    "pod_sets": [{"name": "workers", "replicas": 4, "gpus": 8, "gpu_models": ["A100-40GB"]}],
    "container": {"sim": {"utilization": "idle_after:45"}},
}
WAITING_WORKLOAD: dict[str, Any] = {
    "name": "vision-finetune",
    "kind": "training",
    "duration_seconds": 120,
    "pod_sets": [{"name": "workers", "replicas": 2, "gpus": 8, "gpu_models": ["A100-40GB"]}],
}
WAITING_TEAM, WAITING_QUEUE = "vision", "vision-train"
DEMO_MIN_RUNTIME_SECONDS = 60
DEMO_TEAM = "demo"
# How each topic of the story stands out on a terminal (click drops the styles elsewhere).
STORY_STYLES: dict[str, dict[str, Any]] = {
    "fleet": {"dim": True},
    "demo": {"fg": "cyan", "bold": True},
    "anti-hoarding": {"fg": "yellow", "bold": True},
    "reclaimed": {"fg": "green", "bold": True},
}
TOPIC_WIDTH = max(map(len, STORY_STYLES))


def story_line(topic: str, text: str, now: datetime | None = None) -> str:
    """One line of the console's story: the time, the topic in a column of its own, the text."""
    if topic not in STORY_STYLES:
        raise ValueError(f"unknown story topic {topic!r}")
    return f"{(now or datetime.now()):%H:%M:%S}  {topic:>{TOPIC_WIDTH}} | {text}"


def story(topic: str, text: str) -> None:
    """Print a story line to the console, styled by its topic when the console is a terminal."""
    click.secho(story_line(topic, text), **STORY_STYLES[topic])


def demo_settings(settings: Settings) -> Settings:
    """`settings` with the demo's short telemetry windows and idle policy, unless the user set an
    idle policy of their own."""
    if settings.idle:
        return settings
    return settings.model_copy(
        update={
            "telemetry_window_seconds": DEMO_WINDOW_SECONDS,
            "telemetry_interval": 5.0,
            "idle": DEMO_IDLE_POLICY,
            "idle_interval": 5.0,
        }
    )


def ensure_demo_policy(wiring: bootstrap.Wiring) -> None:
    """The seeded `batch` class gets a preemption policy: a started gang is safe for a minute (the
    audit reports a preemptible class without one). Short enough for the hoarding story, whose
    reclaim comes minutes after the hoarder starts. A class the user changed is left alone."""
    for pc in admin.list_priority_classes(wiring.uow()):
        if pc.name == "batch" and pc.preemptible and pc.min_runtime_seconds == 0:
            spec = PriorityClassSpec(
                name=pc.name,
                value=pc.value,
                preemptible=True,
                min_runtime_seconds=DEMO_MIN_RUNTIME_SECONDS,
                is_default=pc.is_default,
            )
            admin.put_priority_class(wiring.uow(), spec, "up", bootstrap.utc_now())


def ensure_demo_team(wiring: bootstrap.Wiring, token_path: Path) -> str:
    now = bootstrap.utc_now()
    if not admin.list_tree_nodes(wiring.uow(), "team"):
        admin.create_tree_node(wiring.uow(), "team", TeamSpec(name="demo", limit={"gpu-eq": 160}), "up", now)
        # Every queue has a limit and serving a guarantee (what `gpufleet audit` checks). The guarantee
        # is serving's, on MIG: a guarantee on research or vision would let a queue within it reclaim
        # the hoarder's GPUs as borrowed capacity before the idle policy does (the story to show).
        for name, limit, guaranteed in (("research", 128.0, 0.0), ("serving", 24.0, 8.0)):
            spec = QueueSpec(
                name=name,
                team="demo",
                limit={"gpu-eq": limit},
                guaranteed={"gpu-eq": guaranteed} if guaranteed else {},
            )
            admin.create_tree_node(wiring.uow(), "queue", spec, "up", now)
    if token_path.exists():
        return token_path.read_text().strip()
    _, raw = auth.issue_token(wiring.uow(), TokenSpec(name="demo", team="demo"), "up", now)
    write_secret(token_path, raw)
    return raw


def ensure_waiting_team(wiring: bootstrap.Wiring, token_path: Path) -> str:
    """The second team of the hoarding story, whose gang waits for the hoarder's GPUs."""
    now = bootstrap.utc_now()
    if not any(node.name == WAITING_TEAM for node in admin.list_tree_nodes(wiring.uow(), "team")):
        admin.create_tree_node(wiring.uow(), "team", TeamSpec(name=WAITING_TEAM, limit={"gpu-eq": 32}), "up", now)
        admin.create_tree_node(
            wiring.uow(),
            "queue",
            QueueSpec(name=WAITING_QUEUE, team=WAITING_TEAM, limit={"gpu-eq": 16}),
            "up",
            now,
        )
    if token_path.exists():
        return token_path.read_text().strip()
    _, raw = auth.issue_token(wiring.uow(), TokenSpec(name=WAITING_TEAM, team=WAITING_TEAM), "up", now)
    write_secret(token_path, raw)
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
        (
            "serving",
            {
                "kind": "inference",
                "pod_sets": [{"name": "server", "replicas": 2, "mig_profile": "3g.40gb"}],
                # the signal the idle policy and the audit read (vLLM's metric names); simulated here
                "serving": {
                    "traffic_metric": "vllm:request_success_total",
                    "latency_metric": "vllm:e2e_request_latency_seconds",
                    "latency_objective_ms": 500,
                },
                "container": {"sim": {"traffic_rps": 12.0, "latency_ms": 180.0}},
            },
        ),
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


def _idle_line(event: dict[str, Any]) -> str:
    data = event.get("data", {})
    return (
        f"{event.get('type')} {data.get('workload')} (team {data.get('team')}, "
        f"{data.get('gpu_eq')} GPUs on {data.get('cluster')}): {data.get('reason')}"
    )


async def generate(settings: Settings, team_token: str, stop: asyncio.Event, waiting_token: str | None = None) -> None:
    """Submit a gang every few seconds over NATS, as another system would. With `waiting_token`,
    first play the hoarding story: a gang that goes idle on its GPUs, then another team's gang
    that waits for them; the idle policy's warnings and the reclaim are printed as they happen."""
    # The operator's view (idle events) on the control plane's connection; submits as the teams
    # themselves, each connected with its own token (NATS checks it and pins its subjects).
    secrets = bootstrap.nats_secrets.load(settings.nats_secrets_file) if settings.nats_secrets_file else None
    nc = await bootstrap.connect(
        settings.nats_url,
        "gpufleet-demo",
        user=secrets.control_user if secrets else None,
        password=secrets.control_password if secrets else None,
    )
    teams: dict[str, Any] = {}
    opened: list[Any] = []
    rng = random.Random(7)
    n = 0
    prefix = settings.subject_prefix

    async def submit(queue: str, body: dict[str, Any], token: str, msg_id: str) -> None:
        team = WAITING_TEAM if token == waiting_token else DEMO_TEAM
        if team not in teams:
            client = nc
            if secrets is not None:
                client = await bootstrap.connect(
                    settings.nats_url, f"demo-{team}", token=token, inbox_prefix=f"_INBOX.team-{team}"
                )
                opened.append(client)
            teams[team] = client.jetstream()
        await teams[team].publish(
            f"{prefix}.submit.{team}.{queue}",
            json.dumps(body).encode(),
            timeout=5,
            headers={bootstrap.INBOUND_ID_HEADER: msg_id},
        )

    async def on_idle(msg: Any) -> None:
        story("anti-hoarding", _idle_line(json.loads(msg.data)))

    async def on_reclaimed(msg: Any) -> None:
        data = json.loads(msg.data).get("data", {})
        story("reclaimed", f"workload {data.get('workload_id')} requeued: {data.get('reason', '')}")

    try:
        if waiting_token is not None:
            await nc.subscribe(f"{prefix}.events.idle.>", cb=on_idle)
            await nc.subscribe(f"{prefix}.events.workload.*.*.reclaimed-idle", cb=on_reclaimed)
            story_id = f"{rng.getrandbits(64):x}"
            try:
                await submit("research", HOARDER_WORKLOAD, team_token, f"demo-hoarder-{story_id}")
                story("demo", "submitted demo-hoarder (team demo, 32 A100-40GB GPUs, goes idle after 45 s)")
                await bootstrap.loops.sleep_or_stop(stop, 15.0)
                if stop.is_set():  # Ctrl-C while the hoarder starts: no new team connects on the way out
                    return
                await submit(WAITING_QUEUE, WAITING_WORKLOAD, waiting_token, f"demo-waiting-{story_id}")
                story("demo", "submitted vision-finetune (team vision), which waits for those GPUs")
            except Exception as exc:
                log.warning("demo hoarding story submit failed: %s", exc)
        while not stop.is_set():
            n += 1
            queue, body = _random_workload(rng, n)
            try:
                await submit(queue, body, team_token, f"demo-{rng.getrandbits(64):x}")
            except Exception as exc:
                log.warning("demo submit failed: %s", exc)
            await bootstrap.loops.sleep_or_stop(stop, rng.uniform(1.5, 4.0))
    finally:
        for client in opened:
            await client.close()
        await nc.close()


async def report_progress(wiring: bootstrap.Wiring, stop: asyncio.Event, every: float = 5.0) -> None:
    """Print what the fleet is doing, so `gpufleet up` shows gangs flowing."""
    system = Principal("up", "admin", None)
    last = ""
    while not stop.is_set():
        await bootstrap.loops.sleep_or_stop(stop, every)
        try:
            listed = await asyncio.to_thread(workloads.list_workloads, wiring.uow(), system, WorkloadFilter(limit=1000))
        except Exception as exc:
            log.warning("progress report failed: %s", exc)
            continue
        views = [item.workload for item in listed]
        states = Counter(v.state for v in views)
        running = Counter(v.cluster for v in views if v.state in ("admitted", "dispatching", "running"))
        line = "workloads: " + ", ".join(f"{s} {c}" for s, c in sorted(states.items()))
        if running:
            line += " | live per cluster: " + ", ".join(f"{k} {c}" for k, c in sorted(running.items()))
        if line != last:
            story("fleet", line)
            last = line
