"""Schemathesis with every check (`--checks all`) on positive and negative data, against the real API
served by uvicorn: `gpufleet up` (SQLite, the embedded NATS and the simulated fleet) and `gpufleet
serve` on PostgreSQL. No server error and no conformance failure may appear, and no request the
published schema allows may be refused (`positive_data_acceptance`, with its default statuses for
every operation: a 422 or 400 for schema-valid data fails). What JSON Schema cannot say, the
document states under `x-rules`, and `schemathesis_hooks.py` keeps positive data within those rules.

End-to-end and worth it: it is the one test that holds the published OpenAPI to what the server
really answers. It is bounded: a fixed number of examples per operation, deterministic generation,
one worker; about a minute per backend on 2 cores.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from adapters.nats.server import NatsServerProcess, free_port

HERE = Path(__file__).parent
# Per operation, in the fuzzing phase; the coverage phase adds its boundary cases (about 40 per operation).
MAX_EXAMPLES_UP = 15
MAX_EXAMPLES_POSTGRESQL = 10  # what differs on PostgreSQL is storage, which the coverage phase reaches too


@dataclass
class Api:
    base: str
    admin_token: str


def _wait_ready(
    base: str, server: subprocess.Popen[bytes], log: Path, timeout: float = 90, probe: str = "/readyz"
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"the server exited with {server.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{base}{probe}", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"the server did not become ready:\n{log.read_text()[-3000:]}")


def _stop(server: subprocess.Popen[bytes]) -> None:
    if server.poll() is None:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _gpufleet(*args: str) -> list[str]:
    return [sys.executable, "-m", "controlplane.cli.main", *args]


@pytest.fixture
def up_on_sqlite(tmp_path: Path) -> Iterator[Api]:
    state, port = tmp_path / "state", free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    log = tmp_path / "server.log"
    with log.open("ab") as out:
        server = subprocess.Popen(
            _gpufleet("up", "--state-dir", str(state), "--port", str(port), "--nats-port", str(free_port())),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(base, server, log)
        yield Api(base, (state / "admin.token").read_text().strip())
    finally:
        _stop(server)


@pytest.fixture
def serve_on_postgresql(empty_postgresql: str, running_nats: NatsServerProcess, tmp_path: Path) -> Iterator[Api]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    env |= {
        "GPUFLEET_DATABASE_URL": empty_postgresql,
        "GPUFLEET_NATS_URL": running_nats.url,
        "GPUFLEET_STATE_DIR": str(tmp_path / "state"),
        "GPUFLEET_SUBJECT_PREFIX": f"st{port}",
    }
    token_file = tmp_path / "admin.token"
    subprocess.run(
        _gpufleet("server", "init", "--admin-token-file", str(token_file), "--sim-fleet"),
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    log = tmp_path / "server.log"
    with log.open("ab") as out:
        server = subprocess.Popen(
            _gpufleet("server", "serve", "--port", str(port)), stdout=out, stderr=subprocess.STDOUT, env=env
        )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(base, server, log, probe="/healthz")  # readiness wants a scheduler; only the API runs
        yield Api(base, token_file.read_text().strip())
    finally:
        _stop(server)


def _seed(api: Api, workdir: Path) -> None:
    """Two teams with a queue, a token and a workload each; the files schemathesis reads: the
    identities (vision, nlp, admin) and the names and ids of objects that exist."""
    admin = {"Authorization": f"Bearer {api.admin_token}"}
    tokens: dict[str, str] = {}
    ids: list[str] = []
    with httpx.Client(base_url=api.base, timeout=30) as client:

        def post(path: str, body: dict[str, object], headers: dict[str, str]) -> dict[str, str]:
            r = client.post(path, json=body, headers=headers)
            assert r.status_code == 201, (path, r.status_code, r.text)
            answer: dict[str, str] = r.json()
            return answer

        post("/v1/priority-classes", {"name": "batch", "value": 100, "is_default": True}, admin)
        post("/v1/cohorts", {"name": "research"}, admin)
        for team in ("vision", "nlp"):
            post("/v1/teams", {"name": team, "cohort": "research"}, admin)
            post("/v1/queues", {"name": f"{team}-train", "team": team}, admin)
            tokens[team] = post("/v1/tokens", {"name": f"{team}-ci", "team": team}, admin)["token"]
            gang = {"name": "resnet", "queue": f"{team}-train", "pod_sets": [{"replicas": 2, "gpus": 1}]}
            ids.append(post("/v1/workloads", gang, {"Authorization": f"Bearer {tokens[team]}"})["id"])
        # a token the run may revoke; the two team tokens stay out of its reach
        ids.append(post("/v1/tokens", {"name": "spare", "team": "nlp"}, admin)["id"])
        clusters = [c["name"] for c in client.get("/v1/clusters", headers=admin).json()]
    assert clusters, "the simulated fleet is registered"

    def identity(name: str, token: str) -> dict[str, object]:
        return {"name": name, "fixedHeaders": [{"name": "Authorization", "value": f"Bearer {token}"}]}

    auth = [identity("vision", tokens["vision"]), identity("nlp", tokens["nlp"]), identity("admin", api.admin_token)]
    (workdir / "auth.json").write_text(json.dumps({"auth": auth}))
    refs = [*clusters, "vision", "nlp", "vision-train", "nlp-train", "batch", "research"]
    (workdir / "refs.dict").write_text("".join(f'"{ref}"\n' for ref in refs))
    (workdir / "ids.dict").write_text("".join(f'"{i}"\n' for i in ids))
    (workdir / "queues.dict").write_text('"vision-train"\n"nlp-train"\n')
    (workdir / "cohorts.dict").write_text('"research"\n')
    shutil.copy(HERE / "schemathesis.toml", workdir / "schemathesis.toml")
    shutil.copy(HERE / "schemathesis_hooks.py", workdir / "schemathesis_hooks.py")


def _schemathesis(api: Api, workdir: Path, max_examples: int, exclude: tuple[str, ...] = ()) -> dict[str, object]:
    """Run the CLI as a user would; return its JSON report after asserting the run is clean."""
    report = workdir / "report.json"
    command = [
        str(Path(sys.executable).with_name("st")),
        "--config-file",
        "schemathesis.toml",
        "run",
        f"{api.base}/openapi.json",
        "--checks",
        "all",
        "--mode",
        "all",
        "--max-examples",
        str(max_examples),
        "--workers",
        "1",
        "--request-timeout",
        "60",  # registering a cluster of 20,000 simulated nodes (the bound) takes 10-20 s on a busy machine
        "--no-color",
        "--report",
        "json",
        "--report-json-path",
        str(report),
    ]
    for path in exclude:
        command += ["--exclude-path", path]
    started = time.monotonic()
    run = subprocess.run(command, cwd=workdir, capture_output=True, text=True, timeout=400, check=False)
    elapsed = time.monotonic() - started
    output = run.stdout + run.stderr
    (workdir / "schemathesis.log").write_text(output)
    assert report.exists(), f"schemathesis wrote no report (exit {run.returncode}):\n{output[-20000:]}"
    result: dict[str, object] = json.loads(report.read_text())
    result["returncode"], result["output"] = run.returncode, output
    result["elapsed"] = elapsed
    result["phases_s"] = dict(re.findall(r"(Examples|Coverage|Fuzzing) \(in ([0-9.]+)s\)", output))
    return result


def _refused_valid(result: dict[str, object]) -> dict[str, int]:
    """Per operation, the schema-valid requests refused on their data (400 or 422; schemathesis counts
    404 and 409 apart, as the state of the server rather than the request)."""
    rates = result["valid_rates"]
    assert isinstance(rates, dict)
    refused = {op: sum(phase["rejected"] for phase in phases.values()) for op, phases in rates.items()}
    return {op: count for op, count in refused.items() if count}


def _server_errors(result: dict[str, object]) -> int:
    failures = result["failures"]
    assert isinstance(failures, list)
    return sum(f["count"] for f in failures if f["type"] == "ServerError")


def _check_clean(api: Api, result: dict[str, object], excluded: int = 0) -> None:
    operations = sum(len(ops) for ops in httpx.get(f"{api.base}/openapi.json").json()["paths"].values()) - excluded
    tested = result["operations"]
    cases = result["test_cases"]
    assert isinstance(tested, dict)
    assert isinstance(cases, dict)
    refused = _refused_valid(result)
    print(  # the figures, for `pytest -s`
        f"schemathesis: {tested['tested']} operations, {cases['generated']} test cases, "
        f"{sum(refused.values())} schema-valid requests refused by {len(refused)} operations, "
        f"{_server_errors(result)} server errors, {result['elapsed']:.0f} s (phases: {result['phases_s']})"
    )
    output = str(result["output"])
    assert result["returncode"] == 0, f"schemathesis failed (exit {result['returncode']}):\n{output[-20000:]}"
    assert refused == {}
    assert tested["tested"] == operations, tested
    assert cases["with_failures"] == 0
    assert cases["errored"] == 0
    assert result["errors"] == []
    assert result["failures"] == []
    assert cases["generated"] > 20 * operations, "every operation got its share of examples"


def test_no_operation_may_refuse_schema_valid_data() -> None:
    """The configuration gives no operation a pass: `positive_data_acceptance` is on, with its default
    statuses (2xx, 401, 403, 404, 409 ...) everywhere, so a 422 for what the schema allows fails."""
    config = tomllib.loads((HERE / "schemathesis.toml").read_text())
    assert config["checks"]["enabled"] is True
    assert "positive_data_acceptance" not in config["checks"]
    for operation in config.get("operations", []):
        assert "positive_data_acceptance" not in operation.get("checks", {}), operation
    assert config["hooks"] == "schemathesis_hooks.py"


@pytest.mark.timeout(480)
def test_gpufleet_up_conforms_to_its_openapi(up_on_sqlite: Api, tmp_path: Path) -> None:
    workdir = tmp_path / "schemathesis"
    workdir.mkdir()
    _seed(up_on_sqlite, workdir)
    _check_clean(up_on_sqlite, _schemathesis(up_on_sqlite, workdir, MAX_EXAMPLES_UP))


@pytest.mark.timeout(480)
def test_api_on_postgresql_conforms_to_its_openapi(serve_on_postgresql: Api, tmp_path: Path) -> None:
    workdir = tmp_path / "schemathesis"
    workdir.mkdir()
    _seed(serve_on_postgresql, workdir)
    # Only the API runs here: /readyz rightly answers 503 (no scheduler or dispatcher holds a lease);
    # `gpufleet up` above, where every part runs, covers it.
    result = _schemathesis(serve_on_postgresql, workdir, MAX_EXAMPLES_POSTGRESQL, exclude=("/readyz",))
    _check_clean(serve_on_postgresql, result, excluded=1)
