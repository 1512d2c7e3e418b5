"""`gpufleet dev sim run|generate`: the discrete-event queueing simulator of the real core
(`sim study` over loads and seeds: sim_study_commands.py).

Progress goes to stderr so `--json` stdout stays machine-readable. Figures are measured, never
asserted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from controlplane.tracesim.queueing.engine import ProgressHook, SimConfig
from controlplane.tracesim.queueing.generate import Generated, GeneratorConfig, generate, load_tables
from controlplane.tracesim.queueing.inputs import (
    InputError,
    dump_fleet,
    load_fleet,
    load_workload,
    write_workload,
)
from controlplane.tracesim.queueing.policies import POLICY_NAMES
from controlplane.tracesim.queueing.report import render
from controlplane.tracesim.queueing.study import Replay, replay

_COLUMNS = (
    TextColumn("{task.description}"),
    BarColumn(),
    MofNCompleteColumn(),
    TextColumn("{task.fields[clock]}"),
    TimeElapsedColumn(),
)


def _progress(quiet: bool) -> Progress:
    return Progress(*_COLUMNS, console=Console(stderr=True), transient=quiet)


def _hook(progress: Progress, task: TaskID) -> ProgressHook:
    def advance(done: int, total: int, virtual: float) -> None:
        progress.update(task, completed=done, total=total, clock=f"t={virtual / 86_400:.2f}d")

    return advance


def _sim_options(func: Any) -> Any:
    options = [
        click.option(
            "--cycle-seconds",
            default=60.0,
            show_default=True,
            type=click.FloatRange(min=0.001),
            help="Least virtual time between two scheduling cycles.",
        ),
        click.option(
            "--heads-per-queue",
            default=8,
            show_default=True,
            type=click.IntRange(1),
            help="Most pending gangs of one queue shown to the core per cycle (fair share).",
        ),
        click.option(
            "--max-pending",
            default=64,
            show_default=True,
            type=click.IntRange(1),
            help="Most pending gangs shown to the core per cycle.",
        ),
        click.option("--check-invariants", is_flag=True, help="Check the core's invariants after every cycle (slow)."),
        click.option(
            "--seed",
            default=0,
            show_default=True,
            type=int,
            help="Seed (ties among simultaneous arrivals; the generator).",
        ),
        click.option("--json", "as_json", is_flag=True, help="Print the JSON summary on stdout."),
        click.option(
            "--report",
            "report_path",
            type=click.Path(path_type=Path, dir_okay=False),
            default=None,
            help="Write a self-contained HTML report here.",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _config(cycle_seconds: float, heads_per_queue: int, max_pending: int, check_invariants: bool) -> SimConfig:
    return SimConfig(cycle_seconds, heads_per_queue, max_pending, check_invariants)


def _table(summaries: list[dict[str, Any]]) -> Table:
    table = Table(title="gpufleet queueing simulation")
    table.add_column("metric")
    for s in summaries:
        table.add_column(s["policy"], justify="right")
    rows: list[tuple[str, Any]] = [
        ("jobs completed / total", lambda s: f"{s['jobs']['completed']:,} / {s['jobs']['total']:,}"),
        ("avg JCT (h)", lambda s: _hours(s["avg_jct_seconds"])),
        ("queueing delay mean (h)", lambda s: _hours(s["queueing_delay_seconds"]["mean"])),
        ("queueing delay p50 (s)", lambda s: _num(s["queueing_delay_seconds"]["p50"])),
        ("queueing delay p95 (h)", lambda s: _hours(s["queueing_delay_seconds"]["p95"])),
        ("queueing delay p99 (h)", lambda s: _hours(s["queueing_delay_seconds"]["p99"])),
        ("GPU allocation", lambda s: f"{s['gpu_allocation']:.1%}"),
        ("effective utilization", lambda s: f"{s['effective_utilization']:.1%}"),
        ("Jain's fairness (share/entitlement)", lambda s: _num(s["jain_fairness"], 3)),
        ("Jain's fairness (share/max-min fair)", lambda s: _num(s["jain_fairness_demand_aware"], 3)),
        ("longest large-gang wait (h)", lambda s: _hours(s["large_gang_longest_wait_seconds"])),
        ("evictions", lambda s: f"{s['jobs']['evictions']:,}"),
        ("makespan (d)", lambda s: f"{s['makespan_seconds'] / 86_400:.2f}"),
        ("cycles", lambda s: f"{s['cycles']:,}"),
        ("wall / CPU s", lambda s: f"{s['runtime']['wall_seconds']:.0f} / {s['runtime']['cpu_seconds']:.0f}"),
    ]
    for label, pick in rows:
        table.add_row(label, *(pick(s) for s in summaries))
    return table


def _hours(value: float | None) -> str:
    return "-" if value is None else f"{value / 3600:.2f}"


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _notes(summaries: list[dict[str, Any]]) -> list[str]:
    s = summaries[0]
    return [
        f"Effective utilization: {s['effective_utilization_source']}.",
        f"Cycles at most every {s['cycle_seconds']:g} s of virtual time; at most "
        f"{s['pending_cap']['heads_per_queue']} pending gangs per queue and {s['pending_cap']['max_pending']} "
        "in all shown to the core per cycle.",
    ]


def _write_report(path: Path, title: str, runs: list[Replay]) -> None:
    path.write_text(render(title, runs, _notes([summary for summary, _ in runs])))


@click.command("run")
@click.option(
    "--fleet",
    "fleet_path",
    required=True,
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    help="Fleet YAML.",
)
@click.option(
    "--workload",
    "workload_path",
    required=True,
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    help="Workload CSV or YAML.",
)
@click.option("--policy", type=click.Choice(list(POLICY_NAMES)), default="gpufleet", show_default=True)
@_sim_options
def run_command(
    fleet_path: Path,
    workload_path: Path,
    policy: str,
    cycle_seconds: float,
    heads_per_queue: int,
    max_pending: int,
    check_invariants: bool,
    seed: int,
    as_json: bool,
    report_path: Path | None,
) -> None:
    """Replay a workload through the real scheduling core on a virtual clock."""
    try:
        fleet = load_fleet(fleet_path)
        jobs = load_workload(workload_path)
    except InputError as exc:
        raise click.ClickException(str(exc)) from exc
    config = _config(cycle_seconds, heads_per_queue, max_pending, check_invariants)
    with _progress(as_json) as progress:
        task = progress.add_task(f"{policy}", total=len(jobs), clock="")
        try:
            summary, curves = replay(fleet, jobs, policy, seed, config, _hook(progress, task))
        except ValueError as exc:
            raise click.ClickException(str(exc)) from exc
    summary["inputs"] = {"fleet": str(fleet_path), "workload": str(workload_path)}
    if report_path is not None:
        _write_report(report_path, f"gpufleet dev sim run: {policy} on {workload_path.name}", [(summary, curves)])
    if as_json:
        click.echo(json.dumps(summary))
    else:
        Console().print(_table([summary]))


def _generator_options(func: Any) -> Any:
    options = [
        click.option("--jobs", "n_jobs", default=10_000, show_default=True, type=click.IntRange(1)),
        click.option(
            "--gpus", default=1000, show_default=True, type=click.IntRange(8), help="Fleet size (whole 8-GPU nodes)."
        ),
        click.option(
            "--load",
            default=0.9,
            show_default=True,
            type=click.FloatRange(min=0.01),
            help="Offered load: GPU-seconds asked per second over the fleet's GPUs.",
        ),
        click.option(
            "--gpu-mix",
            default="Helios",
            show_default=True,
            help="Acme table row whose GPUs-per-job mean the mix follows.",
        ),
        click.option("--max-gang", default=256, show_default=True, type=click.IntRange(1), help="Largest gang (GPUs)."),
        click.option(
            "--max-duration",
            default=7 * 86_400.0,
            show_default=True,
            type=click.FloatRange(min=1),
            help="Run times above this are clipped (s).",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _generate(
    n_jobs: int, gpus: int, seed: int, load: float, gpu_mix: str, max_gang: int, max_duration: float
) -> Generated:
    config = GeneratorConfig(n_jobs, gpus, seed, load, gpu_mix=gpu_mix, max_gang=max_gang, max_duration=max_duration)
    try:
        return generate(config, load_tables())
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc


@click.command("generate")
@_generator_options
@click.option("--seed", default=0, show_default=True, type=int)
@click.option(
    "--out", "out_path", required=True, type=click.Path(path_type=Path, dir_okay=False), help="Workload CSV to write."
)
@click.option(
    "--fleet-out",
    "fleet_out",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Matching fleet YAML to write.",
)
def generate_command(
    n_jobs: int,
    gpus: int,
    load: float,
    gpu_mix: str,
    max_gang: int,
    max_duration: float,
    seed: int,
    out_path: Path,
    fleet_out: Path | None,
) -> None:
    """Write a workload drawn from Philly run times, the Acme GPU-count mix and Helios Venus quotas."""
    generated = _generate(n_jobs, gpus, seed, load, gpu_mix, max_gang, max_duration)
    write_workload(generated.jobs, out_path)
    if fleet_out is not None:
        dump_fleet(generated.fleet, fleet_out)
    click.echo(
        json.dumps(
            {
                "jobs": len(generated.jobs),
                "out": str(out_path),
                "fleet_out": str(fleet_out) if fleet_out else None,
                **generated.facts,
            }
        )
    )


def add_commands(sim_group: click.Group) -> None:
    """Attach `run` and `generate` to the `sim` group (`study`: sim_study_commands.add_commands)."""
    sim_group.add_command(run_command)
    sim_group.add_command(generate_command)
