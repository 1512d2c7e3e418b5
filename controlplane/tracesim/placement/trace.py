"""The Alibaba openb trace (cluster-trace-gpu-v2023) as the FGD experiment reads it.

Nodes: `sn,cpu_milli,memory_mib,gpu,model`. Pods: `name,cpu_milli,memory_mib,num_gpu,gpu_milli`
plus, except in the `multigpu*` lists, `gpu_spec` (allowed GPU models, `|`-separated) and columns
the placement experiment ignores (qos, phase, timestamps: the pods are a sample of shapes, not an
event log).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from controlplane.core.fragmentation import MILLI, PodShape

# The openb pod lists FGD evaluates (`cpu250`, `gpuspec33` and `multigpu50` are not published).
VARIANTS = (
    "default",
    "cpu050",
    "cpu100",
    "cpu200",
    "gpushare40",
    "gpushare60",
    "gpushare80",
    "gpushare100",
    "gpuspec10",
    "gpuspec20",
    "gpuspec25",
    "multigpu20",
    "multigpu30",
    "multigpu40",
)
NODE_FILE = "openb_node_list_gpu_node.csv"


def pod_file(variant: str) -> str:
    return f"openb_pod_list_{variant}.csv"


@dataclass(frozen=True)
class TraceNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True)
class TracePod:
    name: str
    memory_mib: int
    shape: PodShape


def load_nodes(path: Path) -> list[TraceNode]:
    with path.open(newline="") as handle:
        return [
            TraceNode(row["sn"], int(row["cpu_milli"]), int(row["memory_mib"]), int(row["gpu"]), row["model"] or "")
            for row in csv.DictReader(handle)
        ]


def load_pods(path: Path) -> list[TracePod]:
    pods = []
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            count = int(row["num_gpu"])
            # The simulator caps the per-GPU annotation at one GPU; a CPU pod has no GPU share.
            milli = min(int(row["gpu_milli"]), MILLI) if count else 0
            spec = (row.get("gpu_spec") or "").strip()
            models = frozenset(m for m in spec.split("|") if m)
            shape = PodShape(int(row["cpu_milli"]), milli, count if milli else 0, models)
            pods.append(TracePod(row["name"], int(row["memory_mib"]), shape))
    return pods
