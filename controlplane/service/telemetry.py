"""GPU telemetry: the wire format of DCGM sample batches, folding them into windows, and ingesting them.

Raw samples never reach SQL. Each batch message is folded into per-run, per-GPU windows (5 minutes
by default) whose columns are sums, counts, maxima and a "latest XID"; merging two partial windows
is commutative and associative, so redelivered, reordered or split batches end in the same row.
Redelivery itself is caught by the inbox (one row per batch message), in the same transaction as
the window upserts, and the worker acks only after that commit.

Which activity signal a window reports is decided when it is read, not when it is written: the
window keeps SM_ACTIVE, GR_ENGINE_ACTIVE and GPU_UTIL separately, and the view picks the first one
that has samples. Mixing them into one mean would make a window half SM ratio, half GPU_UTIL
busy-flag, which is exactly what the idle policy must not be fed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from controlplane.service.ingest import inbox_key
from controlplane.service.ports import UnitOfWork
from controlplane.service.safejson import UnsafeJson, decode

# Also re-exported: these values were defined here before they moved to their leaf module.
from controlplane.service.telemetry_window import ActivitySource, TelemetryWindow, WindowQuery  # noqa: F401

CONSUMER = "telemetry"
# A batch message that fails on this many deliveries is dead-lettered (see `ingest.MAX_DELIVERIES`).
MAX_DELIVERIES = 5
SCHEMA = "gpufleet.dcgm/v1"
DEFAULT_WINDOW_SECONDS = 300
# A batch from one exporter scrape holds a few dozen samples (8 GPUs x 7 MIG slices at most);
# anything this large is not an agent talking.
MAX_SAMPLES_PER_BATCH = 10_000
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
#  "samples": [[node, uuid, gpu, t, run, mig_profile, mig_id, pod, namespace, container, [values]]]}
#
# Positional arrays rather than objects: the consumer's cost is dominated by decoding and checking
# each sample, and arrays decode faster and carry no repeated key names. `fields` names the order
# of `values` (null = no reading), so a newer agent may send fields this consumer ignores.


class MalformedBatch(ValueError):
    """The message is not a telemetry batch gpufleet accepts; it goes to the dead-letter stream."""


FIELD_ORDER: tuple[str, ...] = tuple(m.value for m in Metric)
_SLOT = {name: i for i, name in enumerate(FIELD_ORDER)}
_SAMPLE_ARITY = 11

Values = list[float | None]


def encode_batch(cluster: str, samples: Sequence[GpuSample]) -> bytes:
    """One JSON message for samples of one cluster (the agent publishes one per scrape)."""
    out: list[list[Any]] = []
    for s in samples:
        if s.cluster != cluster:
            raise ValueError(f"sample of cluster {s.cluster!r} in a batch for {cluster!r}")
        # Non-finite readings go as null ("no reading"): consumers refuse NaN and infinities.
        values = [s.metrics.get(name) for name in FIELD_ORDER]
        out.append([*_identity(s), [v if v is None or math.isfinite(v) else None for v in values]])
    body = {"schema": SCHEMA, "cluster": cluster, "fields": FIELD_ORDER, "samples": out}
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


def _decode_items(data: bytes, cluster: str, now: datetime) -> list[Item]:
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
        for node, uuid, gpu, t, run, profile, mig, pod, namespace, container, values in _decode_items(
            data, cluster, now
        )
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


def _item(s: GpuSample) -> Item:
    values: Values = [None if (v := s.metrics.get(name)) is None or is_blank(v) else v for name in FIELD_ORDER]
    return [*_identity(s), values]


# --- windows -----------------------------------------------------------------------------------


WINDOW_COUNTERS = tuple(
    name for name in TelemetryWindow._fields if name.endswith(("_n", "_sum", "_error_samples")) or name == "samples"
)
WINDOW_MAXIMA = ("sm_active_max", "gr_engine_max", "gpu_util_max")


# Accumulator layout of a window under construction: a flat list, because folding touches it
# once per sample and list indexing is the cheapest mutable access Python has.
(
    _A_SAMPLES,
    _A_FIRST,
    _A_LAST,
    _A_SM_N,
    _A_SM_SUM,
    _A_SM_MAX,
    _A_GR_N,
    _A_GR_SUM,
    _A_GR_MAX,
    _A_UTIL_N,
    _A_UTIL_SUM,
    _A_UTIL_MAX,
    _A_TEN_N,
    _A_TEN_SUM,
    _A_USED_N,
    _A_USED_SUM,
    _A_FREE_N,
    _A_FREE_SUM,
    _A_POWER_N,
    _A_POWER_SUM,
    _A_XID,
    _A_XID_AT,
    _A_XID_ERRORS,
    _A_IDENTITY,
) = range(24)


def _utc(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


class Folder:
    """Folds checked samples of many messages into partial windows, one per (run, GPU, window)."""

    def __init__(self, window_seconds: int = DEFAULT_WINDOW_SECONDS) -> None:
        if window_seconds <= 0:
            raise ValueError("window_seconds must be positive")
        self.window_seconds = window_seconds
        self.samples = 0
        self._accs: dict[tuple[str, str, str, str, int, int], list[Any]] = {}

    def add(self, cluster: str, items: Sequence[Item]) -> None:
        ws = self.window_seconds
        accs = self._accs
        self.samples += len(items)
        for item in items:
            node, uuid, _gpu, t, run, _profile, mig, _pod, _ns, _container, m = item
            key = (run or "", cluster, node, uuid, -1 if mig is None else mig, int(t // ws) * ws)
            a = accs.get(key)
            if a is None:
                a = accs[key] = [0, t, t, 0, 0.0, 0.0, 0, 0.0, 0.0, 0, 0.0, 0.0, 0, 0.0]
                a += [0, 0.0, 0, 0.0, 0, 0.0, None, -math.inf, 0, item]
            a[_A_SAMPLES] += 1
            if t < a[_A_FIRST]:
                a[_A_FIRST] = t
            elif t > a[_A_LAST]:
                a[_A_LAST] = t
            sm, gr, tensor, util, used, free, power, xid = m
            if sm is not None:
                a[_A_SM_N] += 1
                a[_A_SM_SUM] += sm
                a[_A_SM_MAX] = max(a[_A_SM_MAX], sm)
            if gr is not None:
                a[_A_GR_N] += 1
                a[_A_GR_SUM] += gr
                a[_A_GR_MAX] = max(a[_A_GR_MAX], gr)
            if util is not None:
                util = util / 100.0  # DCGM reports percent; windows keep every activity signal as a ratio
                a[_A_UTIL_N] += 1
                a[_A_UTIL_SUM] += util
                a[_A_UTIL_MAX] = max(a[_A_UTIL_MAX], util)
            if tensor is not None:
                a[_A_TEN_N] += 1
                a[_A_TEN_SUM] += tensor
            if used is not None:
                a[_A_USED_N] += 1
                a[_A_USED_SUM] += used
            if free is not None:
                a[_A_FREE_N] += 1
                a[_A_FREE_SUM] += free
            if power is not None:
                a[_A_POWER_N] += 1
                a[_A_POWER_SUM] += power
            if xid is not None:
                code = int(xid)
                if code:
                    a[_A_XID_ERRORS] += 1
                # The latest reading wins; on a tie the larger code, so folding order never matters.
                if t > a[_A_XID_AT] or (t == a[_A_XID_AT] and code > a[_A_XID]):
                    a[_A_XID], a[_A_XID_AT] = code, t

    def windows(self) -> list[TelemetryWindow]:
        """The partial windows, in no particular order (the repository orders its writes)."""
        # Scrapes share timestamps and windows share starts: convert each distinct one once.
        stamps: dict[float, datetime] = {}

        def utc(seconds: float) -> datetime:
            stamp = stamps.get(seconds)
            if stamp is None:
                stamp = stamps[seconds] = _utc(seconds)
            return stamp

        out: list[TelemetryWindow] = []
        ws = self.window_seconds
        for (run, cluster, node, uuid, _mig, start), a in self._accs.items():
            item = a[_A_IDENTITY]  # identity columns (pod, MIG profile...) from the first sample
            out.append(
                TelemetryWindow(
                    run or None,
                    gpu_key(cluster, node, uuid, item[6]),
                    utc(start),
                    ws,
                    cluster,
                    node,
                    uuid,
                    item[2],
                    item[5],
                    item[6],
                    item[7],
                    item[8],
                    a[_A_SAMPLES],
                    utc(a[_A_FIRST]),
                    utc(a[_A_LAST]),
                    a[_A_SM_N],
                    float(a[_A_SM_SUM]),
                    float(a[_A_SM_MAX]),
                    a[_A_GR_N],
                    float(a[_A_GR_SUM]),
                    float(a[_A_GR_MAX]),
                    a[_A_UTIL_N],
                    float(a[_A_UTIL_SUM]),
                    float(a[_A_UTIL_MAX]),
                    a[_A_TEN_N],
                    float(a[_A_TEN_SUM]),
                    a[_A_USED_N],
                    float(a[_A_USED_SUM]),
                    a[_A_FREE_N],
                    float(a[_A_FREE_SUM]),
                    a[_A_POWER_N],
                    float(a[_A_POWER_SUM]),
                    a[_A_XID],
                    None if a[_A_XID] is None else utc(a[_A_XID_AT]),
                    a[_A_XID_ERRORS],
                )
            )
        return out


def fold(samples: Iterable[GpuSample], window_seconds: int = DEFAULT_WINDOW_SECONDS) -> list[TelemetryWindow]:
    """Fold samples into one partial window per (run, GPU, window start), sorted by that key."""
    folder = Folder(window_seconds)
    by_cluster: dict[str, list[Item]] = {}
    for s in samples:
        by_cluster.setdefault(s.cluster, []).append(_item(s))
    for cluster, items in by_cluster.items():
        folder.add(cluster, items)
    return sorted(folder.windows(), key=lambda w: (w.run_id or "", w.gpu_key, w.window_start))


def merge(a: TelemetryWindow, b: TelemetryWindow) -> TelemetryWindow:
    """Combine two partial windows of one key: the rule the SQL upsert implements, in Python."""
    if (a.run_id, a.gpu_key, a.window_start) != (b.run_id, b.gpu_key, b.window_start):
        raise ValueError("windows of different keys")
    values: dict[str, Any] = {}
    for name in WINDOW_COUNTERS:
        values[name] = getattr(a, name) + getattr(b, name)
    for name in WINDOW_MAXIMA:
        values[name] = max(getattr(a, name), getattr(b, name))
    values["first_sample_at"] = min(a.first_sample_at, b.first_sample_at)
    values["last_sample_at"] = max(a.last_sample_at, b.last_sample_at)
    if b.xid_at is not None and (a.xid_at is None or (b.xid_at, b.xid_last or 0) > (a.xid_at, a.xid_last or 0)):
        values["xid_last"], values["xid_at"] = b.xid_last, b.xid_at
    return a._replace(**values)


def windows(uow: UnitOfWork, query: WindowQuery) -> list[TelemetryWindow]:
    """Stored windows, oldest first, then by GPU."""
    with uow:
        return uow.telemetry.windows(query)


def run_windows(
    uow: UnitOfWork, run_id: str, since: datetime | None = None, until: datetime | None = None
) -> list[TelemetryWindow]:
    return windows(uow, WindowQuery(run_id=run_id, since=since, until=until))


# --- ingest ------------------------------------------------------------------------------------


class Outcome(StrEnum):
    APPLIED = "applied"
    DUPLICATE = "duplicate"
    MALFORMED = "malformed"
    UNKNOWN = "unknown"  # for a cluster gpufleet does not know, or only samples of unknown runs

    @property
    def dead_letter(self) -> bool:
        """Whether the worker moves the message to the dead-letter stream (nothing is stored)."""
        return self in (Outcome.MALFORMED, Outcome.UNKNOWN)


@dataclass(frozen=True)
class BatchMessage:
    subject: str
    data: bytes
    msg_id: str  # Nats-Msg-Id, or stream:sequence when the agent gave none


@dataclass(frozen=True)
class BatchResult:
    outcomes: tuple[tuple[Outcome, str], ...]  # per message, in order: outcome and detail
    samples: int  # samples folded into windows (duplicates and malformed batches excluded)
    windows: int  # window rows upserted


def cluster_of(subject: str, prefix: str) -> str | None:
    parts = subject.split(".")
    if len(parts) == 4 and parts[0] == prefix and parts[1] == "telemetry" and parts[3] == "dcgm" and parts[2]:
        return parts[2]
    return None


def handle_batch(
    uow: UnitOfWork,
    messages: Sequence[BatchMessage],
    prefix: str,
    now: datetime,
    window_seconds: int = DEFAULT_WINDOW_SECONDS,
) -> BatchResult:
    """Apply many batch messages in ONE transaction: inbox rows plus one upsert pass over windows.

    Malformed messages are reported (the worker dead-letters them) and never stop the others;
    an exception means nothing was written and every message should be redelivered.
    """
    outcomes: list[tuple[Outcome, str]] = [(Outcome.APPLIED, "")] * len(messages)
    decoded: dict[int, tuple[str, list[Item]]] = {}
    for i, message in enumerate(messages):
        cluster = cluster_of(message.subject, prefix)
        if cluster is None:
            outcomes[i] = (Outcome.MALFORMED, f"no telemetry handler for subject {message.subject}")
            continue
        try:
            decoded[i] = (cluster, _decode_items(message.data, cluster, now))
        except MalformedBatch as exc:
            outcomes[i] = (Outcome.MALFORMED, str(exc))
    if not decoded:
        return BatchResult(tuple(outcomes), 0, 0)
    folder = Folder(window_seconds)
    # Inbox keys are per sending cluster: one cluster cannot claim another's message ids.
    keys = {i: inbox_key(f"cluster:{cluster}", messages[i].msg_id) for i, (cluster, _) in decoded.items()}
    with uow:
        _refuse_unknown(uow, decoded, outcomes)
        if not decoded:
            return BatchResult(tuple(outcomes), 0, 0)
        fresh = uow.telemetry.claim_batches(CONSUMER, [keys[i] for i in decoded], now)
        taken: set[str] = set()
        for i, (cluster, items) in decoded.items():
            msg_id = keys[i]
            # A message id seen before, or twice in this fetch, is a redelivery: fold it once.
            if msg_id not in fresh or msg_id in taken:
                outcomes[i] = (Outcome.DUPLICATE, "already processed")
                continue
            taken.add(msg_id)
            folder.add(cluster, items)
            outcomes[i] = (Outcome.APPLIED, f"{len(items)} samples{outcomes[i][1]}")
        folded = folder.windows()
        if folded:
            uow.telemetry.merge_windows(folded, now)
        uow.commit()
    return BatchResult(tuple(outcomes), folder.samples, len(folded))


def _refuse_unknown(
    uow: UnitOfWork, decoded: dict[int, tuple[str, list[Item]]], outcomes: list[tuple[Outcome, str]]
) -> None:
    """Drop batches of unknown clusters and samples naming a run that is not one of the batch's
    cluster's runs (unknown, or another cluster's): nothing of them reaches a window. A batch left
    with no sample is UNKNOWN (dead-lettered); otherwise the refusals go into its outcome detail."""
    known = uow.admin.known_clusters({cluster for cluster, _ in decoded.values()})
    runs = {item[4] for _, items in decoded.values() for item in items if item[4] is not None}
    owner = uow.runs.clusters_of(runs)
    for i in list(decoded):
        cluster, items = decoded[i]
        if cluster not in known:
            outcomes[i] = (Outcome.UNKNOWN, f"telemetry for unknown cluster {cluster!r}")
            del decoded[i]
            continue
        kept = [item for item in items if item[4] is None or owner.get(item[4]) == cluster]
        if len(kept) == len(items):
            continue
        strangers = sorted({item[4] for item in items if item[4] is not None and owner.get(item[4]) != cluster})
        shown = ", ".join(strangers[:5])
        note = f"{len(items) - len(kept)} samples of runs that are not runs of {cluster} refused ({shown})"
        if not kept:
            outcomes[i] = (Outcome.UNKNOWN, note)
            del decoded[i]
        else:
            decoded[i] = (cluster, kept)
            outcomes[i] = (Outcome.APPLIED, f"; {note}")


# Windows are the evidence for idle decisions and reports; two weeks covers both. Inbox rows of
# this consumer only need to outlive redelivery, which ends with the telemetry stream's max age.
KEEP_WINDOWS = timedelta(days=14)
KEEP_TELEMETRY_INBOX = timedelta(days=2)


def prune(uow: UnitOfWork, now: datetime) -> tuple[int, int]:
    """Delete expired windows and telemetry inbox rows; returns both counts."""
    with uow:
        counts = uow.telemetry.prune(now - KEEP_WINDOWS, CONSUMER, now - KEEP_TELEMETRY_INBOX)
        uow.commit()
    return counts
