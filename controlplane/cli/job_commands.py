"""`gpufleet job init`: a commented sample workload file to start from (what `gpufleet workload submit` reads)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

# Every field a submit accepts, the common ones set and the rest commented out, each with what it
# does; the values are a small job that fits a simulated fleet (`gpufleet up`).
SAMPLE = """\
# A gpufleet workload: submit it with `gpufleet workload submit {file}`.
# The whole gang starts together or not at all; the server checks every field and says why if not.
# name: a lowercase DNS label; queue: the queue it waits in (`gpufleet queue list` lists yours)
name: {name}
queue: {queue}
# priority_class: batch        # optional: the default class otherwise
kind: training                 # training | inference | interactive | batch
pod_sets:                      # the pods of a set are identical; sets may differ
  - name: workers
    replicas: 2                # pods of this set
    gpus: 1                    # whole GPUs per pod (or mig_profile: 3g.40gb, or gpu_fraction: 0.25)
    cpu_millis: 4000
    memory_mib: 16384
    # gpu_models: [H100-80GB]  # only these GPU models (any by default)
    # min_replicas: 1          # start with as few when the fleet is short (fixed for the run)
# min_available: 2             # gang threshold over all sets; default: every pod
# max_runtime_seconds: 7200    # a declared bound: lets it backfill before a reservation
# duration_seconds: 600        # read by simulated clusters only: how long the work takes there
# requires_isolation: false    # never on time-sliced GPUs (default true for inference)
# spot: allow                  # allow | prefer | avoid | never: spot (cloud-preemptible) pools
# same_pool: preferred         # preferred | required: all pods in one node pool
# labels: {{project: demo}}      # on every object and pod it runs as
# tolerations: [{{key: dedicated, operator: Equal, value: ml, effect: NoSchedule}}]
container:                     # passed to Kubernetes as the pods' container
  image: busybox:1.36
  command: ["sh", "-c", "echo hello from $HOSTNAME; sleep 60"]
"""


@click.group()
def job() -> None:
    """Workload files."""


@job.command()
@click.argument("file", default="job.yaml", type=click.Path(dir_okay=False, allow_dash=True, path_type=Path))
@click.option("--name", default="my-first-job", show_default=True, help="The workload's name in the file.")
@click.option(
    "--queue", default="research", show_default=True, help="The queue in the file (`gpufleet up` makes research)."
)
@click.option("--force", is_flag=True, help="Overwrite FILE if it exists.")
def init(file: Path, name: str, queue: str, force: bool) -> None:
    """Write a commented sample workload to FILE (default job.yaml; `-` prints it)."""
    text = SAMPLE.format(file=file, name=name, queue=queue)
    if str(file) == "-":
        sys.stdout.write(text)
        return
    if file.exists() and not force:
        raise click.ClickException(f"{file} exists; add --force to overwrite it")
    file.write_text(text, encoding="utf-8")
    click.echo(f"wrote {file}: edit it, then `gpufleet workload submit {file}`")
