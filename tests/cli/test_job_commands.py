"""`gpufleet job init`: the sample it writes is a workload the server accepts, as written."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from controlplane.cli.client_commands import load_workload
from controlplane.cli.main import main
from controlplane.service.commands import SubmitWorkload


def test_init_writes_a_sample_the_submit_schema_accepts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["job", "init", "--name", "bert-base", "--queue", "nlp-train"])

    assert result.exit_code == 0, result.output
    assert "gpufleet workload submit job.yaml" in result.output
    written = (tmp_path / "job.yaml").read_text()
    assert written.count("\n#") >= 10  # the optional fields are there, commented, with what they do
    with (tmp_path / "job.yaml").open() as file:
        body = load_workload(file, None)  # what `gpufleet workload submit job.yaml` sends
    spec = SubmitWorkload.model_validate(body)
    assert (spec.name, spec.queue) == ("bert-base", "nlp-train")
    assert spec.pod_sets[0].gpus == 1
    assert spec.container["image"]


def _uncommented(line: str) -> str:
    """A commented field (`# key: value  # what it does`, at the top level or in the pod set) as a
    field; any other line as it is."""
    indent = line[: len(line) - len(line.lstrip())]
    rest = line.lstrip()
    if not rest.startswith("# "):
        return line
    key = rest[2:].split(":", 1)[0]
    if ":" not in rest or not key.replace("_", "").isalpha() or key == "name":  # prose, or the name line
        return line
    return indent + rest[2:]


def test_every_commented_field_is_one_the_server_accepts() -> None:
    """Uncommenting the optional fields (as shown) still gives a valid workload."""
    result = CliRunner().invoke(main, ["job", "init", "-"])
    assert result.exit_code == 0, result.output
    body = yaml.safe_load("\n".join(_uncommented(line) for line in result.output.splitlines()))
    assert body["pod_sets"][0]["gpu_models"] == ["H100-80GB"]
    body["pod_sets"][0].pop("min_replicas")  # with min_available given, the two must add up
    spec = SubmitWorkload.model_validate(body)
    assert spec.max_runtime_seconds == 7200
    assert spec.priority_class == "batch"
    assert spec.labels == {"project": "demo"}
    assert spec.tolerations[0].key == "dedicated"


def test_init_does_not_overwrite_without_force(tmp_path: Path) -> None:
    target = tmp_path / "job.yaml"
    target.write_text("mine\n")
    refused = CliRunner().invoke(main, ["job", "init", str(target)])
    assert refused.exit_code == 1
    assert "exists; add --force" in refused.output
    assert target.read_text() == "mine\n"
    forced = CliRunner().invoke(main, ["job", "init", str(target), "--force"])
    assert forced.exit_code == 0, forced.output
    assert target.read_text().startswith("# A gpufleet workload")
