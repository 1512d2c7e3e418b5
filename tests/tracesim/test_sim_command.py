"""`gpufleet dev sim placement` on the small vendored openb sample: JSON shape and determinism."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from controlplane.cli.sim_commands import parse_seeds, sim
from controlplane.tracesim.placement.experiment import build
from controlplane.tracesim.placement.trace import load_nodes, load_pods

DATA = Path(__file__).resolve().parents[2] / "data" / "openb"
NODES = DATA / "sample_node_list.csv"
PODS = DATA / "sample_pod_list.csv"


def test_json_shape() -> None:
    args = ["placement", "--nodes", str(NODES), "--pods", str(PODS), "--seeds", "1-2", "--json"]
    result = CliRunner().invoke(sim, [*args, "--policy", "gpufleet", "--policy", "bestfit"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["experiment"] == "fgd-placement"
    assert [run["policy"] for run in out["runs"]] == ["gpufleet", "bestfit"]
    run = out["runs"][0]
    assert run["seeds"] == [1, 2]
    assert run["variant"] is None  # not an openb list name: nothing published to compare
    assert run["published"] is None
    assert set(run["headline"]) == {
        "unalloc_pct_100",
        "unalloc_pct_130",
        "unalloc_gpus_130",
        "frag_rate_90",
        "frag_amount_pct_90",
    }
    assert set(run["headline"]["unalloc_pct_100"]) == {"mean", "sd"}
    curves = run["curves"]
    assert set(curves) == {"arrived_pct", "unalloc_pct", "frag_amount_pct", "frag_rate"}
    assert len({len(column) for column in curves.values()}) == 1
    assert curves["arrived_pct"][:3] == [0.0, 1.0, 2.0]
    assert curves["arrived_pct"][-1] >= 129


def test_unknown_policy_is_refused() -> None:
    result = CliRunner().invoke(sim, ["placement", "--nodes", str(NODES), "--pods", str(PODS), "--policy", "magic"])
    assert result.exit_code != 0
    assert "unknown policy" in result.output


def test_seed_ranges() -> None:
    assert parse_seeds("42-44,50") == [42, 43, 44, 50]


@pytest.mark.parametrize("policy", ["gpufleet", "fgd", "bestfit", "packing", "clustering", "dotprod", "random"])
def test_same_seed_same_curves_other_seed_other_order(policy: str) -> None:
    nodes, pods = load_nodes(NODES), load_pods(PODS)
    first = build(policy, nodes, pods).run(7)
    again = build(policy, nodes, pods).run(7)  # fresh caches: nothing carried over
    assert first == again
    other = build(policy, nodes, pods).run(8)
    assert first.buckets != other.buckets
