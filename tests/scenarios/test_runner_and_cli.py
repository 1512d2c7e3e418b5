"""The scenario format, runner and `gpufleet dev scenario run` themselves (the cases are elsewhere)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from controlplane.cli.main import main
from controlplane.core.snapshot import Admission, Decision, Policy, Snapshot
from controlplane.scenario import runner
from controlplane.scenario.expect import check_expectations
from controlplane.scenario.runner import ScenarioFailure, run_scenario
from controlplane.scenario.validate import ScenarioInvalid, parse_scenario

DOCS = Path(__file__).parents[2] / "docs" / "scenarios.md"

POOL = {
    "name": "h100",
    "gpu_model": "H100-80GB",
    "gpus_per_node": 8,
    "cpu_millis": 256000,
    "memory_mib": 2000000,
    "node_count": 1,
}


def small(**overrides: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "fleet": [{"name": "c1", "pools": [dict(POOL)]}],
        "teams": [{"name": "ml"}],
        "queues": [{"name": "train", "parent": "ml"}],
        "workloads": [
            {"name": "a", "queue": "train", "duration": 30, "pod_sets": [{"gpus": 8}]},
            {"name": "b", "queue": "train", "submit_at": 5, "duration": 30, "pod_sets": [{"gpus": 8}]},
        ],
        "until": 200,
    }
    doc.update(overrides)
    return doc


def problems_of(data: object) -> list[tuple[str, str]]:
    with pytest.raises(ScenarioInvalid) as caught:
        parse_scenario(data)
    return caught.value.problems


# --- format -------------------------------------------------------------------------------------


def test_field_errors_carry_their_path() -> None:
    doc = small()
    doc["workloads"][1]["pod_sets"][0]["gpus"] = -1
    doc["fleet"][0]["pools"][0]["colour"] = "green"
    paths = [path for path, _ in problems_of(doc)]
    assert "workloads.1.pod_sets.0.gpus" in paths
    assert "fleet.0.pools.0.colour" in paths


def test_references_are_checked_with_paths() -> None:
    doc = small(
        steps=[{"at": 10, "cancel": "nobody"}, {"at": 10, "cordon": "c1/h100/7"}],
        expect={"workloads": {"ghost": {"admitted_at": 0}}},
    )
    doc["workloads"][0]["queue"] = "nope"
    doc["queues"][0]["parent"] = "no-team"
    problems = dict(problems_of(doc))
    assert problems["workloads.0.queue"] == "unknown queue 'nope'"
    assert problems["queues.0.parent"] == "unknown team 'no-team'"
    assert problems["steps.0.cancel"] == "unknown workload 'nobody'"
    assert "unknown node 'c1/h100/7'" in problems["steps.1.cordon"]
    assert problems["expect.workloads.ghost"] == "unknown workload 'ghost'"


def test_a_step_does_exactly_one_thing_and_policy_fields_must_exist() -> None:
    problems = dict(problems_of(small(steps=[{"at": 1, "cancel": "a", "cordon": "c1/h100/0"}], policy={"speed": 3})))
    assert "exactly one of" in problems["steps.0"]
    assert "unknown policy field(s) speed" in problems["policy"]


def test_a_document_must_be_a_mapping() -> None:
    assert problems_of(["not", "a", "scenario"])[0][0] == "(document)"


def test_policy_overrides_reach_the_policy() -> None:
    doc = parse_scenario(small(policy={"disruption_budget": 3, "fair_share": False}))
    assert doc.policy_value() == Policy(disruption_budget=3, fair_share=False)


# --- runner -------------------------------------------------------------------------------------


def test_the_runner_reports_each_workload_on_the_virtual_clock() -> None:
    result = run_scenario(parse_scenario(small()))
    a, b = result.workload("a"), result.workload("b")
    assert (a.admitted_at, a.finished_at, a.state) == (0, 30, "succeeded")
    assert (b.admitted_at, b.finished_at) == (30, 60)
    assert [r.at for r in b.pending_reasons] == [10]  # recorded once while the reason stays the same
    assert b.last_run is not None
    assert b.last_run.nodes == ("c1/h100/0",)
    assert result.ended_at == 60  # stops once everything has finished


def test_runs_are_deterministic() -> None:
    doc = parse_scenario(small())
    assert run_scenario(doc).to_dict() == run_scenario(doc).to_dict()


def test_idle_after_marks_live_runs_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, bool]] = []
    real = runner.schedule

    def spy(snapshot: Snapshot, policy: Policy, now: Any) -> Decision:
        seen.extend((run.workload_id, run.idle) for run in snapshot.live_runs)
        return real(snapshot, policy, now)

    monkeypatch.setattr(runner, "schedule", spy)
    doc = small(
        workloads=[{"name": "a", "queue": "train", "duration": 40, "idle_after": 20, "pod_sets": [{"gpus": 1}]}]
    )
    run_scenario(parse_scenario(doc))
    assert seen == [("a", False), ("a", True), ("a", True)]  # cycles at 10, 20, 30


def test_a_decision_that_breaks_an_invariant_stops_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    def twice(snapshot: Snapshot, policy: Policy, now: Any) -> Decision:
        admission = Admission("a", "c1", ())
        return Decision(admissions=(admission, admission))

    monkeypatch.setattr(runner, "schedule", twice)
    with pytest.raises(ScenarioFailure, match="at 0s the decision broke an invariant"):
        run_scenario(parse_scenario(small()))


def test_expectations_report_what_was_missed() -> None:
    doc = parse_scenario(
        small(expect={"workloads": {"b": {"admitted_at": 10, "finished_at": None}}, "total_evictions": 1})
    )
    assert doc.expect is not None
    failures = check_expectations(doc.expect, run_scenario(doc))
    assert failures == [
        "b: admitted_at expected 10, got 30",
        "b: finished_at expected None, got 60",
        "expected 1 evictions in all, got 0",
    ]


def test_the_documented_example_runs_and_meets_its_expectations() -> None:
    text = DOCS.read_text().split("## A full example", 1)[1]
    example = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    doc = parse_scenario(yaml.safe_load(example))
    assert doc.expect is not None
    assert check_expectations(doc.expect, run_scenario(doc)) == []


# --- CLI ----------------------------------------------------------------------------------------


def write(tmp_path: Path, doc: object, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc) if not isinstance(doc, str) else doc)
    return path


def test_cli_json_prints_every_workload(tmp_path: Path) -> None:
    path = write(tmp_path, small(expect={"workloads": {"b": {"admitted_at": 30}}}))
    result = CliRunner().invoke(main, ["dev", "scenario", "run", str(path), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert [w["name"] for w in out["workloads"]] == ["a", "b"]
    b = out["workloads"][1]
    assert (b["admitted_at"], b["cluster"], b["pool"], b["nodes"], b["finished_at"]) == (
        30,
        "c1",
        "h100",
        ["c1/h100/0"],
        60,
    )
    assert b["pending_reasons"][0]["at"] == 10
    assert b["pending_reasons"][0]["reason"].startswith("no-fit")
    assert out["expectations"] == {"passed": True, "failures": []}


def test_cli_table_has_a_row_per_workload(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["dev", "scenario", "run", str(write(tmp_path, small()))])
    assert result.exit_code == 0, result.output
    rows = [line.split()[0] for line in result.output.splitlines() if line.strip().startswith(("a ", "b "))]
    assert rows == ["a", "b"]


def test_cli_refuses_an_invalid_document_with_paths(tmp_path: Path) -> None:
    doc = small()
    doc["workloads"][0]["queue"] = "nope"
    result = CliRunner().invoke(main, ["dev", "scenario", "run", str(write(tmp_path, doc))])
    assert result.exit_code == 1
    assert "is not a valid scenario" in result.output
    assert "workloads.0.queue: unknown queue 'nope'" in result.output


def test_cli_refuses_broken_yaml(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["dev", "scenario", "run", str(write(tmp_path, "fleet: [unclosed"))])
    assert result.exit_code == 1
    assert "not valid YAML" in result.output


def test_cli_check_fails_on_a_missed_expectation(tmp_path: Path) -> None:
    path = write(tmp_path, small(expect={"workloads": {"b": {"admitted_at": 0}}}))
    result = CliRunner().invoke(main, ["dev", "scenario", "run", str(path), "--check"])
    assert result.exit_code == 1
    assert "b: admitted_at expected 0, got 30" in result.output
