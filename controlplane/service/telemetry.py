"""GPU telemetry: folding DCGM sample batches into windows, ingesting them, and reading them back.

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

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from controlplane.service.ingest import inbox_key
from controlplane.service.ports import UnitOfWork
from controlplane.service.serving import ServingReading

# Also re-exported: these values were defined here before they moved to their leaf module.
from controlplane.service.telemetry_window import ActivitySource, TelemetryWindow, WindowQuery  # noqa: F401
from controlplane.service.telemetry_wire import GpuSample, Item, MalformedBatch, decode_message, gpu_key, sample_item

CONSUMER = "telemetry"
# A batch message that fails on this many deliveries is dead-lettered (see `ingest.MAX_DELIVERIES`).
MAX_DELIVERIES = 5
DEFAULT_WINDOW_SECONDS = 300


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
        by_cluster.setdefault(s.cluster, []).append(sample_item(s))
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
    serving: int = 0  # serving readings taken (of runs of the sending cluster, from new messages)


def cluster_of(subject: str, prefix: str) -> str | None:
    parts = subject.split(".")
    if len(parts) == 4 and parts[0] == prefix and parts[1] == "telemetry" and parts[3] == "dcgm" and parts[2]:
        return parts[2]
    return None


# One decoded batch message: its cluster (from the subject), GPU samples and serving readings.
Decoded = tuple[str, list[Item], list[ServingReading]]


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
    decoded: dict[int, Decoded] = {}
    for i, message in enumerate(messages):
        cluster = cluster_of(message.subject, prefix)
        if cluster is None:
            outcomes[i] = (Outcome.MALFORMED, f"no telemetry handler for subject {message.subject}")
            continue
        try:
            decoded[i] = (cluster, *decode_message(message.data, cluster, now))
        except MalformedBatch as exc:
            outcomes[i] = (Outcome.MALFORMED, str(exc))
    if not decoded:
        return BatchResult(tuple(outcomes), 0, 0)
    folder = Folder(window_seconds)
    serving: list[tuple[str, ServingReading]] = []
    # Inbox keys are per sending cluster: one cluster cannot claim another's message ids.
    keys = {i: inbox_key(f"cluster:{cluster}", messages[i].msg_id) for i, (cluster, _, _) in decoded.items()}
    with uow:
        _refuse_unknown(uow, decoded, outcomes)
        if not decoded:
            return BatchResult(tuple(outcomes), 0, 0)
        fresh = uow.telemetry.claim_batches(CONSUMER, [keys[i] for i in decoded], now)
        taken: set[str] = set()
        for i, (cluster, items, readings) in decoded.items():
            msg_id = keys[i]
            # A message id seen before, or twice in this fetch, is a redelivery: fold it once.
            if msg_id not in fresh or msg_id in taken:
                outcomes[i] = (Outcome.DUPLICATE, "already processed")
                continue
            taken.add(msg_id)
            folder.add(cluster, items)
            serving.extend((cluster, r) for r in readings)
            served = f", {len(readings)} serving readings" if readings else ""
            outcomes[i] = (Outcome.APPLIED, f"{len(items)} samples{served}{outcomes[i][1]}")
        folded = folder.windows()
        if folded:
            uow.telemetry.merge_windows(folded, now)
        if serving:
            uow.serving.put_readings(serving, now)
        uow.commit()
    return BatchResult(tuple(outcomes), folder.samples, len(folded), len(serving))


def _refuse_unknown(uow: UnitOfWork, decoded: dict[int, Decoded], outcomes: list[tuple[Outcome, str]]) -> None:
    """Drop batches of unknown clusters, and samples and serving readings naming a run that is not
    one of the batch's cluster's runs (unknown, or another cluster's): nothing of them is stored. A
    batch left with nothing is UNKNOWN (dead-lettered); otherwise the refusals go into its outcome
    detail."""
    known = uow.admin.known_clusters({cluster for cluster, _, _ in decoded.values()})
    runs = {item[4] for _, items, _ in decoded.values() for item in items if item[4] is not None}
    runs |= {r.run_id for _, _, readings in decoded.values() for r in readings}
    owner = uow.runs.clusters_of(runs)
    for i in list(decoded):
        cluster, items, readings = decoded[i]
        if cluster not in known:
            outcomes[i] = (Outcome.UNKNOWN, f"telemetry for unknown cluster {cluster!r}")
            del decoded[i]
            continue
        kept = [item for item in items if item[4] is None or owner.get(item[4]) == cluster]
        served = [r for r in readings if owner.get(r.run_id) == cluster]
        if len(kept) == len(items) and len(served) == len(readings):
            continue
        strangers = sorted(
            {item[4] for item in items if item[4] is not None and owner.get(item[4]) != cluster}
            | {r.run_id for r in readings if owner.get(r.run_id) != cluster}
        )
        shown = ", ".join(strangers[:5])
        refused = len(items) - len(kept) + len(readings) - len(served)
        note = f"{refused} samples or serving readings of runs that are not runs of {cluster} refused ({shown})"
        if not kept and not served:
            outcomes[i] = (Outcome.UNKNOWN, note)
            del decoded[i]
        else:
            decoded[i] = (cluster, kept, served)
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
