"""Telemetry batches into SQL windows on PostgreSQL and SQLite: upsert, redelivery, order, prune."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from adapters.sql.telemetry_repo import SqlTelemetryRepository
from controlplane.bootstrap import Wiring
from controlplane.service import telemetry
from controlplane.service.telemetry import BatchMessage, Outcome, TelemetryWindow, WindowQuery, fold, handle_batch
from controlplane.service.telemetry_wire import GpuSample, encode_batch
from tests.telemetry.known import register

T0 = 1_767_600_000.0
NOW = datetime.fromtimestamp(T0 + 900, UTC)


@pytest.fixture(autouse=True)
def _known_clusters_and_runs(wiring: Wiring) -> None:
    """Ingest keeps only telemetry of registered clusters and of their own runs."""
    register(wiring, "c1", "run-a", "run-b")


def s(t: float, run: str | None = "run-a", gpu: int = 0, **metrics: float) -> GpuSample:
    return GpuSample("c1", "n1", f"GPU-{gpu}", gpu, T0 + t, metrics, run_id=run, pod="p-0", namespace="team")


def message(prefix: str, msg_id: str, samples: list[GpuSample], cluster: str = "c1") -> BatchMessage:
    return BatchMessage(f"{prefix}.telemetry.{cluster}.dcgm", encode_batch(cluster, samples), msg_id)


def stored(wiring: Wiring, **query: object) -> list[TelemetryWindow]:
    return telemetry.windows(wiring.uow(), WindowQuery(**query))  # type: ignore[arg-type]


def _same(a: list[TelemetryWindow], b: list[TelemetryWindow]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        sums = {k: 0.0 for k in x._fields if k.endswith("_sum")}
        assert x._replace(**sums) == y._replace(**sums)
        for k in sums:
            assert getattr(x, k) == pytest.approx(getattr(y, k))


BATCH_1 = [s(10, sm_active=0.2, power_w=100, xid=13), s(10, gpu=1, sm_active=0.9), s(310, sm_active=0.5)]
BATCH_2 = [s(20, sm_active=0.6, power_w=300, xid=0), s(20, run=None, gpu=2, gpu_util=0)]
BATCH_3 = [s(5, sm_active=0.1, xid=79), s(320, sm_active=0.3, fb_used_mib=512)]


def test_a_batch_lands_as_windows_equal_to_folding_it(wiring: Wiring) -> None:
    prefix = wiring.settings.subject_prefix
    result = handle_batch(wiring.uow(), [message(prefix, "m1", BATCH_1)], prefix, NOW)
    assert result.outcomes == ((Outcome.APPLIED, "3 samples"),)
    assert (result.samples, result.windows) == (3, 3)
    _same(stored(wiring), sorted(fold(BATCH_1), key=lambda w: (w.window_start, w.gpu_key, w.run_id or "")))


def test_redelivery_is_a_no_op(wiring: Wiring) -> None:
    prefix = wiring.settings.subject_prefix
    handle_batch(wiring.uow(), [message(prefix, "m1", BATCH_1)], prefix, NOW)
    before = stored(wiring)
    again = handle_batch(wiring.uow(), [message(prefix, "m1", BATCH_1), message(prefix, "m2", BATCH_2)], prefix, NOW)
    assert [o for o, _ in again.outcomes] == [Outcome.DUPLICATE, Outcome.APPLIED]
    # The same message twice in one fetch (a redelivery racing the original) is folded once too.
    twice = handle_batch(wiring.uow(), [message(prefix, "m3", BATCH_3), message(prefix, "m3", BATCH_3)], prefix, NOW)
    assert [o for o, _ in twice.outcomes] == [Outcome.APPLIED, Outcome.DUPLICATE]
    assert before != stored(wiring)
    _same(
        stored(wiring),
        sorted(fold(BATCH_1 + BATCH_2 + BATCH_3), key=lambda w: (w.window_start, w.gpu_key, w.run_id or "")),
    )


@pytest.mark.parametrize("order", [(0, 1, 2), (2, 1, 0), (1, 2, 0)])
def test_out_of_order_batches_in_separate_transactions_end_in_the_same_rows(
    wiring: Wiring, order: tuple[int, int, int]
) -> None:
    prefix = wiring.settings.subject_prefix
    batches = [BATCH_1, BATCH_2, BATCH_3]
    for i in order:
        handle_batch(wiring.uow(), [message(prefix, f"m{i}", batches[i])], prefix, NOW)
    expected = sorted(fold(BATCH_1 + BATCH_2 + BATCH_3), key=lambda w: (w.window_start, w.gpu_key, w.run_id or ""))
    _same(stored(wiring), expected)
    [first] = stored(wiring, run_id="run-a", until=datetime.fromtimestamp(T0 + 300, UTC), node="n1", cluster="c1")[:1]
    # The XID of the latest sample (t=20, code 0) wins whichever batch arrived last.
    assert (first.gpu_key, first.xid_last, first.xid_error_samples) == ("c1/n1/GPU-0", 0, 2)
    assert first.activity_mean == pytest.approx((0.2 + 0.6 + 0.1) / 3)
    assert first.activity_max == pytest.approx(0.6)
    assert first.power_mean_w == pytest.approx(200)


def test_a_malformed_batch_is_reported_and_writes_nothing_while_the_rest_apply(wiring: Wiring) -> None:
    prefix = wiring.settings.subject_prefix
    bad = BatchMessage(f"{prefix}.telemetry.c1.dcgm", b'{"schema": "gpufleet.dcgm/v1"}', "bad-1")
    wrong_cluster = BatchMessage(f"{prefix}.telemetry.c2.dcgm", encode_batch("c1", BATCH_2), "bad-2")
    stray = BatchMessage(f"{prefix}.telemetry.c1.other", encode_batch("c1", BATCH_2), "bad-3")
    result = handle_batch(wiring.uow(), [bad, message(prefix, "ok", BATCH_1), wrong_cluster, stray], prefix, NOW)
    outcomes = [o for o, _ in result.outcomes]
    assert outcomes == [Outcome.MALFORMED, Outcome.APPLIED, Outcome.MALFORMED, Outcome.MALFORMED]
    assert "but was sent for 'c2'" in result.outcomes[2][1]
    assert "no telemetry handler" in result.outcomes[3][1]
    assert sum(w.samples for w in stored(wiring)) == len(BATCH_1)
    # Malformed messages take no inbox row: fixed and re-sent under the same id, they still apply.
    fixed = handle_batch(wiring.uow(), [message(prefix, "bad-1", BATCH_2)], prefix, NOW)
    assert fixed.outcomes[0][0] is Outcome.APPLIED


def test_a_failed_transaction_leaves_nothing_behind(wiring: Wiring, monkeypatch: pytest.MonkeyPatch) -> None:
    prefix = wiring.settings.subject_prefix

    def explode(self: SqlTelemetryRepository, windows: object, now: datetime) -> None:
        raise ConnectionError("database went away mid-batch")

    monkeypatch.setattr(SqlTelemetryRepository, "merge_windows", explode)
    with pytest.raises(ConnectionError):
        handle_batch(wiring.uow(), [message(prefix, "m1", BATCH_1)], prefix, NOW)
    monkeypatch.undo()
    # Neither the inbox row nor any window was kept, so the redelivery applies in full.
    retry = handle_batch(wiring.uow(), [message(prefix, "m1", BATCH_1)], prefix, NOW)
    assert retry.outcomes[0][0] is Outcome.APPLIED
    assert sum(w.samples for w in stored(wiring)) == len(BATCH_1)


def test_queries_filter_by_run_attribution_and_time(wiring: Wiring) -> None:
    prefix = wiring.settings.subject_prefix
    handle_batch(wiring.uow(), [message(prefix, "m1", BATCH_1 + BATCH_2)], prefix, NOW)
    assert {w.run_id for w in stored(wiring)} == {"run-a", None}
    assert [w.gpu_key for w in stored(wiring, unattributed=True)] == ["c1/n1/GPU-2"]
    late = stored(wiring, run_id="run-a", since=datetime.fromtimestamp(T0 + 300, UTC))
    assert [(w.gpu_key, w.samples) for w in late] == [("c1/n1/GPU-0", 1)]
    assert stored(wiring, cluster="c9") == []
    assert len(stored(wiring, limit=2)) == 2
    assert [w.window_start for w in telemetry.run_windows(wiring.uow(), "run-a")] == sorted(
        w.window_start for w in stored(wiring, run_id="run-a")
    )


def test_prune_drops_old_windows_and_old_telemetry_inbox_rows(wiring: Wiring) -> None:
    prefix = wiring.settings.subject_prefix
    handle_batch(wiring.uow(), [message(prefix, "old", BATCH_1)], prefix, NOW)
    later = NOW + telemetry.KEEP_WINDOWS + timedelta(hours=1)
    fresh = [GpuSample("c1", "n1", "GPU-0", 0, later.timestamp() - 60, {"sm_active": 0.5}, run_id="run-b")]
    handle_batch(wiring.uow(), [message(prefix, "new", fresh)], prefix, later)
    assert telemetry.prune(wiring.uow(), later) == (3, 1)
    assert [w.run_id for w in stored(wiring)] == ["run-b"]
    # The pruned id is forgotten; the kept one still deduplicates.
    again = handle_batch(wiring.uow(), [message(prefix, "new", fresh)], prefix, later)
    assert again.outcomes[0][0] is Outcome.DUPLICATE
