"""`gpufleet dev sim placement`: the FGD placement experiment (ATC'23) on the Alibaba openb trace.

Figures are measured, never asserted: the command reports what the runs produced, next to the
published figures for the `default` pod list. The progress bar goes to stderr so `--json` stdout
stays machine-readable.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from controlplane.cli import sim_study_commands
from controlplane.tracesim.placement.experiment import SeedResult, run_experiment
from controlplane.tracesim.placement.policies import POLICIES
from controlplane.tracesim.placement.trace import NODE_FILE, VARIANTS, pod_file

DATA_DIR = Path("data/openb")
_VARIANT = re.compile(r"openb_pod_list_(\w+)\.csv")


def parse_seeds(text: str) -> list[int]:
    """`42-51`, `42,45,47` or a mix of both."""
    seeds: list[int] = []
    for raw in text.split(","):
        part = raw.strip()
        if not part:
            continue
        low, dash, high = part.partition("-")
        try:
            seeds.extend(range(int(low), int(high) + 1) if dash else [int(low)])
        except ValueError:
            raise click.BadParameter(f"{part!r} is not a seed or a range like 42-51", param_hint="--seeds") from None
    if not seeds:
        raise click.BadParameter("no seeds given", param_hint="--seeds")
    return seeds


def variant_of(pods: Path) -> str | None:
    match = _VARIANT.fullmatch(pods.name)
    return match.group(1) if match else None


def _fmt(cell: dict[str, float] | None, digits: int = 2) -> str:
    return "-" if cell is None else f"{cell['mean']:.{digits}f} ± {cell['sd']:.{digits}f}"


def _table(runs: list[dict[str, Any]]) -> Table:
    table = Table(title="FGD placement experiment (mean ± sd over seeds; published: FGD ATC'23, openb default)")
    for name in (
        "policy",
        "pods",
        "unalloc % @100",
        "unalloc % @130",
        "unalloc GPUs @130",
        "frag rate % @90",
        "s/seed",
    ):
        table.add_column(name, justify="left" if name in ("policy", "pods") else "right")
    for run in runs:
        head, published = run["headline"], run["published"]
        seconds = run["seconds_per_seed"]
        table.add_row(
            run["policy"],
            run["variant"] or Path(run["pods_file"]).name,
            _fmt(head["unalloc_pct_100"]),
            _fmt(head["unalloc_pct_130"]),
            _fmt(head["unalloc_gpus_130"], 0),
            _fmt(head["frag_rate_90"], 1),
            f"{sum(seconds) / len(seconds):.1f}",
        )
        if published:
            table.add_row(
                "  published",
                "",
                f"{published['unalloc_pct_100']:.2f}",
                f"{published['unalloc_pct_130']:.2f}",
                f"{published['unalloc_gpus_130']:.0f}",
                f"{published['frag_rate_90']:.1f}",
                "",
            )
    return table


@click.group("sim")
def sim() -> None:
    """Trace-driven simulations of gpufleet's scheduling policies."""


@sim.command("placement")
@click.option(
    "--nodes",
    "nodes_path",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    default=DATA_DIR / NODE_FILE,
    show_default=True,
    help="openb node list (CSV).",
)
@click.option(
    "--pods",
    "pods_path",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    default=None,
    help="openb pod list (CSV); default: the `default` list next to --nodes.",
)
@click.option(
    "--policy",
    "policies",
    multiple=True,
    default=("gpufleet",),
    show_default=True,
    help=f"One of {', '.join(POLICIES)} or `all`; repeat for several.",
)
@click.option("--seeds", default="42-51", show_default=True, help="Seeds: a range like 42-51 and/or a list.")
@click.option(
    "--variants",
    default=None,
    help="Run openb pod lists by name (comma-separated, or `all`) from the folder of --nodes instead of --pods.",
)
@click.option(
    "--jobs", default=1, show_default=True, type=click.IntRange(1, 64), help="Worker processes (seeds run in parallel)."
)
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON on stdout.")
def placement(
    nodes_path: Path,
    pods_path: Path | None,
    policies: tuple[str, ...],
    seeds: str,
    variants: str | None,
    jobs: int,
    as_json: bool,
) -> None:
    """Replay openb the FGD way: shuffled arrivals filling 130 % of the GPUs, each pod placed or
    dropped on arrival (no reordering, migration or preemption); report unallocated GPUs and
    fragmentation against arrived demand."""
    seed_list = parse_seeds(seeds)
    chosen = list(POLICIES) if "all" in policies else list(dict.fromkeys(policies))
    for policy in chosen:
        if policy not in POLICIES:
            raise click.BadParameter(
                f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}", param_hint="--policy"
            )
    if variants:
        names = list(VARIANTS) if variants.strip() == "all" else [v.strip() for v in variants.split(",") if v.strip()]
        pod_lists = [nodes_path.parent / pod_file(name) for name in names]
        for path in pod_lists:
            if not path.is_file():
                raise click.BadParameter(f"no pod list {path}", param_hint="--variants")
    else:
        pod_lists = [pods_path or nodes_path.parent / pod_file("default")]
        if not pod_lists[0].is_file():
            raise click.BadParameter(f"no pod list {pod_lists[0]}", param_hint="--pods")
    runs: list[dict[str, Any]] = []
    err = Console(stderr=True)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=as_json) as progress:
        for pods in pod_lists:
            for policy in chosen:
                variant = variant_of(pods)
                task = progress.add_task(f"{policy} on {variant or pods.name}", total=len(seed_list))

                def advance(_: SeedResult, task_id: Any = task) -> None:
                    progress.advance(task_id)

                summary = run_experiment(nodes_path, pods, policy, seed_list, jobs, variant, advance)
                summary["pods_file"] = str(pods)
                summary["nodes_file"] = str(nodes_path)
                runs.append(summary)
    if as_json:
        click.echo(json.dumps({"experiment": "fgd-placement", "runs": runs}))
    else:
        Console().print(_table(runs))


# `sim run`, `sim generate` and `sim study` (the queueing simulator) live in their own module.
sim_study_commands.add_commands(sim)


def register(main: click.Group) -> None:
    main.add_command(sim)
