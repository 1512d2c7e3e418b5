"""`gpufleet dev bench reads` on a tiny fleet: a real `gpufleet server serve`, gangs admitted and queued, every
read answered and sized. Times are measured, never asserted."""

from __future__ import annotations

import json

from click.testing import CliRunner

from controlplane.cli.main import main


def test_bench_reads_times_and_sizes_every_read() -> None:
    # Gangs of 4 pods x 8 GPUs on 10 nodes of 8 GPUs: two are admitted, the third waits.
    args = ["dev", "bench", "reads", "--gangs", "3", "--pods", "4", "--clusters", "1", "--nodes-per-cluster", "10"]
    result = CliRunner().invoke(main, [*args, "--repeat", "1", "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output.strip().splitlines()[-1])
    assert figures["states"] == {"admitted": 2, "queued": 1}
    assert figures["admitted"] == 2
    reads = ("list_limit_50", "list_limit_5", "view_admitted", "view_queued", "ui_list", "ui_view_admitted")
    for read in reads:
        assert figures[read]["status"] == 200, read
        assert figures[read]["bytes"] > 0, read
    assert figures["cli_list"]["lines"] > 3
    assert figures["cli_show_admitted"]["lines"] > 3
