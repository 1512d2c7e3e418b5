"""GPU telemetry on the wire: the DCGM fields gpufleet keeps, one sample, and the batch format.

An agent encodes one batch message per scrape (`encode_batch`); the consumer decodes and checks it
(`decode_items`, the fast path the ingest folds from, or `decode_batch` for whole samples) and
refuses anything it does not accept with `MalformedBatch`, whose reason goes to the dead-letter
stream. Nothing here touches storage.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from controlplane.service.safejson import UnsafeJson, decode
from controlplane.service.serving import MAX_LATENCY_MS, MAX_RPS, ServingReading

SCHEMA = "gpufleet.dcgm/v1"
# A batch from one exporter scrape holds a few dozen samples (8 GPUs x 7 MIG slices at most);
# anything this large is not an agent talking.
MAX_SAMPLES_PER_BATCH = 10_000
# Serving readings: one per inference run the agent scrapes; a node or cluster runs far fewer.
MAX_SERVING_PER_BATCH = 2_000
# Samples from the future create windows nobody will ever complete; a few minutes covers clock skew.
MAX_CLOCK_SKEW = timedelta(minutes=5)
# GPU indexes and MIG instance ids are small; a bound keeps a hostile value out of integer columns.
MAX_GPU_INDEX = 4095
# The telemetry stream keeps messages for a day; older samples can only come from a broken agent.
MAX_SAMPLE_AGE = timedelta(days=2)

# DCGM reports "blank" / "not supported" as huge sentinels: int64 values from 0x7ffffffffffffff0
# (plus 1..3), and 2**47 for fp64 fields. No field gpufleet keeps can reach 2**47 legitimately
# (MiB, watts, ratios, XID codes), so one threshold covers both kinds.
DCGM_FP64_BLANK = 140737488355328.0
DCGM_INT64_BLANK = 0x7FFFFFFFFFFFFFF0


def is_blank(value: float) -> bool:
    return value >= DCGM_FP64_BLANK


class Metric(StrEnum):
    """The DCGM fields gpufleet keeps, by their short name on the wire."""

    SM_ACTIVE = "sm_active"  # ratio 0..1
    GR_ENGINE_ACTIVE = "gr_engine_active"  # ratio 0..1
    TENSOR_ACTIVE = "tensor_active"  # ratio 0..1
    GPU_UTIL = "gpu_util"  # percent 0..100, as DCGM reports it
    FB_USED = "fb_used_mib"
    FB_FREE = "fb_free_mib"
    POWER = "power_w"
    XID = "xid"  # last XID error code; 0 means none


DCGM_FIELDS: Mapping[str, Metric] = {
    "DCGM_FI_PROF_SM_ACTIVE": Metric.SM_ACTIVE,
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": Metric.GR_ENGINE_ACTIVE,
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": Metric.TENSOR_ACTIVE,
    "DCGM_FI_DEV_GPU_UTIL": Metric.GPU_UTIL,
    "DCGM_FI_DEV_FB_USED": Metric.FB_USED,
    "DCGM_FI_DEV_FB_FREE": Metric.FB_FREE,
    "DCGM_FI_DEV_POWER_USAGE": Metric.POWER,
    "DCGM_FI_DEV_XID_ERRORS": Metric.XID,
}


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One scrape of one GPU, or of one MIG instance of it."""

    cluster: str
    node: str
    gpu_uuid: str  # the parent GPU's UUID, also for MIG instances
    gpu_index: int
    timestamp: float  # unix seconds
    metrics: Mapping[str, float]  # Metric value -> reading; absent when DCGM had none
    run_id: str | None = None
    mig_profile: str | None = None
    mig_instance: int | None = None
    pod: str | None = None
    namespace: str | None = None
    container: str | None = None

    @property
    def gpu_key(self) -> str:
        return gpu_key(self.cluster, self.node, self.gpu_uuid, self.mig_instance)


def gpu_key(cluster: str, node: str, gpu_uuid: str, mig_instance: int | None) -> str:
    # The cluster comes from the subject, which NATS permissions pin to one agent, so an agent
    # cannot fold samples into another cluster's GPU rows even by claiming its UUIDs.
    base = f"{cluster}/{node}/{gpu_uuid}"
    return base if mig_instance is None else f"{base}/mig{mig_instance}"


def telemetry_subject(prefix: str, cluster: str) -> str:
    return f"{prefix}.telemetry.{cluster}.dcgm"


# --- wire format -------------------------------------------------------------------------------
#
# {"schema": "gpufleet.dcgm/v1", "cluster": "c1", "fields": ["sm_active", ...],
#  "samples": [[node, uuid, gpu, t, run, mig_profile, mig_id, pod, namespace, container, [values]]],
#  "serving": [[run, t, requests_per_second, latency_ms]]}
#
# Positional arrays rather than objects: the consumer's cost is dominated by decoding and checking
# each sample, and arrays decode faster and carry no repeated key names. `fields` names the order
# of `values` (null = no reading), so a newer agent may send fields this consumer ignores.
# `serving` (optional, added without a schema change: older consumers ignore it) carries the
# latest traffic and latency of inference runs that declared a serving signal (`serving.py`).


class MalformedBatch(ValueError):
    """The message is not a telemetry batch gpufleet accepts; it goes to the dead-letter stream."""


FIELD_ORDER: tuple[str, ...] = tuple(m.value for m in Metric)
_SLOT = {name: i for i, name in enumerate(FIELD_ORDER)}
_SAMPLE_ARITY = 11

Values = list[float | None]


def encode_batch(cluster: str, samples: Sequence[GpuSample], serving: Sequence[ServingReading] = ()) -> bytes:
    """One JSON message for samples of one cluster (the agent publishes one per scrape), and the
    serving readings of its inference runs."""
    out: list[list[Any]] = []
    for s in samples:
        if s.cluster != cluster:
            raise ValueError(f"sample of cluster {s.cluster!r} in a batch for {cluster!r}")
        # Non-finite readings go as null ("no reading"): consumers refuse NaN and infinities.
        values = [s.metrics.get(name) for name in FIELD_ORDER]
        out.append([*_identity(s), [v if v is None or math.isfinite(v) else None for v in values]])
    body: dict[str, Any] = {"schema": SCHEMA, "cluster": cluster, "fields": FIELD_ORDER, "samples": out}
    if serving:
        body["serving"] = encode_serving(serving)
    return json.dumps(body, separators=(",", ":")).encode()


# A checked sample is the decoded JSON array itself, its values put in FIELD_ORDER: building an
# object per sample would cost more than everything else the consumer does with it.
Item = list[Any]  # [node, uuid, gpu, t, run, mig_profile, mig_id, pod, namespace, container, Values]


def _bad_text(value: Any, limit: int) -> bool:
    return type(value) is not str or not 0 < len(value) <= limit


def _bad_optional_text(value: Any, limit: int) -> bool:
    return value is not None and (type(value) is not str or not 0 < len(value) <= limit)


def _bad_count(value: Any) -> bool:
    return type(value) is not int or not 0 <= value <= MAX_GPU_INDEX


def _explain(item: Any, width: int, earliest: float, latest: float) -> str | None:
    """Why a sample is rejected (None if it is fine): the slow path, run only on failure."""
    if type(item) is not list or len(item) != _SAMPLE_ARITY:
        return f"expected an array of {_SAMPLE_ARITY} items"
    node, uuid, gpu, t, run, profile, mig, pod, namespace, container, raw = item
    if _bad_text(node, 253):
        return "node: expected a non-empty string of at most 253 characters"
    if _bad_text(uuid, 80):
        return "uuid: expected a non-empty string of at most 80 characters"
    if _bad_count(gpu):
        return f"gpu: expected an integer from 0 to {MAX_GPU_INDEX}"
    if type(t) is not float and type(t) is not int:
        return "t: expected unix seconds"
    if not earliest <= t <= latest:  # also false for NaN
        return "t: outside the accepted range (too old, or in the future)"
    for name, value, limit in (
        ("run", run, 40),
        ("mig_profile", profile, 20),
        ("pod", pod, 253),
        ("namespace", namespace, 63),
        ("container", container, 63),
    ):
        if _bad_optional_text(value, limit):
            return f"{name}: expected null or a non-empty string of at most {limit} characters"
    if mig is not None and _bad_count(mig):
        return f"mig_id: expected null or an integer from 0 to {MAX_GPU_INDEX}"
    if type(raw) is not list or len(raw) != width:
        return f"values: expected an array of {width} readings"
    for j, v in enumerate(raw):
        if v is not None and ((type(v) is not float and type(v) is not int) or not v >= 0):
            return f"values[{j}]: expected null or a non-negative number"
    return None


def decode_items(data: bytes, cluster: str, now: datetime) -> list[Item]:
    return decode_message(data, cluster, now)[0]


def decode_message(data: bytes, cluster: str, now: datetime) -> tuple[list[Item], list[ServingReading]]:
    """The checked samples and serving readings of one batch message for `cluster`."""
    try:
        body = decode(data)
    except UnsafeJson as exc:
        raise MalformedBatch(f"payload refused: {exc}") from None
    if type(body) is not dict:
        raise MalformedBatch("payload is not a JSON object")
    if body.get("schema") != SCHEMA:
        raise MalformedBatch(f"schema must be {SCHEMA!r}")
    if body.get("cluster") != cluster:
        raise MalformedBatch(f"batch names cluster {body.get('cluster')!r} but was sent for {cluster!r}")
    return _decode_samples(body, now), _decode_serving(body.get("serving", []), now)


def _decode_samples(body: dict[str, Any], now: datetime) -> list[Item]:
    names = body.get("fields")
    if type(names) is not list or not all(type(n) is str for n in names):
        raise MalformedBatch("fields: expected a list of metric names")
    items = body.get("samples")
    if type(items) is not list or len(items) > MAX_SAMPLES_PER_BATCH:
        raise MalformedBatch(f"samples: expected a list of at most {MAX_SAMPLES_PER_BATCH}")
    canonical = names == list(FIELD_ORDER)
    # Where each sent value goes in FIELD_ORDER; None drops a field this consumer does not know.
    slots = [_SLOT.get(n) for n in names]
    width = len(names)
    earliest = (now - MAX_SAMPLE_AGE).timestamp()
    latest = (now + MAX_CLOCK_SKEW).timestamp()
    blank = DCGM_FP64_BLANK
    number_types = frozenset((float, int))
    for i, item in enumerate(items):
        # One combined test on the fast path; `_explain` words the reason when it fails.
        ok = type(item) is list and len(item) == _SAMPLE_ARITY
        if ok:
            node, uuid, gpu, t, run, profile, mig, pod, namespace, container, raw = item
            ok = (
                type(node) is str
                and 0 < len(node) <= 253
                and type(uuid) is str
                and 0 < len(uuid) <= 80
                and type(gpu) is int
                and 0 <= gpu <= MAX_GPU_INDEX
                and (type(t) is float or type(t) is int)
                and earliest <= t <= latest
                and (run is None or (type(run) is str and 0 < len(run) <= 40))
                and (mig is None or (type(mig) is int and 0 <= mig <= MAX_GPU_INDEX))
                and (profile is None or (type(profile) is str and 0 < len(profile) <= 20))
                and (pod is None or (type(pod) is str and 0 < len(pod) <= 253))
                and (namespace is None or (type(namespace) is str and 0 < len(namespace) <= 63))
                and (container is None or (type(container) is str and 0 < len(container) <= 63))
                and type(raw) is list
                and len(raw) == width
            )
        if ok:
            # Whole-list checks in C instead of a Python loop per reading: every reading is a
            # number (no bool, string or list), the sum is not NaN, nothing is negative.
            present = [v for v in raw if v is not None] if None in raw else raw
            if present:
                ok = number_types.issuperset(map(type, present))
                if ok:
                    total = sum(present)
                    ok = not math.isnan(total) and min(present) >= 0
                if ok and max(present) >= blank:
                    # A DCGM sentinel (or an infinity) means "no reading": drop it, keep the rest.
                    raw[:] = [None if v is not None and v >= blank else v for v in raw]
        if not ok:
            raise MalformedBatch(f"samples[{i}].{_explain(item, width, earliest, latest)}")
        if not canonical:
            values: Values = [None] * len(FIELD_ORDER)
            for j, slot in enumerate(slots):
                if slot is not None:
                    values[slot] = raw[j]
            item[10] = values
    return items


def _decode_serving(raw: Any, now: datetime) -> list[ServingReading]:
    if type(raw) is not list or len(raw) > MAX_SERVING_PER_BATCH:
        raise MalformedBatch(f"serving: expected a list of at most {MAX_SERVING_PER_BATCH}")
    earliest = (now - MAX_SAMPLE_AGE).timestamp()
    latest = (now + MAX_CLOCK_SKEW).timestamp()
    out: list[ServingReading] = []
    for i, item in enumerate(raw):
        if type(item) is not list or len(item) != 4:
            raise MalformedBatch(f"serving[{i}]: expected [run, t, requests_per_second, latency_ms]")
        run, t, rps, latency = item
        if _bad_text(run, 40):
            raise MalformedBatch(f"serving[{i}].run: expected a non-empty string of at most 40 characters")
        if (type(t) is not float and type(t) is not int) or not earliest <= t <= latest:
            raise MalformedBatch(f"serving[{i}].t: expected unix seconds inside the accepted range")
        for name, value, bound in (("requests_per_second", rps, MAX_RPS), ("latency_ms", latency, MAX_LATENCY_MS)):
            if value is not None and ((type(value) is not float and type(value) is not int) or not 0 <= value <= bound):
                raise MalformedBatch(f"serving[{i}].{name}: expected null or a number from 0 to {bound:g}")
        stamp = datetime.fromtimestamp(t, UTC)
        out.append(ServingReading(run, stamp, None if rps is None else float(rps), _opt(latency)))
    return out


def _opt(value: float | int | None) -> float | None:
    return None if value is None else float(value)


def encode_serving(readings: Sequence[ServingReading]) -> list[list[Any]]:
    """The `serving` array of a batch message (see the wire format above)."""
    return [[r.run_id, r.observed_at.timestamp(), r.requests_per_second, r.latency_ms] for r in readings]


def decode_batch(data: bytes, cluster: str, now: datetime) -> list[GpuSample]:
    """Parse and check a batch published for `cluster`; raise `MalformedBatch` with the reason."""
    return [
        GpuSample(
            cluster=cluster,
            node=node,
            gpu_uuid=uuid,
            gpu_index=gpu,
            timestamp=float(t),
            metrics={name: float(v) for name, v in zip(FIELD_ORDER, values, strict=True) if v is not None},
            run_id=run,
            mig_profile=profile,
            mig_instance=mig,
            pod=pod,
            namespace=namespace,
            container=container,
        )
        for node, uuid, gpu, t, run, profile, mig, pod, namespace, container, values in decode_items(data, cluster, now)
    ]


def _identity(s: GpuSample) -> list[Any]:
    """The positional fields of a sample on the wire and in an `Item`, in order, before its values."""
    return [
        s.node,
        s.gpu_uuid,
        s.gpu_index,
        s.timestamp,
        s.run_id,
        s.mig_profile,
        s.mig_instance,
        s.pod,
        s.namespace,
        s.container,
    ]


def sample_item(s: GpuSample) -> Item:
    values: Values = [None if (v := s.metrics.get(name)) is None or is_blank(v) else v for name in FIELD_ORDER]
    return [*_identity(s), values]
