"""The REST client commands against a real local HTTP server that records what they send."""

from __future__ import annotations

import copy
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml
from click.testing import CliRunner, Result

from controlplane.cli import rest_api
from controlplane.cli.client_commands import workload as workload_group
from controlplane.cli.client_output import age
from controlplane.cli.main import main

# --- a fake API -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # keys lower-cased
    body: Any  # decoded JSON, None when no body was sent


@dataclass
class Route:
    status: int
    payload: Any  # JSON-encoded unless bytes
    delay: float = 0.0


@dataclass
class FakeApi:
    url: str = ""
    requests: list[Recorded] = field(default_factory=list)
    routes: dict[tuple[str, str], Route] = field(default_factory=dict)

    def reply(self, method: str, path: str, payload: Any, status: int = 200, delay: float = 0.0) -> None:
        self.routes[(method, path)] = Route(status, payload, delay)

    @property
    def only(self) -> Recorded:
        assert len(self.requests) == 1, self.requests
        return self.requests[0]


class FakeServer(ThreadingHTTPServer):
    daemon_threads = True
    api: FakeApi

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # the timeout test hangs up on a slow reply on purpose; the traceback would be noise


class Handler(BaseHTTPRequestHandler):
    server: FakeServer

    def _handle(self) -> None:
        split = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        api = self.server.api
        api.requests.append(
            Recorded(
                method=self.command,
                path=split.path,
                query=parse_qs(split.query),
                headers={k.lower(): v for k, v in self.headers.items()},
                body=json.loads(raw) if raw else None,
            )
        )
        route = api.routes.get((self.command, split.path), Route(404, {"detail": f"no route {split.path}"}))
        time.sleep(route.delay)
        data = route.payload if isinstance(route.payload, bytes) else json.dumps(route.payload).encode()
        self.send_response(route.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _handle

    def log_message(self, format: str, *args: Any) -> None:  # keep pytest output clean
        pass


@pytest.fixture
def api() -> Iterator[FakeApi]:
    server = FakeServer(("127.0.0.1", 0), Handler)
    server.api = FakeApi(url=f"http://127.0.0.1:{server.server_address[1]}")
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    yield server.api
    server.shutdown()
    server.server_close()
    thread.join(timeout=1)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No token or API from the developer's shell or ~/.gpufleet leaks into a test."""
    for name in ("GPUFLEET_API", "GPUFLEET_TOKEN", "FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(name, raising=False)
    state = tmp_path / "state"
    monkeypatch.setenv("GPUFLEET_STATE_DIR", str(state))
    monkeypatch.setenv("COLUMNS", "200")  # wide enough that rich never folds the values asserted on
    return state


def run(api: FakeApi, *args: str, token: str | None = "tok-123", stdin: str | None = None) -> Result:
    """Invoke `gpufleet <command> ... --api URL --token TOKEN` against the fake API."""
    options = ["--api", api.url] + (["--token", token] if token is not None else [])
    return CliRunner().invoke(main, [*args, *options], input=stdin)


# --- canned API responses, shaped like controlplane.service.views --------------------------------------

WORKLOAD: dict[str, Any] = {
    "id": "wl_01hzabc",
    "name": "train-llama",
    "team": "nlp",
    "queue": "research",
    "priority_class": "batch",
    "priority": 100,
    "kind": "training",
    "state": "running",
    "reason": "",
    "queue_position": None,
    "min_available": 2,
    "requires_isolation": False,
    "pod_sets": [{"name": "workers", "replicas": 2, "gpus": 8, "gpu_models": ["H100-80GB"]}],
    "duration_seconds": 600.0,
    "idempotency_key": None,
    "labels": {"project": "llama"},
    "created_at": "2024-05-01T10:00:00Z",
    "updated_at": "2024-05-01T10:00:05Z",
    "finished_at": None,
    "cluster": "eks-us-east",
    "nodes": ["eks-us-east-h100-0", "eks-us-east-h100-1"],
    "runs": [
        {
            "id": "run_01first",
            "attempt": 1,
            "cluster": "eks-us-east",
            "epoch": 3,
            "state": "running",
            "message": "pods started",
            "created_at": "2024-05-01T10:00:01Z",
            "dispatched_at": "2024-05-01T10:00:02Z",
            "started_at": "2024-05-01T10:00:04Z",
            "finished_at": None,
            "placement": [{"pod_set": "workers", "pool": "h100", "pods": 2, "nodes": 2}],
        }
    ],
    "node_count": 2,
    "attempts": 1,
}


def workload(**changes: Any) -> dict[str, Any]:
    return {**copy.deepcopy(WORKLOAD), **changes}


def summary(view: dict[str, Any]) -> dict[str, Any]:
    """A workload as `GET /v1/workloads` lists it: pod sets and counts, no runs or nodes."""
    listed = {k: v for k, v in view.items() if k not in ("runs", "nodes", "reason_detail", "serving")}
    return {**listed, "pods": sum(p["replicas"] for p in view["pod_sets"]), "attempts": len(view["runs"])}


def page(*views: dict[str, Any], following: str | None = None) -> dict[str, Any]:
    return {"items": [summary(v) for v in views], "next": following}


QUEUED = workload(
    id="wl_01hzqueued",
    name="eval-sweep",
    queue="evals",
    state="queued",
    reason="waiting for quota: H100-80GB 16 > 8 free",
    queue_position=3,
    cluster=None,
    nodes=[],
    runs=[],
)

QUEUES = [
    {
        "id": "q_1",
        "name": "research",
        "parent_id": "t_nlp",
        "parent": "nlp",
        "guaranteed": {"H100-80GB": 16.0, "gpu-eq": 4.5},
        "limit": {},
        "weight": 2.0,
        "created_at": "2024-05-01T09:00:00Z",
    },
    {
        "id": "q_2",
        "name": "evals",
        "parent_id": "t_nlp",
        "guaranteed": {},
        "limit": {"gpu-eq": 32.0},
        "weight": 0.5,
        "created_at": "2024-05-01T09:00:00Z",
    },
]


def pool(
    name: str, gpu_model: str, gpus: int, nodes: int, sharing: str, price: float, spot: bool = False
) -> dict[str, Any]:
    return {
        "id": f"p_{name}",
        "name": name,
        "gpu_model": gpu_model,
        "gpus_per_node": gpus,
        "cpu_millis": 96_000,
        "memory_mib": 1_000_000,
        "sharing": sharing,
        "taints": [],
        "labels": {},
        "price_per_gpu_hour": price,
        "spot": spot,
        "node_count": nodes,
        "nodes": [],
    }


CLUSTERS = [
    {
        "id": "c_1",
        "name": "eks-us-east",
        "provider": "sim",
        "region": "us-east-1",
        "created_at": "2024-05-01T09:00:00Z",
        "pools": [
            pool("h100", "H100-80GB", 8, 4, "exclusive", 4.5),
            pool("a100-mig", "A100-40GB", 8, 2, "mig:all-balanced", 1.25, spot=True),
        ],
    },
    {
        "id": "c_2",
        "name": "gke-eu-west",
        "provider": "sim",
        "region": "europe-west4",
        "created_at": "2024-05-01T09:00:00Z",
        "pools": [pool("l4", "L4", 4, 6, "timeslice:4", 0.7)],
    },
]

WORKLOAD_YAML = """\
name: train-llama
queue: research
kind: training
min_available: 2
pod_sets:
  - name: workers
    replicas: 2
    gpus: 8
    gpu_models: [H100-80GB]
labels:
  project: llama
"""

WORKLOAD_BODY = {
    "name": "train-llama",
    "queue": "research",
    "kind": "training",
    "min_available": 2,
    "pod_sets": [{"name": "workers", "replicas": 2, "gpus": 8, "gpu_models": ["H100-80GB"]}],
    "labels": {"project": "llama"},
}


@pytest.fixture
def workload_file(tmp_path: Path) -> Path:
    path = tmp_path / "train.yaml"
    path.write_text(WORKLOAD_YAML)
    return path


# --- submit --------------------------------------------------------------------------------------------


def test_submit_posts_the_yaml_as_json_with_the_bearer_token(api: FakeApi, workload_file: Path) -> None:
    api.reply("POST", "/v1/workloads", QUEUED, status=201)

    result = run(api, "workload", "submit", str(workload_file))

    assert result.exit_code == 0, result.output
    sent = api.only
    assert (sent.method, sent.path, sent.query) == ("POST", "/v1/workloads", {})
    assert sent.body == WORKLOAD_BODY
    assert sent.headers["authorization"] == "Bearer tok-123"
    assert sent.headers["content-type"] == "application/json"
    assert "idempotency-key" not in sent.headers
    assert result.stdout == "submitted wl_01hzqueued: queued, position 3 in queue evals\n"


def test_submit_overrides_the_queue_and_sends_the_idempotency_key(api: FakeApi, workload_file: Path) -> None:
    api.reply("POST", "/v1/workloads", workload(queue="urgent"), status=201)

    result = run(
        api, "workload", "submit", str(workload_file), "--queue", "urgent", "--idempotency-key", "nightly-2024-05-01"
    )

    assert result.exit_code == 0, result.output
    assert api.only.body == {**WORKLOAD_BODY, "queue": "urgent"}
    assert api.only.headers["idempotency-key"] == "nightly-2024-05-01"
    assert result.stdout == "submitted wl_01hzabc: running\n"


def test_submit_says_when_the_idempotency_key_matched_an_earlier_workload(api: FakeApi, workload_file: Path) -> None:
    api.reply("POST", "/v1/workloads", WORKLOAD, status=200)

    result = run(api, "workload", "submit", str(workload_file), "--idempotency-key", "k1")

    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("already submitted wl_01hzabc: running")


def test_submit_reads_stdin_for_dash(api: FakeApi) -> None:
    api.reply("POST", "/v1/workloads", QUEUED, status=201)

    result = run(api, "workload", "submit", "-", stdin=WORKLOAD_YAML)

    assert result.exit_code == 0, result.output
    assert api.only.body == WORKLOAD_BODY


def test_submit_sends_yaml_dates_as_iso_strings(api: FakeApi) -> None:
    api.reply("POST", "/v1/workloads", QUEUED, status=201)

    result = run(api, "workload", "submit", "-", stdin=WORKLOAD_YAML.replace("project: llama", "release: 2024-05-01"))

    assert result.exit_code == 0, result.output
    assert api.only.body["labels"] == {"release": "2024-05-01"}


@pytest.mark.parametrize(
    ("document", "message"),
    [("name: [unclosed", "is not valid YAML"), ("- just\n- a list\n", "expected a mapping")],
)
def test_submit_rejects_a_file_that_is_not_a_yaml_mapping_without_calling_the_api(
    api: FakeApi, document: str, message: str
) -> None:
    result = run(api, "workload", "submit", "-", stdin=document)

    assert result.exit_code == 1
    assert message in result.stderr
    assert api.requests == []


def test_submit_prints_the_422_detail_on_stderr_and_exits_1(api: FakeApi, workload_file: Path) -> None:
    detail = "pod_sets.0.gpus: Input should be less than or equal to 64"
    api.reply("POST", "/v1/workloads", {"detail": detail, "errors": []}, status=422)

    result = run(api, "workload", "submit", str(workload_file))

    assert result.exit_code == 1
    assert result.stdout == ""
    assert f"invalid request: {detail}" in result.stderr


def test_submit_formats_fastapis_default_validation_list(api: FakeApi, workload_file: Path) -> None:
    detail = [{"loc": ["body", "pod_sets", 0, "gpus"], "msg": "too many", "type": "x"}]
    api.reply("POST", "/v1/workloads", {"detail": detail}, status=422)

    result = run(api, "workload", "submit", str(workload_file))

    assert result.exit_code == 1
    assert "invalid request: pod_sets.0.gpus: too many" in result.stderr


# --- list ----------------------------------------------------------------------------------------------


def test_list_sends_filters_as_query_params_and_prints_a_table(api: FakeApi) -> None:
    api.reply("GET", "/v1/workloads", page(WORKLOAD, QUEUED))

    result = run(
        api,
        "workload",
        "list",
        "--queue",
        "research",
        "--team",
        "vision",
        "--state",
        "queued",
        "--state",
        "running",
        "--limit",
        "5",
    )

    assert result.exit_code == 0, result.output
    sent = api.only
    assert (sent.method, sent.path) == ("GET", "/v1/workloads")
    assert sent.query == {"queue": ["research"], "team": ["vision"], "state": ["queued", "running"], "limit": ["5"]}
    assert sent.headers["authorization"] == "Bearer tok-123"
    header = next(line for line in result.stdout.splitlines() if "position" in line)
    for column in ("id", "name", "queue", "state", "pods", "cluster", "position", "reason"):
        assert column in header
    running = next(line for line in result.stdout.splitlines() if "wl_01hzabc" in line)
    assert all(v in running for v in ("train-llama", "research", "running", "eks-us-east"))
    assert "--cursor" not in result.stdout  # the last page
    queued = next(line for line in result.stdout.splitlines() if "wl_01hzqueued" in line)
    assert all(v in queued for v in ("eval-sweep", "evals", "queued", " 3 ", "waiting for quota"))


def test_list_without_filters_leaves_defaults_to_the_server(api: FakeApi) -> None:
    api.reply("GET", "/v1/workloads", page())

    result = run(api, "workload", "list")

    assert result.exit_code == 0, result.output
    assert api.only.query == {}
    assert result.stdout == "no workloads match\n"


def test_list_rejects_an_unknown_state_before_calling_the_api(api: FakeApi) -> None:
    result = run(api, "workload", "list", "--state", "sleeping")

    assert result.exit_code == 2
    assert "sleeping" in result.stderr
    assert api.requests == []


def test_list_piped_keeps_each_workload_on_one_line(api: FakeApi, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS")  # as in `gpufleet list | grep ...`: not a terminal, no width given
    reason = "waiting for quota: " + ", ".join(f"pool-{i} has 0 of 8 H100-80GB free" for i in range(5))
    api.reply("GET", "/v1/workloads", page(workload(reason=reason)))

    result = run(api, "workload", "list")

    assert result.exit_code == 0, result.output
    assert any("wl_01hzabc" in line and reason in line for line in result.stdout.splitlines())


# --- show ----------------------------------------------------------------------------------------------


def test_list_says_how_to_go_on_when_the_page_ends_early(api: FakeApi) -> None:
    # A page of the API ends at its byte cap (or at --limit) with a cursor to the rest.
    api.reply("GET", "/v1/workloads", page(WORKLOAD, following="1714557600000000.wl_01hzabc"))

    result = run(api, "workload", "list", "--state", "running", "--cursor", "1714557700000000.wl_01hzzz")

    assert result.exit_code == 0, result.output
    assert api.only.query == {"state": ["running"], "cursor": ["1714557700000000.wl_01hzzz"]}
    assert "wl_01hzabc" in result.stdout
    assert result.stdout.splitlines()[-1] == "more: add --cursor 1714557600000000.wl_01hzabc for the next page"


def test_show_prints_state_placement_runs_and_assignments(api: FakeApi) -> None:
    api.reply("GET", "/v1/workloads/wl_01hzabc", WORKLOAD)

    result = run(api, "workload", "show", "wl_01hzabc")

    assert result.exit_code == 0, result.output
    assert (api.only.method, api.only.path) == ("GET", "/v1/workloads/wl_01hzabc")
    out = result.stdout
    for expected in (
        "train-llama",
        "running",
        "eks-us-east",
        "eks-us-east-h100-0, eks-us-east-h100-1",
        "workers: 2 x 8 GPU on H100-80GB",
        "run_01first",
        "pods started",
        "h100",
    ):
        assert expected in out
    [placement] = [line for line in out.splitlines() if "workers" in line and "h100" in line]
    assert placement.split()[-2:] == ["2", "2"]


def test_show_says_which_gang_a_run_on_lent_capacity_was_held_for(api: FakeApi) -> None:
    lent = {**WORKLOAD["runs"][0], "lent_to": "wl_01hzbig"}
    api.reply("GET", "/v1/workloads/wl_01hzabc", {**WORKLOAD, "runs": [lent]})

    result = run(api, "workload", "show", "wl_01hzabc")

    assert result.exit_code == 0, result.output
    assert "on capacity held for wl_01hzbig" in result.stdout.replace("\n", " ")


def test_show_of_a_big_gang_prints_counts_not_pods(api: FakeApi) -> None:
    # As the API shows a 5,000-pod gang requeued 30 times: its latest runs, the first nodes, counts.
    nodes = [f"n-{i:04d}" for i in range(64)]
    runs = [{**WORKLOAD["runs"][0], "id": f"run_{i}", "attempt": i} for i in range(11, 31)]
    runs[-1]["placement"] = [
        {"pod_set": "launcher", "pool": "cpu", "pods": 1, "nodes": 1},
        {"pod_set": "workers", "pool": "h100", "pods": 4999, "nodes": 625},
    ]
    big = workload(nodes=nodes, node_count=626, runs=runs, attempts=30)
    api.reply("GET", "/v1/workloads/wl_01hzabc", big)

    result = run(api, "workload", "show", "wl_01hzabc")

    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "626 nodes: n-0000, n-0001" in out
    assert "n-0063, ..." in out
    assert "latest 20 of 30 runs" in out
    assert "placement of run 30 (run_30)" in out
    workers = next(line for line in out.splitlines() if "workers" in line and "4999" in line)
    assert workers.split()[-3:] == ["h100", "4999", "625"]


def test_show_prints_reason_and_queue_position_of_a_queued_workload(api: FakeApi) -> None:
    api.reply("GET", "/v1/workloads/wl_01hzqueued", QUEUED)

    result = run(api, "workload", "show", "wl_01hzqueued")

    assert result.exit_code == 0, result.output
    assert "waiting for quota: H100-80GB 16 > 8 free" in result.stdout
    position = next(line for line in result.stdout.splitlines() if "queue position" in line)
    assert "3" in position
    assert "no runs yet" in result.stdout


def test_show_quotes_the_id_so_it_cannot_reach_another_route(api: FakeApi) -> None:
    result = run(api, "workload", "show", "../clusters")

    assert result.exit_code == 1
    assert api.only.path == "/v1/workloads/..%2Fclusters"


def test_show_prints_the_404_detail(api: FakeApi) -> None:
    api.reply("GET", "/v1/workloads/wl_nope", {"detail": "no workload wl_nope"}, status=404)

    result = run(api, "workload", "show", "wl_nope")

    assert result.exit_code == 1
    assert "no workload wl_nope (HTTP 404)" in result.stderr


# --- cancel --------------------------------------------------------------------------------------------


def test_cancel_posts_the_reason(api: FakeApi) -> None:
    api.reply("GET", "/v1/workloads/wl_01hzabc", WORKLOAD)
    api.reply("POST", "/v1/workloads/wl_01hzabc/cancel", workload(state="cancelled", reason="wrong dataset"))

    result = run(api, "workload", "cancel", "wl_01hzabc", "--reason", "wrong dataset")

    assert result.exit_code == 0, result.output
    asked, posted = api.requests
    assert (asked.method, asked.path) == ("GET", "/v1/workloads/wl_01hzabc")
    assert (posted.method, posted.path) == ("POST", "/v1/workloads/wl_01hzabc/cancel")
    assert posted.body == {"reason": "wrong dataset"}
    assert posted.headers["authorization"] == "Bearer tok-123"
    assert result.stdout == "wl_01hzabc: cancelled (wrong dataset)\n"


def test_cancel_without_reason_sends_no_body_so_the_server_default_applies(api: FakeApi) -> None:
    api.reply("GET", "/v1/workloads/wl_01hzabc", WORKLOAD)
    api.reply("POST", "/v1/workloads/wl_01hzabc/cancel", workload(state="cancelled", reason="cancelled by user"))

    result = run(api, "workload", "cancel", "wl_01hzabc")

    assert result.exit_code == 0, result.output
    assert api.requests[-1].body is None


def test_a_second_cancel_says_it_was_cancelled_already(api: FakeApi) -> None:
    api.reply("GET", "/v1/workloads/wl_01hzabc", workload(state="cancelled", reason="wrong dataset"))

    result = run(api, "workload", "cancel", "wl_01hzabc")

    assert result.exit_code == 0, result.output
    assert result.stdout == "wl_01hzabc: already cancelled (wrong dataset)\n"
    assert [r.method for r in api.requests] == ["GET"]  # nothing to post


def test_cancel_of_a_finished_workload_prints_the_conflict(api: FakeApi) -> None:
    detail = "workload wl_01hzabc is succeeded and cannot be cancelled"
    api.reply("GET", "/v1/workloads/wl_01hzabc", workload(state="succeeded"))
    api.reply("POST", "/v1/workloads/wl_01hzabc/cancel", {"detail": detail}, status=409)

    result = run(api, "workload", "cancel", "wl_01hzabc")

    assert result.exit_code == 1
    assert detail in result.stderr


# --- queues and clusters -------------------------------------------------------------------------------


QUEUE_STATUS = {
    "queues": [
        {"level": "team", "name": "nlp", "team": "nlp", "pending": 7, "used_gpu_eq": 20.0},
        {"level": "queue", "name": "research", "team": "nlp", "pending": 3, "used_gpu_eq": 12.333333},
    ]
}


def test_queue_list_prints_quotas_weights_and_from_the_status_use_and_pending(api: FakeApi) -> None:
    api.reply("GET", "/v1/queues", QUEUES)
    api.reply("GET", "/v1/status", QUEUE_STATUS)

    result = run(api, "queue", "list")

    assert result.exit_code == 0, result.output
    assert [(r.method, r.path) for r in api.requests] == [("GET", "/v1/queues"), ("GET", "/v1/status")]
    lines = result.stdout.splitlines()
    assert "used gpu-eq" in result.stdout
    research = next(line for line in lines if "research" in line)
    assert all(v in research for v in ("nlp", " 12.33 ", " 3 ", "H100-80GB=16, gpu-eq=4.5", "unbounded", "2"))
    evals = next(line for line in lines if "evals" in line)  # the status has no line for it
    assert all(v in evals for v in ("gpu-eq=32", "0.5"))
    assert evals.split()[2:4] == ["-", "-"]


def test_json_lists_print_the_objects_alone_without_asking_the_status(api: FakeApi) -> None:
    api.reply("GET", "/v1/queues", QUEUES)

    result = run(api, "queue", "list", "-o", "json")

    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == QUEUES
    assert api.only.path == "/v1/queues"


POOL_STATUS = {
    "pools": [
        {"cluster": "eks-us-east", "pool": "h100", "allocated": 24.0, "free": 8.0, "pending": 40.5},
    ]
}


def test_cluster_list_prints_one_row_per_pool(api: FakeApi) -> None:
    api.reply("GET", "/v1/clusters", CLUSTERS)
    api.reply("GET", "/v1/status", POOL_STATUS)

    result = run(api, "cluster", "list")

    assert result.exit_code == 0, result.output
    assert [(r.method, r.path) for r in api.requests] == [("GET", "/v1/clusters"), ("GET", "/v1/status")]
    h100_figures = next(line for line in result.stdout.splitlines() if " h100 " in line).split()[-3:]
    assert h100_figures == ["24", "8", "40.5"]  # allocated, free, pending: from the status
    lines = result.stdout.splitlines()
    h100 = next(line for line in lines if "H100-80GB" in line)
    assert all(v in h100 for v in ("eks-us-east", "sim", "us-east-1", "h100", " 8 ", " 4 ", "exclusive", "4.50"))
    mig = next(line for line in lines if "A100-40GB" in line)
    assert all(v in mig for v in ("a100-mig", "mig:all-balanced", "1.25*"))
    assert "eks-us-east" not in mig  # cluster columns only on the first pool row
    l4 = next(line for line in lines if " L4 " in line)
    assert all(v in l4 for v in ("gke-eu-west", "europe-west4", "timeslice:4", "0.70"))


# --- --json (and -o json) on every command ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "method", "path", "payload"),
    [
        (["workload", "submit", "-"], "POST", "/v1/workloads", QUEUED),
        (["workload", "list"], "GET", "/v1/workloads", page(WORKLOAD, QUEUED, following="1714557600000000.wl-0")),
        (["workload", "show", "wl_01hzabc"], "GET", "/v1/workloads/wl_01hzabc", WORKLOAD),
        (["workload", "cancel", "wl_01hzabc"], "POST", "/v1/workloads/wl_01hzabc/cancel", workload(state="cancelled")),
        (["queue", "list"], "GET", "/v1/queues", QUEUES),
        (["cluster", "list"], "GET", "/v1/clusters", CLUSTERS),
    ],
)
def test_json_prints_the_raw_response(api: FakeApi, args: list[str], method: str, path: str, payload: Any) -> None:
    api.reply(method, path, payload, status=201 if method == "POST" and path == "/v1/workloads" else 200)
    if args[1] == "cancel":
        api.reply("GET", "/v1/workloads/wl_01hzabc", WORKLOAD)  # asked first: not cancelled yet

    result = run(api, *args, "--json", stdin=WORKLOAD_YAML)

    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == payload


def test_every_workload_verb_takes_the_shared_connection_and_output_options() -> None:
    for name, command in workload_group.commands.items():
        options = {opt for param in command.params for opt in param.opts}
        assert {"--api", "--token", "-o", "--output", "--json"} <= options, name


# --- connection and token ------------------------------------------------------------------------------


def test_token_falls_back_to_admin_token_in_the_state_dir(api: FakeApi, clean_env: Path) -> None:
    clean_env.mkdir()
    (clean_env / "admin.token").write_text("gpf_from_file\n")
    api.reply("GET", "/v1/priority-classes", [])

    result = run(api, "priority-class", "list", token=None)

    assert result.exit_code == 0, result.output
    assert api.only.headers["authorization"] == "Bearer gpf_from_file"


def test_token_from_env_wins_over_the_file_and_the_option_over_both(
    api: FakeApi, clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clean_env.mkdir()
    (clean_env / "admin.token").write_text("gpf_from_file\n")
    monkeypatch.setenv("GPUFLEET_TOKEN", "gpf_from_env")
    api.reply("GET", "/v1/priority-classes", [])

    assert run(api, "priority-class", "list", token=None).exit_code == 0
    assert run(api, "priority-class", "list", token="gpf_from_option").exit_code == 0

    assert [r.headers["authorization"] for r in api.requests] == ["Bearer gpf_from_env", "Bearer gpf_from_option"]


def test_api_url_comes_from_the_environment(api: FakeApi, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_API", api.url)
    api.reply("GET", "/v1/clusters", [])

    result = CliRunner().invoke(main, ["cluster", "list", "--token", "t", "-o", "json"])

    assert result.exit_code == 0, result.output
    assert api.only.path == "/v1/clusters"


def test_401_without_a_token_says_how_to_provide_one(api: FakeApi, clean_env: Path) -> None:
    api.reply("GET", "/v1/workloads", {"detail": "missing, unknown or revoked API token"}, status=401)

    result = run(api, "workload", "list", token=None)

    assert result.exit_code == 1
    assert "authorization" not in api.only.headers
    assert "no API token was sent" in result.stderr
    for hint in ("--token", "GPUFLEET_TOKEN", str(clean_env / "admin.token")):
        assert hint in result.stderr


def test_401_with_a_token_says_it_was_rejected(api: FakeApi) -> None:
    api.reply("GET", "/v1/workloads", {"detail": "missing, unknown or revoked API token"}, status=401)

    result = run(api, "workload", "list", token="gpf_revoked")

    assert result.exit_code == 1
    assert "the API token was rejected (missing, unknown or revoked API token)" in result.stderr
    assert "GPUFLEET_TOKEN" in result.stderr


def test_a_non_json_error_body_is_still_shown(api: FakeApi) -> None:
    api.reply("GET", "/v1/queues", b"upstream connect error", status=502)

    result = run(api, "queue", "list")

    assert result.exit_code == 1
    assert "upstream connect error (HTTP 502)" in result.stderr


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_unreachable_api_names_the_url_and_suggests_gpufleet_up(closed_port: int) -> None:
    url = f"http://127.0.0.1:{closed_port}"

    result = CliRunner().invoke(main, ["workload", "list", "--api", url, "--token", "t"])

    assert result.exit_code == 1
    assert f"not reachable at {url}" in result.stderr
    assert "gpufleet up" in result.stderr


def test_a_slow_api_times_out_with_a_message(api: FakeApi, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rest_api, "TIMEOUT_SECONDS", 0.05)
    api.reply("GET", "/v1/clusters", [], delay=0.3)

    result = run(api, "cluster", "list")

    assert result.exit_code == 1
    assert f"{api.url} did not answer within 0.05 s" in result.stderr


def test_show_says_how_few_pods_a_pod_set_with_a_minimum_may_start_with(api: FakeApi) -> None:
    elastic = workload(
        pod_sets=[
            {"name": "launcher", "replicas": 1, "gpus": 0, "min_replicas": 1},
            {"name": "workers", "replicas": 4, "gpus": 8, "gpu_models": ["H100-80GB"], "min_replicas": 2},
        ]
    )
    api.reply("GET", "/v1/workloads/wl_01hzabc", elastic)

    result = run(api, "workload", "show", "wl_01hzabc")

    assert result.exit_code == 0, result.output
    assert "workers: 4 (at least 2) x 8 GPU on H100-80GB" in result.stdout
    assert "launcher: 1 x 0 GPU" in result.stdout  # a minimum equal to the count says nothing


# --- -o table|json|yaml: one rule for every command -------------------------------------------------

STATUS: dict[str, Any] = {
    "at": "2024-05-01T10:00:00Z",
    "clusters": 2,
    "gpus": [{"gpu_model": "H100-80GB", "sharing": "exclusive", "capacity": 32.0, "allocated": 16.0}],
    "queues": [
        {"level": "team", "name": "nlp", "team": "nlp", "pending": 1, "pending_by_reason": {"quota": 1},
         "used_gpu_eq": 16.0, "guaranteed_gpu_eq": 8.0, "limit_gpu_eq": None},
        {"level": "queue", "name": "research", "team": "nlp", "pending": 1, "pending_by_reason": {"quota": 1},
         "used_gpu_eq": 16.0, "guaranteed_gpu_eq": 8.0, "limit_gpu_eq": 32.0},
    ],
    "control_plane": None,
}  # fmt: skip


def test_status_prints_gpus_then_teams_and_their_queues(api: FakeApi) -> None:
    api.reply("GET", "/v1/status", STATUS)

    result = run(api, "status")

    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    h100 = next(line for line in lines if "H100-80GB" in line)
    assert all(v in h100 for v in ("exclusive", "32", "16", "50 %"))
    research = next(line for line in lines if "research" in line)
    assert all(v in research for v in ("quota 1", "16", "8", "32"))
    assert "scheduler" not in result.stdout  # a team token sees no control-plane line


PRINTING = [
    (["workload", "submit", "-"], "POST", "/v1/workloads", QUEUED),
    (["workload", "list"], "GET", "/v1/workloads", page(WORKLOAD, QUEUED)),
    (["workload", "show", "wl_01hzabc"], "GET", "/v1/workloads/wl_01hzabc", WORKLOAD),
    (["queue", "list"], "GET", "/v1/queues", QUEUES),
    (["cluster", "list"], "GET", "/v1/clusters", CLUSTERS),
    (["cluster", "show", "eks-us-east"], "GET", "/v1/clusters/eks-us-east", CLUSTERS[0]),
    (["status"], "GET", "/v1/status", STATUS),
    (["audit"], "GET", "/v1/audit", {"generated_at": "2024-05-01T10:00:00Z", "counts": {"high": 0}, "findings": []}),
]


@pytest.mark.parametrize(("args", "method", "path", "payload"), PRINTING, ids=[" ".join(p[0]) for p in PRINTING])
def test_yaml_reads_back_as_the_same_data_as_json(
    api: FakeApi, args: list[str], method: str, path: str, payload: Any
) -> None:
    api.reply(method, path, payload, status=201 if method == "POST" else 200)

    as_json = run(api, *args, "-o", "json", stdin=WORKLOAD_YAML)
    as_yaml = run(api, *args, "-o", "yaml", stdin=WORKLOAD_YAML)
    older = run(api, *args, "--json", stdin=WORKLOAD_YAML)

    for result in (as_json, as_yaml, older):
        assert result.exit_code == 0, result.output
    assert json.loads(as_json.stdout) == payload
    assert yaml.safe_load(as_yaml.stdout) == payload
    assert older.stdout == as_json.stdout


def test_json_and_another_output_together_are_a_usage_error_before_anything_is_sent(api: FakeApi) -> None:
    for args in (["workload", "list"], ["queue", "list"]):
        result = run(api, *args, "--json", "-o", "yaml")
        assert result.exit_code == 2, result.output
        assert "--json means -o json" in result.stderr
    assert api.requests == []


def test_an_object_verb_takes_the_options_before_or_after_it_and_its_own_win(api: FakeApi) -> None:
    api.reply("GET", "/v1/queues", QUEUES)
    runner = CliRunner()
    before = runner.invoke(main, ["queue", "--api", api.url, "--token", "t", "-o", "yaml", "list"])
    after = runner.invoke(main, ["queue", "list", "--api", api.url, "--token", "t", "-o", "yaml"])
    both = runner.invoke(
        main, ["queue", "-o", "yaml", "--api", "http://127.0.0.1:1", "list", "--api", api.url, "--json"]
    )

    for result in (before, after, both):
        assert result.exit_code == 0, result.output
    assert before.stdout == after.stdout
    assert yaml.safe_load(before.stdout) == QUEUES
    assert json.loads(both.stdout) == QUEUES  # the verb's --api and --json over the group's
    assert len(api.requests) == 3


def test_watch_prints_one_document_per_change_as_yaml(api: FakeApi) -> None:
    api.reply("GET", "/v1/workloads/wl_01hzabc", workload(state="succeeded"))

    result = run(api, "workload", "watch", "wl_01hzabc", "-o", "yaml")

    assert result.exit_code == 0, result.output
    [document] = list(yaml.safe_load_all(result.stdout))
    assert document == workload(state="succeeded")


# --- the flat names of the previous release -----------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new"),
    [(["list"], ["workload", "list"]), (["queues"], ["queue", "list"]), (["clusters"], ["cluster", "list"])],
)
def test_an_old_name_prints_what_the_new_one_prints_and_names_it_on_stderr(
    api: FakeApi, old: list[str], new: list[str]
) -> None:
    api.reply("GET", "/v1/workloads", page(WORKLOAD))
    api.reply("GET", "/v1/queues", QUEUES)
    api.reply("GET", "/v1/clusters", CLUSTERS)

    deprecated = run(api, *old, "--json")
    grouped = run(api, *new, "--json")

    assert deprecated.exit_code == 0, deprecated.output
    assert deprecated.stdout == grouped.stdout
    assert f"use `gpufleet {' '.join(new)}`" in deprecated.stderr
    assert grouped.stderr == ""


def test_list_shows_each_gangs_gpus_models_and_age(api: FakeApi) -> None:
    sliced = workload(
        id="wl_01hzmig",
        created_at="2024-05-01T09:58:00Z",
        pod_sets=[
            {"name": "server", "replicas": 2, "gpus": 0, "mig_profile": "1g.10gb", "gpu_models": ["A100-40GB"]},
            {"name": "shared", "replicas": 4, "gpus": 0, "gpu_fraction": 0.25},
            {"name": "launcher", "replicas": 1, "gpus": 0},
        ],
    )
    api.reply("GET", "/v1/workloads", page(WORKLOAD, sliced))

    result = run(api, "workload", "list")

    assert result.exit_code == 0, result.output
    header = next(line for line in result.stdout.splitlines() if "position" in line)
    assert all(column in header for column in ("gpus", "age"))
    whole = next(line for line in result.stdout.splitlines() if "wl_01hzabc" in line)
    assert "16 on H100-80GB" in whole  # 2 pods x 8 GPUs
    assert re.search(r" \d+d ", whole)  # created in 2024: days ago
    mig = next(line for line in result.stdout.splitlines() if "wl_01hzmig" in line)
    assert "2 x MIG 1g.10gb + 4 x 0.25 on A100-40GB" in mig


def test_age_is_the_largest_whole_unit() -> None:
    now = datetime(2024, 5, 2, 10, 0, 0, tzinfo=UTC)
    assert age("2024-05-02T09:59:15Z", now) == "45s"
    assert age("2024-05-02T09:48:00Z", now) == "12m"
    assert age("2024-05-02T07:00:00+00:00", now) == "3h"
    assert age("2024-04-27T10:00:00Z", now) == "5d"
    assert age(None, now) == "-"
    assert age("yesterday", now) == "-"
