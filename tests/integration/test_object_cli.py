"""A platform engineer's first session with the grouped CLI alone, against the real API and database
(SQLite and PostgreSQL): a cohort, a team, a queue, a priority class, a team token and a cluster,
then a job written by `job init`, submitted with `workload submit` and the team's token, followed by
`workload watch` while a scheduling cycle admits it; every object listed, shown, updated and deleted,
in a table, JSON or YAML (the YAML reading back as the same data); mistakes answered with the API's
sentence."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn
import yaml
from click.testing import CliRunner, Result

from adapters.nats.server import free_port
from adapters.sql.gauges_repo import SqlFleetGauges
from controlplane.api.app import create_app
from controlplane.api.context import ApiContext
from controlplane.bootstrap import Wiring, utc_now
from controlplane.cli.main import main
from controlplane.core.snapshot import Policy
from controlplane.service.scheduling import acquire_leadership, run_cycle
from tests.integration.fleet import admin_headers, h100_cluster


@dataclass
class Cli:
    url: str
    admin: str
    wiring: Wiring

    def __call__(self, *args: str, token: str | None = None, ok: bool = True) -> Result:
        """`gpufleet WORDS... --api URL --token TOKEN`: every command takes its options after the verb."""
        result = CliRunner().invoke(main, [*args, "--api", self.url, "--token", token or self.admin])
        if ok:
            assert result.exit_code == 0, result.output
            assert result.stderr == "", result.stderr  # no deprecation hint: every name used is current
        return result

    def data(self, *args: str, token: str | None = None, moving: tuple[str, ...] = ()) -> Any:
        """The command's `-o json` output, checked to read back the same from its `-o yaml` (but for
        the `moving` keys, such as a timestamp, which change between the two calls)."""
        as_json = json.loads(self(*args, "-o", "json", token=token).stdout)
        as_yaml = yaml.safe_load(self(*args, "-o", "yaml", token=token).stdout)

        def steady(document: Any) -> Any:
            return {k: v for k, v in document.items() if k not in moving} if moving else document

        assert steady(as_yaml) == steady(as_json)
        return as_json


@pytest.fixture
def cli(wiring: Wiring) -> Iterator[Cli]:
    app = create_app(ApiContext(uow_factory=wiring.uow, gauges=SqlFleetGauges(wiring.engine)))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        admin = admin_headers(wiring)["Authorization"].removeprefix("Bearer ")
        yield Cli(f"http://127.0.0.1:{port}", admin, wiring)
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_a_new_fleet_from_nothing_to_an_admitted_job_with_the_cli_alone(cli: Cli, tmp_path: Path) -> None:
    spec = tmp_path / "cluster.yaml"
    spec.write_text(yaml.safe_dump(h100_cluster("lab", nodes=2)))
    out = cli("cluster", "register", "-f", str(spec)).output
    assert "lab" in out
    assert "H100-80GB" in out
    cli("priority-class", "apply", "batch", "--value", "100", "--default")
    cli("cohort", "create", "research", "--limit", "gpu-eq=16")
    cli("team", "create", "vision", "--cohort", "research", "--guaranteed", "gpu-eq=8", "--limit", "gpu-eq=16")
    out = cli("queue", "create", "training", "--team", "vision", "--limit", "H100-80GB=8", "--weight", "2").output
    assert "training" in out
    assert "vision" in out
    assert "H100-80GB=8" in out
    issued = cli("token", "issue", "vision-ci", "--team", "vision").output
    secret = issued.strip().splitlines()[-1]
    assert "shown only now" in issued
    assert secret.startswith("gpf_")

    job = tmp_path / "job.yaml"
    written = CliRunner().invoke(main, ["job", "init", str(job), "--queue", "training"])
    assert f"gpufleet workload submit {job}" in written.output  # it says the command to run next
    submitted = cli("workload", "submit", str(job), token=secret).output
    workload_id = submitted.split()[1].rstrip(":")
    assert [w["id"] for w in cli.data("workload", "list", "--queue", "training", token=secret)["items"]] == [
        workload_id
    ]
    # `workload watch` follows it in its own process while a scheduling cycle admits it.
    command = ["workload", "watch", workload_id, "--until", "admitted", "--interval", "0.2", "--timeout", "60"]
    watcher = subprocess.Popen(
        [sys.executable, "-m", "controlplane.cli.main", *command, "--api", cli.url, "--token", secret],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert watcher.stdout is not None
    first = watcher.stdout.readline()  # it has seen the workload queued
    now = utc_now()
    epoch = acquire_leadership(cli.wiring.uow, "cli-test", now, 15.0)
    assert epoch is not None
    run_cycle(cli.wiring.uow, "cli-test", epoch, Policy(), "gpufleet", now, 15_000.0, True)
    rest, _ = watcher.communicate(timeout=60)
    watched = first + rest
    assert watcher.returncode == 0, watched
    states = [line.split()[2] for line in watched.splitlines()]
    assert states == ["queued", "admitted"], watched
    shown = cli.data("workload", "show", workload_id, token=secret)
    assert shown["state"] == "admitted", shown
    assert shown["cluster"] == "lab"

    # The fleet at a glance: the admin sees every team and the scheduler; the team only its own.
    status = cli.data("status", moving=("at", "control_plane"))
    gpus = [(g["gpu_model"], g["capacity"], g["allocated"]) for g in status["gpus"]]
    assert gpus == [("H100-80GB", 16.0, 2.0)]  # `job init`'s sample: 2 pods of 1 GPU
    assert [(q["level"], q["name"], q["used_gpu_eq"]) for q in status["queues"]] == [
        ("team", "vision", 2.0),
        ("queue", "training", 2.0),
    ]
    assert status["control_plane"]["scheduler_epoch"] == epoch
    assert [(p["cluster"], p["pool"], p["capacity"], p["allocated"], p["free"]) for p in status["pools"]] == [
        ("lab", "h100", 16.0, 2.0, 14.0)
    ]
    # The list tables carry the same figures of now beside the objects as configured.
    queue_row = next(line for line in cli("queue", "list").output.splitlines() if " training " in line)
    assert queue_row.split()[2:4] == ["2", "0"]  # used gpu-eq, pending
    pool_row = next(line for line in cli("cluster", "list").output.splitlines() if " h100 " in line)
    assert pool_row.split()[-3:-1] == ["2", "14"]  # allocated, free
    table = cli("status").output
    assert "H100-80GB" in table
    assert "a scheduler leads" in table
    assert cli.data("status", token=secret, moving=("at",))["control_plane"] is None

    # Every object lists, shows, and prints as JSON and YAML.
    queues = cli.data("queue", "list")
    assert [(q["name"], q["parent"], q["limit"], q["weight"]) for q in queues] == [
        ("training", "vision", {"H100-80GB": 8.0}, 2.0)
    ]
    assert cli.data("team", "show", "vision")["guaranteed"] == {"gpu-eq": 8.0}
    assert yaml.safe_load(cli("team", "-o", "yaml", "show", "vision").output)["weight"] == 1.0  # group-level -o
    assert "research" in cli("cohort", "show", "research").output
    assert "batch" in cli("priority-class", "list").output
    tokens = cli.data("token", "list")
    assert "vision-ci" in {t["name"] for t in tokens}
    assert "lab" in cli("cluster", "show", "lab").output
    assert cli.data("priority-class", "show", "batch")["value"] == 100
    assert "no priority class named 'ghost'" in cli("priority-class", "show", "ghost", ok=False).output

    # The cluster agent's NATS credential: rotated (the new secret printed once), listed, revoked.
    before = cli.data("cluster", "credentials", "lab")
    rotated = cli("cluster", "rotate-credential", "lab").output
    assert "shown only now" in rotated
    after_rotation = cli.data("cluster", "credentials", "lab")
    assert len(after_rotation) == len(before) + 1
    assert [c["revoked_at"] is None for c in after_rotation].count(True) == 1
    cli("cluster", "revoke-credentials", "lab")
    assert all(c["revoked_at"] for c in cli.data("cluster", "credentials", "lab"))

    # Update changes only what is named.
    cli("queue", "update", "training", "--limit", "H100-80GB=4")
    after = cli.data("queue", "show", "training")
    assert (after["limit"], after["weight"]) == ({"H100-80GB": 4.0}, 2.0)

    # Watching a cancelled workload ends at once, with exit status 1.
    cli("workload", "cancel", workload_id)
    ended = CliRunner().invoke(main, ["workload", "watch", workload_id, "--api", cli.url, "--token", cli.admin])
    assert ended.exit_code == 1
    assert "cancelled" in ended.output

    # A revoked token is refused from then on.
    vision_ci = next(t for t in tokens if t["name"] == "vision-ci")
    cli("token", "revoke", vision_ci["id"])
    refused = CliRunner().invoke(main, ["workload", "list", "--api", cli.url, "--token", secret])
    assert refused.exit_code == 1
    assert "rejected" in refused.output


def test_mistakes_get_the_api_s_sentence_or_a_usage_error_before_anything_is_sent(cli: Cli) -> None:
    # A malformed quota never leaves the machine.
    bad = cli("cohort", "create", "c1", "--limit", "gpu-eq:16", ok=False)
    assert bad.exit_code == 2
    assert "is not KEY=AMOUNT" in bad.output
    # A quota key that names no GPU model of the fleet is the API's 409, printed as it says it.
    unknown = cli("cohort", "create", "c1", "--limit", "H100=8", ok=False)
    assert unknown.exit_code == 1
    assert "H100" in unknown.output
    assert "409" in unknown.output
    # A queue names its team; an unknown one is the API's 404.
    orphan = cli("queue", "create", "q1", "--team", "nobody", ok=False)
    assert orphan.exit_code == 1
    assert "nobody" in orphan.output
    missing = cli("queue", "create", "q1", ok=False)
    assert missing.exit_code == 2
    assert "--team" in missing.output
    nothing = cli("team", "update", "t1", ok=False)
    assert nothing.exit_code == 2
    assert "nothing to update" in nothing.output
    assert "no cohort named 'ghost'" in cli("cohort", "delete", "ghost", ok=False).output


def test_deleting_objects_in_dependency_order(cli: Cli) -> None:
    cli("cohort", "create", "c1")
    cli("team", "create", "t1", "--cohort", "c1")
    cli("queue", "create", "q1", "--team", "t1")
    # The API refuses to delete a team that still has a queue: its sentence is printed.
    busy = cli("team", "delete", "t1", ok=False)
    assert busy.exit_code == 1
    assert "409" in busy.output
    assert cli("queue", "delete", "q1").output.strip() == "queue q1 deleted"
    cli("team", "delete", "t1")
    cli("cohort", "delete", "c1")
    assert cli.data("cohort", "list") == []


def test_login_saves_a_context_that_every_command_then_uses(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "client" / "config.yaml"
    monkeypatch.setenv("GPUFLEET_CLIENT_CONFIG", str(config))
    monkeypatch.delenv("GPUFLEET_API", raising=False)
    monkeypatch.delenv("GPUFLEET_TOKEN", raising=False)
    monkeypatch.setenv("GPUFLEET_STATE_DIR", str(tmp_path / "no-state"))  # no admin.token to fall back on
    runner = CliRunner()
    # Without a context nothing finds this API (it is not on the default port).
    assert runner.invoke(main, ["team", "list"]).exit_code == 1

    wrong = runner.invoke(main, ["login", cli.url, "--token", "not-a-token"])
    assert wrong.exit_code == 1
    assert "rejected" in wrong.output
    assert not config.exists()  # nothing saved for a token the API refused

    logged = runner.invoke(main, ["login", cli.url, "--token", cli.admin, "--name", "lab"])
    assert logged.exit_code == 0, logged.output
    assert "context 'lab'" in logged.output
    assert config.stat().st_mode & 0o777 == 0o600  # it holds the token: the owner's alone
    assert yaml.safe_load(config.read_text())["current"] == "lab"

    made = runner.invoke(main, ["cohort", "create", "from-context"])
    assert made.exit_code == 0, made.output
    assert "from-context" in runner.invoke(main, ["cohort", "list"]).output
    assert runner.invoke(main, ["status", "--json"]).exit_code == 0

    listed = runner.invoke(main, ["context", "list"]).output
    assert "lab" in listed
    assert cli.admin not in listed  # tokens are never printed
    assert runner.invoke(main, ["context", "use", "elsewhere"]).exit_code == 1
    assert runner.invoke(main, ["context", "delete", "lab"]).exit_code == 0
    assert runner.invoke(main, ["team", "list"]).exit_code == 1  # back to the local default: nobody there
