"""Folding samples into windows on hand-checked numbers, the merge rule, and the wire format."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta

import pytest

from controlplane.service.telemetry import ActivitySource, TelemetryWindow, fold, merge
from controlplane.service.telemetry_wire import (
    DCGM_FP64_BLANK,
    DCGM_INT64_BLANK,
    GpuSample,
    MalformedBatch,
    decode_batch,
    encode_batch,
    is_blank,
)

T0 = 1_767_600_000.0  # 2026-01-05 08:00:00 UTC, a multiple of 300
NOW = datetime.fromtimestamp(T0 + 600, UTC)


def sample(t: float, run: str | None = "run-a", gpu: int = 0, mig: int | None = None, **metrics: float) -> GpuSample:
    return GpuSample(
        cluster="c1",
        node="n1",
        gpu_uuid=f"GPU-{gpu}",
        gpu_index=gpu,
        timestamp=T0 + t,
        metrics=metrics,
        run_id=run,
        mig_instance=mig,
        mig_profile=None if mig is None else "1g.10gb",
        pod=None if run is None else f"{run}-0",
        namespace=None if run is None else "team",
    )


def test_one_window_on_hand_checked_numbers() -> None:
    [w] = fold(
        [
            sample(10, sm_active=0.2, gpu_util=100, tensor_active=0.1, fb_used_mib=1000, power_w=100, xid=0),
            sample(20, sm_active=0.4, gpu_util=100, tensor_active=0.3, fb_used_mib=3000, power_w=200, xid=79),
            sample(30, sm_active=0.9, gpu_util=50, fb_used_mib=2000, power_w=300, xid=0),
        ]
    )
    assert (w.run_id, w.gpu_key, w.window_start, w.window_seconds) == (
        "run-a",
        "c1/n1/GPU-0",
        datetime.fromtimestamp(T0, UTC),
        300,
    )
    assert w.samples == 3
    assert w.activity_source is ActivitySource.SM_ACTIVE
    assert w.activity_samples == 3
    assert w.activity_mean == pytest.approx(0.5)
    assert w.activity_max == pytest.approx(0.9)
    assert w.tensor_mean == pytest.approx(0.2)  # two readings: (0.1 + 0.3) / 2
    assert w.fb_used_mean_mib == pytest.approx(2000)
    assert w.fb_free_mean_mib is None
    assert w.power_mean_w == pytest.approx(200)
    # GPU_UTIL is kept as a ratio beside SM_ACTIVE: (1.0 + 1.0 + 0.5) / 3
    assert w.gpu_util_sum / w.gpu_util_n == pytest.approx(2.5 / 3)
    # The latest XID reading wins (0 at t=30 clears 79 at t=20); the error is still counted.
    assert (w.xid_last, w.xid_at, w.xid_error_samples) == (0, datetime.fromtimestamp(T0 + 30, UTC), 1)
    assert (w.first_sample_at, w.last_sample_at) == (
        datetime.fromtimestamp(T0 + 10, UTC),
        datetime.fromtimestamp(T0 + 30, UTC),
    )
    assert w.window_end == datetime.fromtimestamp(T0 + 300, UTC)


def test_samples_split_at_window_boundaries_and_by_run_gpu_and_mig_instance() -> None:
    windows = fold(
        [
            sample(299.9, sm_active=0.1),
            sample(300, sm_active=0.3),
            sample(10, gpu=1, sm_active=0.5),
            sample(10, mig=3, gr_engine_active=0.7),
            sample(10, run=None, sm_active=0.0),
        ]
    )
    keys = [(w.run_id, w.gpu_key, int(w.window_start.timestamp() - T0)) for w in windows]
    assert keys == [
        (None, "c1/n1/GPU-0", 0),
        ("run-a", "c1/n1/GPU-0", 0),
        ("run-a", "c1/n1/GPU-0", 300),
        ("run-a", "c1/n1/GPU-0/mig3", 0),
        ("run-a", "c1/n1/GPU-1", 0),
    ]
    assert windows[3].mig_profile == "1g.10gb"
    assert windows[3].mig_instance == 3


def test_activity_falls_back_to_gr_engine_then_gpu_util_and_says_which() -> None:
    [gr] = fold([sample(1, gr_engine_active=0.6, gpu_util=100), sample(2, gr_engine_active=0.2, gpu_util=0)])
    assert (gr.activity_source, gr.activity_mean, gr.activity_max) == (ActivitySource.GR_ENGINE_ACTIVE, 0.4, 0.6)
    [util] = fold([sample(1, gpu_util=100), sample(2, gpu_util=50), sample(3, fb_used_mib=10)])
    assert util.activity_source is ActivitySource.GPU_UTIL
    assert util.activity_samples == 2
    assert util.activity_mean == pytest.approx(0.75)
    assert util.activity_max == pytest.approx(1.0)
    [none] = fold([sample(1, fb_used_mib=100)])
    assert (none.activity_source, none.activity_mean, none.activity_max, none.activity_samples) == (None, None, None, 0)


def test_a_window_with_any_sm_active_reading_reports_only_those() -> None:
    # Mixing SM_ACTIVE and a busy flag into one mean would make the figure meaningless.
    [w] = fold([sample(1, sm_active=0.1, gpu_util=100), sample(2, gpu_util=100)])
    assert (w.activity_source, w.activity_samples, w.activity_mean) == (ActivitySource.SM_ACTIVE, 1, 0.1)


def _random_samples(rng: random.Random, n: int) -> list[GpuSample]:
    out = []
    for _ in range(n):
        metrics = {
            name: round(rng.random() * scale, 6)
            for name, scale in (("sm_active", 1), ("gr_engine_active", 1), ("gpu_util", 100), ("power_w", 700))
            if rng.random() < 0.8
        }
        if rng.random() < 0.3:
            metrics["xid"] = float(rng.choice([0, 13, 31, 79]))
        out.append(sample(rng.choice([0.0, 5.0, 299.0, 301.0, 450.0]), gpu=rng.randrange(2), **metrics))
    return out


def _close(a: TelemetryWindow, b: TelemetryWindow) -> None:
    assert a._replace(**{k: 0.0 for k in a._fields if k.endswith("_sum")}) == b._replace(
        **{k: 0.0 for k in b._fields if k.endswith("_sum")}
    )
    for name in (k for k in a._fields if k.endswith("_sum")):
        assert getattr(a, name) == pytest.approx(getattr(b, name))


@pytest.mark.parametrize("seed", range(5))
def test_merging_partial_windows_in_any_order_equals_folding_everything(seed: int) -> None:
    rng = random.Random(seed)
    batches = [_random_samples(rng, rng.randrange(1, 12)) for _ in range(6)]
    whole = {(w.run_id, w.gpu_key, w.window_start): w for w in fold([s for b in batches for s in b])}
    for order in (batches, batches[::-1], rng.sample(batches, len(batches))):
        merged: dict[tuple[str | None, str, datetime], TelemetryWindow] = {}
        for batch in order:
            for w in fold(batch):
                key = (w.run_id, w.gpu_key, w.window_start)
                merged[key] = merge(merged[key], w) if key in merged else w
        assert merged.keys() == whole.keys()
        for key, w in whole.items():
            _close(merged[key], w)


def test_merge_refuses_windows_of_different_keys() -> None:
    [a] = fold([sample(1, sm_active=0.1)])
    [b] = fold([sample(1, gpu=1, sm_active=0.1)])
    with pytest.raises(ValueError, match="different keys"):
        merge(a, b)


# --- wire format -------------------------------------------------------------------------------


def test_batches_round_trip_through_the_wire_format() -> None:
    original = [sample(1, sm_active=0.5, xid=0), sample(2, mig=4, gr_engine_active=0.25), sample(3, run=None)]
    assert decode_batch(encode_batch("c1", original), "c1", NOW) == original


def _body(**overrides: object) -> bytes:
    body = json.loads(encode_batch("c1", [sample(1, sm_active=0.5, power_w=100.0)]))
    body.update(overrides)
    return json.dumps(body).encode()


def _first(**changes: object) -> bytes:
    body = json.loads(_body())
    item = body["samples"][0]
    positions = {"node": 0, "uuid": 1, "gpu": 2, "t": 3, "run": 4, "mig_id": 6, "values": 10}
    for name, value in changes.items():
        item[positions[name]] = value
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"{not json", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (_body(schema="other/v9"), "schema"),
        (_body(cluster="c2"), "sent for 'c1'"),
        (_body(samples={}), "samples"),
        (_first(node=""), "samples[0].node"),
        (_first(uuid=7), "samples[0].uuid"),
        (_first(gpu=True), "samples[0].gpu"),
        (_first(gpu=-1), "samples[0].gpu"),
        (_first(t="now"), "samples[0].t"),
        (_first(t=T0 + 86400 * 30), "in the future"),
        (_first(t=T0 - 86400 * 30), "too old"),
        (_first(run="r" * 41), "samples[0].run"),
        (_first(mig_id=-3), "samples[0].mig_id"),
        (_first(values=[0.5]), "samples[0].values"),
        (_first(values=[0.5, None, None, None, None, None, -1.0, None]), "values[6]"),
        (_first(values=[0.5, None, None, None, None, None, True, None]), "values[6]"),
        (_first(values=[0.5, None, None, None, None, None, "1", None]), "values[6]"),
        (
            b'{"schema": "gpufleet.dcgm/v1", "cluster": "c1", "fields": ["sm_active"], "samples": '
            b'[["n1", "GPU-0", 0, 1767600001.0, null, null, null, null, null, null, [NaN]]]}',
            "NaN is not a number",
        ),
    ],
)
def test_malformed_batches_are_refused_with_the_reason(data: bytes, reason: str) -> None:
    with pytest.raises(MalformedBatch, match=reason.replace("[", r"\[").replace("]", r"\]")):
        decode_batch(data, "c1", NOW)


def test_unknown_fields_are_ignored_and_fields_may_come_in_any_order() -> None:
    body = {
        "schema": "gpufleet.dcgm/v1",
        "cluster": "c1",
        "fields": ["power_w", "dram_active", "sm_active"],
        "samples": [["n1", "GPU-0", 0, T0 + 1, "run-a", None, None, None, None, None, [250.0, 0.4, 0.75]]],
    }
    [decoded] = decode_batch(json.dumps(body).encode(), "c1", NOW)
    assert decoded.metrics == {"power_w": 250.0, "sm_active": 0.75}


def test_sentinels_on_the_wire_are_dropped_and_infinities_refused() -> None:
    data = _first(values=[0.5, None, None, None, None, None, 140737488355328.0, None])
    [decoded] = decode_batch(data, "c1", NOW)
    assert decoded.metrics == {"sm_active": 0.5}
    assert decoded.timestamp == T0 + 1
    # Non-finite numbers are refused on every consumer (the shared decoder); an agent that read
    # an infinity sends null (see `encode_batch`).
    for literal in (b"Infinity,", b"1e999,", b"-Infinity,"):
        with pytest.raises(MalformedBatch, match="infinit"):
            decode_batch(data.replace(b"0.5,", literal), "c1", NOW)


def test_encode_writes_non_finite_readings_as_null() -> None:
    sample = GpuSample("c1", "n", "GPU-0", 0, T0 + 1, {"sm_active": float("inf"), "power_w": float("nan")})
    [decoded] = decode_batch(encode_batch("c1", [sample]), "c1", NOW)
    assert decoded.metrics == {}


def test_encode_refuses_samples_of_another_cluster() -> None:
    other = GpuSample("c9", "n", "GPU-0", 0, T0, {})
    with pytest.raises(ValueError, match="c9"):
        encode_batch("c1", [other])


def test_window_start_is_aligned_to_the_epoch_in_utc() -> None:
    [w] = fold([sample(301, sm_active=0.5)], window_seconds=60)
    assert w.window_start == datetime.fromtimestamp(T0 + 300, UTC)
    assert w.window_end - w.window_start == timedelta(seconds=60)


def test_blank_threshold_covers_both_dcgm_sentinels_and_no_real_reading() -> None:
    for value in (DCGM_INT64_BLANK, DCGM_INT64_BLANK + 2, DCGM_FP64_BLANK):
        assert is_blank(float(value))
    # Twice an H100's framebuffer in MiB, a kilowatt, an XID code: all far below the threshold.
    for value in (163_840.0, 1000.0, 79.0, 1.0):
        assert not is_blank(value)
