"""`gpufleet dev sim study`: every chosen policy on generated workloads, per load and seed, with the
metrics aggregated over seeds (mean and 95 % interval). Progress goes to stderr so `--json` stdout
stays machine-readable. Figures are measured, never asserted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from controlplane.cli import sim_run_commands
from controlplane.cli.sim_run_commands import _config, _notes, _progress, _sim_options
from controlplane.tracesim.queueing.generate import Generated, GeneratorConfig, load_tables
from controlplane.tracesim.queueing.inputs import dump_fleet, write_workload
from controlplane.tracesim.queueing.policies import POLICY_NAMES, parse_policies
from controlplane.tracesim.queueing.report import STUDY_COLUMNS, ci_cell, render_study
from controlplane.tracesim.queueing.study import LoadSpec, Replay, StudyCell, parse_loads, records, study_grid

# The hoarding mix's default: half the jobs idle for the last half of their run, a quarter of all
# GPU-time held idle, the low end of the 25-51 % measured on Philly (docs/simulator.md).
HOARDING_SHARE = 0.5
HOARDING_IDLE_FRACTION = 0.5


# The terminal shows the headline columns; --json and --report carry every metric.
_TERMINAL = (
    "avg_jct_seconds",
    "queueing_delay_p95_seconds",
    "queueing_delay_p99_seconds",
    "large_gang_longest_wait_seconds",
    "effective_utilization_window",
    "idle_reclaimed_gpu_hours",
    "preemption_lost_gpu_seconds",
    "jain_fairness_demand_aware",
)


def _table(rows: list[dict[str, Any]], seeds: int) -> Table:
    table = Table(title=f"gpufleet queueing study (mean ± 95 % CI over {seeds} seed(s))")
    table.add_column("load")
    table.add_column("policy")
    columns = [(label, field) for label, field in STUDY_COLUMNS if field in _TERMINAL]
    for label, _ in columns:
        table.add_column(label, justify="right")
    for record in rows:
        table.add_row(str(record["load"]), record["policy"], *(ci_cell(record, f) for _, f in columns))
    return table


@click.command("study")
@click.option("--jobs", "n_jobs", default=10_000, show_default=True, type=click.IntRange(1))
@click.option("--gpus", default=1000, show_default=True, type=click.IntRange(8), help="Fleet size (whole 8-GPU nodes).")
@click.option(
    "--load",
    "load_text",
    default="0.9",
    show_default=True,
    help="Offered loads, comma-separated (GPU-seconds asked per second over the fleet's GPUs), and/or "
    "`burst` (load 1.0 with the second day at 2x).",
)
@click.option("--gpu-mix", default="Helios", show_default=True, help="Acme table row the GPUs-per-job mix follows.")
@click.option("--max-gang", default=256, show_default=True, type=click.IntRange(1), help="Largest gang (GPUs).")
@click.option(
    "--max-duration",
    default=7 * 86_400.0,
    show_default=True,
    type=click.FloatRange(min=1),
    help="Run times above this are clipped (s).",
)
@click.option(
    "--seeds",
    "n_seeds",
    default=5,
    show_default=True,
    type=click.IntRange(1, 100),
    help="Workloads per load: seeds --seed, --seed+1, ...",
)
@click.option(
    "--hoarding",
    is_flag=True,
    help=f"Hoarding mix: {HOARDING_SHARE:.0%} of jobs hold their GPUs idle for the last "
    f"{HOARDING_IDLE_FRACTION:.0%} of their run (see --hoarding-share).",
)
@click.option(
    "--hoarding-share",
    type=click.FloatRange(0, 1),
    default=None,
    help="Share of hoarding jobs (implies --hoarding).",
)
@click.option(
    "--hoarding-idle-fraction",
    type=click.FloatRange(0, 1),
    default=HOARDING_IDLE_FRACTION,
    show_default=True,
    help="Idle part of a hoarding job's run.",
)
@_sim_options
@click.option(
    "--workers", default=1, show_default=True, type=click.IntRange(1, 3), help="Replays run in parallel processes."
)
@click.option(
    "--out-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Also keep each generated workload and fleet here (jobs-<load>-seed<seed>.csv, fleet-....yaml).",
)
@click.option(
    "--policies",
    "policies_text",
    default="fifo,priority,gpufleet",
    show_default=True,
    help=f"Comma-separated policies, or `all` ({', '.join(POLICY_NAMES)}).",
)
def study_command(
    n_jobs: int,
    gpus: int,
    load_text: str,
    gpu_mix: str,
    max_gang: int,
    max_duration: float,
    n_seeds: int,
    hoarding: bool,
    hoarding_share: float | None,
    hoarding_idle_fraction: float,
    cycle_seconds: float,
    heads_per_queue: int,
    max_pending: int,
    check_invariants: bool,
    seed: int,
    as_json: bool,
    report_path: Path | None,
    workers: int,
    out_dir: Path | None,
    policies_text: str,
) -> None:
    """Generate workloads per load and seed, replay each under every chosen policy, and compare
    the policies per load (mean and 95 % confidence interval over the seeds)."""
    try:
        policies = parse_policies(policies_text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--policies") from exc
    try:
        loads = parse_loads(load_text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--load") from exc
    if gpu_mix not in load_tables().gpu_stats:
        raise click.BadParameter(f"unknown GPU mix {gpu_mix!r}", param_hint="--gpu-mix")
    share = hoarding_share if hoarding_share is not None else (HOARDING_SHARE if hoarding else 0.0)
    base = GeneratorConfig(
        n_jobs,
        gpus,
        gpu_mix=gpu_mix,
        max_gang=max_gang,
        max_duration=max_duration,
        hoarding_share=share,
        hoarding_idle_fraction=hoarding_idle_fraction,
    )
    seeds = list(range(seed, seed + n_seeds))
    config = _config(cycle_seconds, heads_per_queue, max_pending, check_invariants)

    def keep(spec: LoadSpec, at_seed: int, generated: Generated) -> None:
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            write_workload(generated.jobs, out_dir / f"jobs-{spec.label}-seed{at_seed}.csv")
            dump_fleet(generated.fleet, out_dir / f"fleet-{spec.label}-seed{at_seed}.yaml")

    with _progress(as_json) as progress:
        task = progress.add_task("replays", total=len(loads) * len(seeds) * len(policies), clock="")

        def finished(spec: LoadSpec, at_seed: int, name: str) -> None:
            progress.update(task, advance=1, clock=f"load {spec.label} seed {at_seed} {name}")

        try:
            cells = study_grid(base, loads, seeds, config, policies, workers, finished, keep)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from exc
    rows = records(cells, policies)
    if report_path is not None:
        _write_report(report_path, n_jobs, gpus, seeds, rows, cells)
    if as_json:
        runs = [{"load": cell.load.label, **summary} for cell in cells for summary, _ in cell.runs]
        workloads = [{"load": cell.load.label, "seed": cell.seed, **cell.facts} for cell in cells]
        out = {"jobs": n_jobs, "gpus": gpus, "seeds": seeds, "records": rows, "workloads": workloads, "runs": runs}
        click.echo(json.dumps(out))
    else:
        Console().print(_table(rows, len(seeds)))


def _write_report(
    path: Path, n_jobs: int, gpus: int, seeds: list[int], rows: list[dict[str, Any]], cells: list[StudyCell]
) -> None:
    firsts: dict[str, list[Replay]] = {}
    for cell in cells:
        firsts.setdefault(str(cell.load.label), cell.runs)
    notes = _notes([summary for summary, _ in cells[0].runs]) if cells else []
    title = f"gpufleet dev sim study: {n_jobs:,} jobs on {gpus:,} GPUs, seeds {seeds[0]}-{seeds[-1]}"
    path.write_text(render_study(title, rows, list(firsts.items()), notes))


def add_commands(sim_group: click.Group) -> None:
    """Attach `run`, `generate` and `study` to the `sim` group."""
    sim_run_commands.add_commands(sim_group)
    sim_group.add_command(study_command)
