"""Rebuild the vendored tables of this folder from the raw traces (not needed at run time).

    python data/queueing/derive.py /path/to/shared/data

Writes philly_runtime_quantiles.csv, gpu_count_stats.csv and venus_vc_quota.csv next to this file.
Pure standard library, deterministic.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Quantile levels in permille: 0.1 % resolution keeps the heavy Philly tail (p99.9) visible.
LEVELS = 1000


def runtime_quantiles(source: Path) -> list[tuple[float, float]]:
    with source.open() as handle:
        values = sorted(float(row["runtime"]) for row in csv.DictReader(handle))
    n = len(values)
    rows = []
    for level in range(LEVELS + 1):
        q = level / LEVELS
        pos = q * (n - 1)
        low = int(pos)
        high = min(low + 1, n - 1)
        value = values[low] + (values[high] - values[low]) * (pos - low)
        rows.append((q, round(value, 3)))
    return rows


def main(shared: Path) -> None:
    with (HERE / "philly_runtime_quantiles.csv").open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["quantile", "runtime_seconds"])
        for q, value in runtime_quantiles(shared / "philly" / "philly_runtime.csv"):
            writer.writerow([f"{q:.3f}", value])

    keep = ["id", "gpu_job_num", "avg_gpu_num", "med_gpu_num", "max_gpu", "avg_run_time_gpu", "med_run_time_gpu"]
    with (
        (shared / "acme" / "cluster_summary.csv").open() as handle,
        (HERE / "gpu_count_stats.csv").open("w", newline="") as out,
    ):
        writer = csv.writer(out)
        writer.writerow(["trace", *keep[1:]])
        for row in csv.DictReader(handle):
            writer.writerow([row[k] for k in keep])

    with (shared / "helios" / "venus_vc_gpu_number.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    vcs = [c for c in rows[0] if c not in ("date", "total")]
    with (HERE / "venus_vc_quota.csv").open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["vc", "mean_gpus", "days_nonzero"])
        for vc in vcs:
            counts = [float(r[vc]) for r in rows]
            nonzero = sum(1 for c in counts if c > 0)
            if nonzero:
                writer.writerow([vc, round(sum(counts) / len(counts), 3), nonzero])


if __name__ == "__main__":
    main(Path(sys.argv[1]))
