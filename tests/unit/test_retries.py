"""Running a transaction again after the database aborted it to settle a conflict
(controlplane/service/retries.py), and counting each retry (`gpufleet_db_retries_total`)."""

from __future__ import annotations

import pytest

from adapters.prometheus import PrometheusMetrics, new_registry
from controlplane.service.errors import StoreUnavailable, TransactionConflict
from controlplane.service.metrics import NoMetrics, RetryCause, Writer, retry_cause
from controlplane.service.retries import CONFLICT_ATTEMPTS, count_store_retry, retrying


class Recorded(NoMetrics):
    def __init__(self) -> None:
        self.retries: list[tuple[Writer, RetryCause]] = []

    def db_retry(self, writer: Writer, cause: RetryCause) -> None:
        self.retries.append((writer, cause))


class Failing:
    """A unit of work that raises `error` on its first `times` runs, then returns how often it ran."""

    def __init__(self, times: int, error: Exception) -> None:
        self.times, self.error, self.runs = times, error, 0

    def __call__(self) -> int:
        self.runs += 1
        if self.runs <= self.times:
            raise self.error
        return self.runs


def test_a_conflict_is_run_again_at_once_and_each_retry_counted() -> None:
    metrics = Recorded()
    work = Failing(2, TransactionConflict("deadlock", "aborted"))
    assert retrying(Writer.SCHEDULER, work, metrics) == 3
    assert metrics.retries == [(Writer.SCHEDULER, RetryCause.DEADLOCK)] * 2


def test_the_last_conflict_goes_to_the_caller_uncounted() -> None:
    metrics = Recorded()
    work = Failing(CONFLICT_ATTEMPTS, TransactionConflict("serialization", "aborted"))
    with pytest.raises(TransactionConflict):
        retrying(Writer.INGEST, work, metrics)
    assert work.runs == CONFLICT_ATTEMPTS
    # The caller's own retry (a loop's) counts the last one.
    assert metrics.retries == [(Writer.INGEST, RetryCause.SERIALIZATION)] * (CONFLICT_ATTEMPTS - 1)


def test_an_unreachable_database_is_not_retried_at_once() -> None:
    metrics = Recorded()
    work = Failing(1, StoreUnavailable("down"))
    with pytest.raises(StoreUnavailable):
        retrying(Writer.API, work, metrics)
    assert work.runs == 1
    assert metrics.retries == []


def test_a_loop_counts_only_what_the_database_failed() -> None:
    metrics = Recorded()
    count_store_retry(metrics, Writer.DISPATCHER, StoreUnavailable("down"))
    count_store_retry(metrics, Writer.DISPATCHER, TransactionConflict("deadlock", "aborted"))
    count_store_retry(metrics, Writer.DISPATCHER, RuntimeError("a bug"))
    assert metrics.retries == [(Writer.DISPATCHER, RetryCause.UNAVAILABLE), (Writer.DISPATCHER, RetryCause.DEADLOCK)]
    assert retry_cause(StoreUnavailable("down")) is RetryCause.UNAVAILABLE


def test_retries_are_exported_by_writer_and_cause() -> None:
    registry = new_registry()
    PrometheusMetrics(registry).db_retry(Writer.SCHEDULER, RetryCause.DEADLOCK)
    assert registry.get_sample_value("gpufleet_db_retries_total", {"writer": "scheduler", "cause": "deadlock"}) == 1
