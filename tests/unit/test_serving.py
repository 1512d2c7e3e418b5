"""Serving signals without I/O: the declared block's validation, the wire format of readings, the
idle policy fed with traffic, and the totals read from a server's metrics text."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from adapters.prometheus.serving_scrape import serving_totals
from controlplane.core.idle import GpuReading, IdlePolicy, IdleRules, RunActivity, Stage, Status, evaluate
from controlplane.service.commands import SubmitWorkload
from controlplane.service.serving import ServingReading, ServingSpec
from controlplane.service.telemetry_wire import MAX_SERVING_PER_BATCH, MalformedBatch, decode_message, encode_batch
from tests.telemetry.vllm_samples import vllm_metrics

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
BODY = {"name": "chat", "queue": "q", "kind": "inference", "pod_sets": [{"name": "s", "replicas": 1, "gpus": 1}]}


def test_the_serving_block_is_validated_strictly() -> None:
    ok = SubmitWorkload.model_validate({**BODY, "serving": {"traffic_metric": "vllm:request_success_total"}})
    assert ok.serving_declaration() == {
        "traffic_metric": "vllm:request_success_total",
        "latency_metric": None,
        "latency_objective_ms": None,
        "metrics_port": 8000,
        "metrics_path": "/metrics",
    }
    assert SubmitWorkload.model_validate(BODY).serving_declaration() is None
    for bad in (
        {"traffic_metric": "9starts_with_digit"},
        {"traffic_metric": "has-dash"},
        {"traffic_metric": "a" * 201},
        {"latency_metric": 'x{le="1"}'},
        {"traffic_metric": "x", "metrics_port": 0},
        {"traffic_metric": "x", "metrics_port": 65536},
        {"traffic_metric": "x", "metrics_path": "metrics"},
        {"traffic_metric": "x", "metrics_path": "/a b"},
        {"traffic_metric": "x", "metrics_path": "/m#frag"},
        {"latency_metric": "x", "latency_objective_ms": 0},
        {"latency_metric": "x", "latency_objective_ms": float("inf")},
        {"traffic_metric": "x", "latency_objective_ms": 100},
        {},
    ):
        with pytest.raises(ValidationError):
            ServingSpec.model_validate(bad)
    with pytest.raises(ValidationError, match="inference workloads only"):
        SubmitWorkload.model_validate({**BODY, "kind": "training", "serving": {"traffic_metric": "x"}})


def test_readings_round_trip_the_wire_and_bad_ones_are_refused() -> None:
    readings = [ServingReading("run-a", NOW, 2.5, 180.0), ServingReading("run-b", NOW, None, None)]
    payload = encode_batch("c1", [], readings)
    assert decode_message(payload, "c1", NOW) == ([], readings)
    assert "serving" not in json.loads(encode_batch("c1", []))  # older consumers see what they saw

    def body(serving: object) -> bytes:
        return json.dumps(
            {"schema": "gpufleet.dcgm/v1", "cluster": "c1", "fields": [], "samples": [], "serving": serving}
        ).encode()

    t = NOW.timestamp()
    for bad, reason in (
        ("x", "serving: expected a list"),
        ([["run-a", t, 1.0]], "expected [run, t"),
        ([["", t, 1.0, None]], "run"),
        ([["r" * 41, t, 1.0, None]], "run"),
        ([["run-a", t + 3600, 1.0, None]], ".t"),
        ([["run-a", t - 3 * 86400, 1.0, None]], ".t"),
        ([["run-a", t, -1.0, None]], "requests_per_second"),
        ([["run-a", t, True, None]], "requests_per_second"),
        ([["run-a", t, 1.0, "fast"]], "latency_ms"),
        ([["run-a", t, 2e9, None]], "requests_per_second"),
        ([["run-a", t, 1.0, None]] * (MAX_SERVING_PER_BATCH + 1), "at most"),
    ):
        with pytest.raises(MalformedBatch, match=reason.replace("[", r"\[")):
            decode_message(body(bad), "c1", NOW)


def _inference(traffic: float | None, traffic_at: datetime | None = None) -> RunActivity:
    """A served model whose 8 GPUs have been idle for an hour."""
    start = NOW - timedelta(hours=3)
    readings = [GpuReading(f"g{i}", NOW - timedelta(minutes=5 * (k + 1)), 0.0, 10) for k in range(12) for i in range(8)]
    return RunActivity(
        "run-1", "wl-1", "chat", "serve", "prod", "batch", "inference", "c1", start, 8, readings, traffic, traffic_at
    )


def test_idle_policy_judges_inference_only_on_fresh_zero_traffic() -> None:
    rules = IdleRules(default=IdlePolicy(grace_seconds=600), working_hours=None)
    zero = evaluate(_inference(0.0, NOW - timedelta(seconds=30)), rules, NOW)
    assert (zero.status, zero.stage) == (Status.IDLE, Stage.RECLAIM)
    serving = evaluate(_inference(0.4, NOW - timedelta(seconds=30)), rules, NOW)
    assert (serving.status, serving.stage) == (Status.EXEMPT, Stage.NONE)
    assert "0.4 requests/s" in serving.reason
    unknown = evaluate(_inference(None), rules, NOW)
    assert (unknown.status, unknown.stage) == (Status.EXEMPT, Stage.NONE)
    stale = evaluate(_inference(0.0, NOW - timedelta(hours=1)), rules, NOW)
    assert (stale.status, stale.stage) == (Status.EXEMPT, Stage.NONE)
    assert "stale" in stale.reason


def test_totals_sum_every_series_of_the_declared_metrics() -> None:
    text = vllm_metrics(stop=120, length=30, latency_sum=75.5, latency_count=150)
    totals = serving_totals(text, "vllm:request_success_total", "vllm:e2e_request_latency_seconds")
    assert (totals.requests, totals.latency_sum, totals.latency_count) == (150.0, 75.5, 150.0)
    # `_total` may be left out of the declared counter; an undeclared or absent metric is None.
    assert serving_totals(text, "vllm:request_success", None).requests == 150.0
    missing = serving_totals(text, "tgi_request_count", "tgi_request_duration")
    assert (missing.requests, missing.latency_sum, missing.latency_count) == (None, None, None)
