"""`gpufleet dev bench ingest` on a tiny fleet: it runs end to end and reports every figure.

Only shape and sanity are checked; the throughput target is measured and reported, never asserted.
"""

from __future__ import annotations

import json

from click.testing import CliRunner

from controlplane.cli.main import main

KEYS = {
    "complete",
    "samples",
    "samples_committed",
    "samples_in_windows",
    "messages_published",
    "messages_committed",
    "windows",
    "transactions",
    "samples_per_second",
    "publish_samples_per_second",
    "consumer_capacity_samples_per_second",
    "samples_per_consumer_cpu_second",
    "lag_p50_seconds",
    "lag_p95_seconds",
    "database",
}


def test_bench_ingest_prints_every_figure_as_json() -> None:
    args = [
        "dev",
        "bench",
        "ingest",
        "--nodes",
        "5",
        "--gpus-per-node",
        "2",
        "--seconds",
        "3",
        "--clusters",
        "2",
        "--json",
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output.strip().splitlines()[-1])
    assert set(figures) >= KEYS
    assert figures["complete"] is True
    # 5 nodes x 2 GPUs x 3 scrapes, every one committed exactly once and found in the windows.
    assert figures["samples"] == figures["samples_committed"] == figures["samples_in_windows"] == 30
    assert figures["messages_published"] == figures["messages_committed"] == 15
    assert figures["windows"] >= 10
    assert figures["database"] == "sqlite"
    assert figures["samples_per_second"] > 0
    assert 0 <= figures["lag_p50_seconds"] <= figures["lag_p95_seconds"]
