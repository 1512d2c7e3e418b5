"""The files in deploy/ stay in step with the code that declares the same things."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from click.testing import CliRunner

from adapters.nats.topology import as_json
from controlplane.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def test_exported_jetstream_topology_matches_the_code() -> None:
    exported = json.loads((ROOT / "deploy" / "nats" / "jetstream.json").read_text())
    assert exported == json.loads(json.dumps(as_json("gpufleet")))
    names = [s["name"] for s in exported["streams"]]
    assert names == ["GPUFLEET_IN", "GPUFLEET_EVENTS", "GPUFLEET_DLQ", "GPUFLEET_TELEMETRY"]


def test_nats_topology_command_prints_the_declarations() -> None:
    result = CliRunner().invoke(main, ["nats-topology", "--prefix", "acme"])
    assert result.exit_code == 0
    streams = json.loads(result.output)["streams"]
    assert streams[0]["subjects"] == ["acme.submit.>", "acme.cancel.>", "acme.cluster.>"]


def test_compose_runs_every_component_with_health_checks() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    for name in ("postgres", "nats", "migrate", "api", "scheduler", "dispatcher", "ingest", "relay"):
        assert name in services
    for name in ("postgres", "nats", "api"):
        assert "healthcheck" in services[name]
    assert services["migrate"]["command"][0] == "init"
    assert services["scheduler"]["command"] == ["scheduler"]
