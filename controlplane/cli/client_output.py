"""How the client commands print: the console, raw JSON, and the tables and panels of workloads,
runs, queues and clusters built from the API's JSON."""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from rich import box
from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from controlplane.cli.rest_api import Json

NONE = "-"

PIPE_WIDTH = 400


def console() -> Console:
    # Built per call so it writes to whatever sys.stdout is now (click's test runner swaps it);
    # highlight=False keeps rich from colouring ids and numbers it mistakes for code.
    out = Console(highlight=False)
    if not out.is_terminal and "COLUMNS" not in os.environ:
        # Piped into grep or a file: one line per row beats wrapping at rich's 80-column default.
        out.width = PIPE_WIDTH
    return out


def text(value: object) -> str:
    """A cell: '-' for empty values, so blank columns do not look like rendering bugs."""
    if value is None or value in ("", []):
        return NONE
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return str(value)


def number(value: float) -> str:
    # Quotas are floats in the API; 8.0 GPUs reads better as 8.
    return f"{value:g}"


def quota(values: Mapping[str, float], empty: str) -> str:
    if not values:
        return empty
    return ", ".join(f"{key}={number(amount)}" for key, amount in sorted(values.items()))


def new_table(title: str) -> Table:
    # Light borders and no edge padding: listings are read in 80-column terminals and pipes,
    # where heavy box drawing would squeeze the values themselves.
    return Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)


def workloads_table(workloads: list[Json], now: datetime | None = None) -> Table:
    now = now or datetime.now(UTC)
    table = new_table(f"{len(workloads)} workload(s)")
    # The id stays on one line so it can be copied; other cells fold rather than end in "…",
    # so no value is ever hidden in a narrow terminal.
    table.add_column("id", no_wrap=True)
    for column in ("name", "queue", "state"):
        table.add_column(column, overflow="fold")
    table.add_column("gpus", overflow="fold")
    table.add_column("pods", justify="right")
    table.add_column("cluster", overflow="fold")
    table.add_column("position", justify="right")
    table.add_column("age", justify="right", no_wrap=True)
    table.add_column("reason", overflow="fold")
    for w in workloads:
        pod_sets = w.get("pod_sets") or []
        table.add_row(
            w["id"],
            w["name"],
            w["queue"],
            w["state"],
            gpus_cell(pod_sets),
            text(w.get("pods")),
            text(w.get("cluster")),
            text(w.get("queue_position")),
            age(w.get("created_at"), now),
            text(w.get("reason")),
        )
    return table


def gpu_demand(pod_sets: list[Json]) -> str:
    """What the whole gang asks for: whole GPUs summed, then MIG slices and GPU shares counted
    (they are not whole GPUs, so they are not added in)."""
    whole = 0
    parts: list[str] = []
    for pod_set in pod_sets:
        replicas = int(pod_set.get("replicas", 1))
        if pod_set.get("mig_profile"):
            parts.append(f"{replicas} x MIG {pod_set['mig_profile']}")
        elif pod_set.get("gpu_fraction"):
            parts.append(f"{replicas} x {number(pod_set['gpu_fraction'])}")
        else:
            whole += replicas * int(pod_set.get("gpus") or 0)
    return " + ".join(([str(whole)] if whole or not parts else []) + parts)


def gpus_cell(pod_sets: list[Json]) -> str:
    """The gang's GPUs and, when its pod sets name any, the models they may run on: `16 on H100-80GB`."""
    demand = gpu_demand(pod_sets)
    models = sorted({model for p in pod_sets for model in p.get("gpu_models") or []})
    return f"{demand} on {'/'.join(models)}" if models and demand != "0" else demand


def age(created_at: str | None, now: datetime) -> str:
    """How long ago, in the largest whole unit (45s, 12m, 3h, 5d), as kubectl shows it."""
    if not created_at:
        return NONE
    try:
        seconds = (now - datetime.fromisoformat(created_at)).total_seconds()
    except (TypeError, ValueError):
        return NONE
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def pod_set_summary(pod_set: Mapping[str, Any]) -> str:
    if pod_set.get("mig_profile"):
        each = f"MIG {pod_set['mig_profile']}"
    elif pod_set.get("gpu_fraction"):
        each = f"{number(pod_set['gpu_fraction'])} GPU"
    else:
        each = f"{pod_set.get('gpus', 0)} GPU"
    models = pod_set.get("gpu_models") or []
    on = f" on {'/'.join(models)}" if models else ""
    replicas = pod_set.get("replicas", 1)
    least = pod_set.get("min_replicas")
    # A pod set with a minimum may start with fewer pods (partial admission): say how few.
    count = f"{replicas} (at least {least})" if least is not None and least != replicas else f"{replicas}"
    return f"{pod_set.get('name', '?')}: {count} x {each}{on}"


def workload_panel(w: Mapping[str, Any]) -> Panel:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    rows: list[tuple[str, object]] = [
        ("state", w["state"]),
        ("reason", w.get("reason")),
        ("queue", w["queue"]),
        ("queue position", w.get("queue_position")),
        ("team", w.get("team")),
        ("priority", f"{w.get('priority_class')} ({w.get('priority')})"),
        ("kind", w.get("kind")),
        ("gang", f"min {w.get('min_available')} available"),
        ("pod sets", [pod_set_summary(p) for p in w.get("pod_sets", [])]),
        ("cluster", w.get("cluster")),
        ("nodes", nodes_line(w)),
        ("created", w.get("created_at")),
        ("updated", w.get("updated_at")),
        ("finished", w.get("finished_at")),
    ]
    for label, value in rows:
        grid.add_row(label, text(value))
    return Panel(grid, title=f"{w['name']}  {w['id']}", title_align="left", expand=False)


def nodes_line(w: Mapping[str, Any]) -> str:
    """The current run's nodes: all of them, or the first ones the API shows and how many in all."""
    nodes = list(w.get("nodes") or [])
    count = int(w.get("node_count") or len(nodes))
    if count > len(nodes):
        return f"{count} nodes: {', '.join(nodes)}, ..."
    return text(nodes)


def runs_table(runs: list[Json], attempts: int | None = None) -> Table:
    # The API shows the latest runs of a workload requeued many times; say when some are left out.
    shown = "runs" if attempts is None or attempts <= len(runs) else f"latest {len(runs)} of {attempts} runs"
    table = new_table(shown)
    for column in ("attempt", "run", "cluster", "epoch", "state", "started", "finished", "message"):
        table.add_column(column, overflow="fold")
    for run in runs:
        table.add_row(
            str(run["attempt"]),
            run["id"],
            run["cluster"],
            str(run["epoch"]),
            # A run on capacity a reservation held for another gang: that gang may take it back.
            f"{run['state']} (on capacity held for {run['lent_to']})" if run.get("lent_to") else run["state"],
            text(run.get("started_at")),
            text(run.get("finished_at")),
            text(run.get("message")),
        )
    return table


def placement_table(run: Mapping[str, Any]) -> Table:
    """Where a run's pods are, counted per pod set and pool (what the API shows, whatever the gang's size)."""
    table = new_table(f"placement of run {run['attempt']} ({run['id']})")
    table.add_column("pod set", no_wrap=True)
    table.add_column("pool", no_wrap=True)
    table.add_column("pods", justify="right")
    table.add_column("nodes", justify="right")
    for p in run.get("placement", []):
        table.add_row(p["pod_set"], p["pool"], str(p["pods"]), str(p["nodes"]))
    return table


def tree_table(nodes: list[Json], level: str, status: Json | None = None) -> Table:
    """Cohorts, teams or queues with their quotas; a team's cohort, a queue's team. With `status`
    (`GET /v1/status`), also each team's or queue's GPU-equivalents in use and gangs pending."""
    parent = {"team": "cohort", "queue": "team"}.get(level)
    figures = {(line["level"], line["name"]): line for line in (status or {}).get("queues", [])}
    table = new_table(f"{len(nodes)} {level}(s)")
    table.add_column("name", no_wrap=True)
    if parent:
        table.add_column(parent, no_wrap=True)
    if status is not None:
        table.add_column("used gpu-eq", justify="right")
        table.add_column("pending", justify="right")
    for column in ("guaranteed", "limit", "borrowing limit", "lending limit"):
        table.add_column(column)
    table.add_column("weight", justify="right")
    for node in nodes:
        cells = [node["name"]] + ([node.get("parent") or NONE] if parent else [])
        if status is not None:
            line = figures.get((level, node["name"]))
            cells += [number(round(line["used_gpu_eq"], 2)), str(line["pending"])] if line else [NONE, NONE]
        cells += [
            quota(node.get("guaranteed") or {}, NONE),
            quota(node.get("limit") or {}, "unbounded"),
            quota(node.get("borrowing_limit") or {}, "unbounded"),
            quota(node.get("lending_limit") or {}, "all"),
            number(node.get("weight", 1.0)),
        ]
        table.add_row(*cells)
    return table


def priority_classes_table(classes: list[Json]) -> Table:
    table = new_table(f"{len(classes)} priority class(es)")
    for column in ("name", "value", "preemptible", "min runtime", "default"):
        table.add_column(column, justify="right" if column in ("value", "min runtime") else "left")
    for item in sorted(classes, key=lambda c: -int(c["value"])):
        runtime = int(item.get("min_runtime_seconds") or 0)
        table.add_row(
            item["name"],
            str(item["value"]),
            "yes" if item.get("preemptible", True) else "no",
            f"{runtime} s" if runtime else NONE,
            "yes" if item.get("is_default") else "",
        )
    return table


def tokens_table(tokens: list[Json]) -> Table:
    table = new_table(f"{len(tokens)} token(s)")
    for column in ("id", "name", "role", "team", "created", "revoked"):
        table.add_column(column, overflow="fold")
    for item in tokens:
        table.add_row(
            item["id"],
            item["name"],
            item["role"],
            text(item.get("team_id")),
            text(item.get("created_at")),
            text(item.get("revoked_at")),
        )
    return table


def credentials_table(credentials: list[Json]) -> Table:
    table = new_table(f"{len(credentials)} credential(s)")
    for column in ("id", "cluster", "created", "revoked"):
        table.add_column(column, overflow="fold")
    for item in credentials:
        table.add_row(item["id"], item["cluster"], text(item.get("created_at")), text(item.get("revoked_at")))
    return table


def watch_line(w: Mapping[str, Any]) -> str:
    """One line of `gpufleet workload watch`: when, the state, and what goes with it."""
    when = str(w.get("updated_at") or "")[:19].replace("T", " ")
    parts = [when, w["state"]]
    if w.get("queue_position") is not None:
        parts.append(f"position {w['queue_position']}")
    if w.get("cluster"):
        parts.append(f"on {w['cluster']}")
    if w.get("reason"):
        parts.append(f"- {w['reason']}")
    return "  ".join(part for part in parts if part)


def gpus_table(status: Json) -> Table:
    """`GET /v1/status`'s fleet-wide GPUs: allocated of capacity per model and sharing mode."""
    table = new_table(f"{status['clusters']} cluster(s)")
    for column in ("gpu model", "sharing", "capacity", "allocated", "free", "allocated %"):
        table.add_column(column, justify="left" if column in ("gpu model", "sharing") else "right")
    for line in status["gpus"]:
        capacity, allocated = float(line["capacity"]), float(line["allocated"])
        share = f"{100 * allocated / capacity:.0f} %" if capacity else NONE
        free = max(0.0, capacity - allocated)
        table.add_row(line["gpu_model"], line["sharing"], number(capacity), number(allocated), number(free), share)
    return table


def queue_status_table(queues: list[Json]) -> Table:
    """Teams, each followed by its queues: pending gangs (by reason) and gpu-eq used."""
    table = new_table("teams and queues (gpu-eq)")
    for column in ("name", "pending", "waiting on", "used", "guaranteed", "limit"):
        table.add_column(column, justify="right" if column in ("pending", "used", "guaranteed", "limit") else "left")
    for line in queues:
        reasons = sorted(line.get("pending_by_reason", {}).items(), key=lambda item: (-item[1], item[0]))
        limit = line.get("limit_gpu_eq")
        table.add_row(
            line["name"] if line["level"] == "team" else f"  {line['name']}",
            str(line["pending"]),
            ", ".join(f"{kind} {count}" for kind, count in reasons) or NONE,
            number(line["used_gpu_eq"]),
            number(line["guaranteed_gpu_eq"]),
            NONE if limit is None else number(limit),
        )
    return table


def control_plane_line(control: Mapping[str, Any]) -> str:
    epoch, expires = control.get("scheduler_epoch"), control.get("scheduler_lease_expires_in_seconds")
    if epoch is None:
        leader = "no scheduler has led yet"
    elif expires is not None and expires < 0:
        leader = f"no scheduler leads (epoch {epoch}'s lease ran out {-expires:.0f} s ago)"
    else:
        leader = f"a scheduler leads (epoch {epoch})"
    backlog = int(control.get("outbox_backlog", 0))
    outbox = (
        f"outbox: {backlog} event(s) unpublished, the oldest {control.get('outbox_oldest_seconds', 0):.0f} s"
        if backlog
        else "outbox: empty"
    )
    return f"{leader}; {outbox}"


def clusters_table(clusters: list[Json], status: Json | None = None) -> Table:
    """A row per node pool; with `status` (`GET /v1/status`), also the pool's GPU-equivalents held
    by live runs, free, and asked for by queued gangs that accept its model."""
    table = new_table(f"{len(clusters)} cluster(s)  (* spot price)")
    columns = ["cluster", "provider", "region", "pool", "gpu model", "gpus/node", "nodes", "sharing", "$/gpu-h"]
    figures = {(line["cluster"], line["pool"]): line for line in (status or {}).get("pools", [])}
    if status is not None:
        columns += ["allocated", "free", "pending"]
    for column in columns:
        numeric = column in ("gpus/node", "nodes", "$/gpu-h", "allocated", "free", "pending")
        table.add_column(column, overflow="fold", justify="right" if numeric else "left")
    for cluster in clusters:
        pools = cluster.get("pools") or [{}]
        for i, pool in enumerate(pools):
            # Cluster columns only on its first pool row; a section line separates clusters.
            head = (cluster["name"], cluster.get("provider", ""), text(cluster.get("region"))) if i == 0 else ("",) * 3
            cells = pool_cells(pool)
            if status is not None:
                line = figures.get((cluster["name"], pool.get("name")))
                keys = ("allocated", "free", "pending")
                cells += tuple(number(round(line[k], 2)) for k in keys) if line else (NONE,) * 3
            table.add_row(*head, *cells, end_section=i == len(pools) - 1)
    return table


def pool_cells(pool: Mapping[str, Any]) -> tuple[str, ...]:
    if not pool:
        return (NONE,) * 6
    price = f"{pool.get('price_per_gpu_hour', 0.0):.2f}" + ("*" if pool.get("spot") else "")
    return (
        pool["name"],
        pool["gpu_model"],
        str(pool["gpus_per_node"]),
        str(pool["node_count"]),
        pool.get("sharing", "exclusive"),
        price,
    )
